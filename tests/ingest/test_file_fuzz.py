"""Property-based: any row of a CSV or Parquet file is a transaction or a dead letter with a reason, and
the good rows around it come out exactly as they do without it.

Each example writes a small file (good rows, the fuzzed row among them) and imports it as `fraud ingest`
does (``events_from_file``: read, map, convert, tokenise, validate, checked against a clock); the result
is compared with the same file without the fuzzed row. Values: garbage and huge strings, huge integers,
1e39, NaN and infinity, negative amounts, dates far in the past and the future, empty cells, card numbers
where tokens go; columns of any Parquet type; optional columns missing from the file. A required column
missing from the file refuses the file as a whole (``InputFileError``), with nothing produced.
"""

from __future__ import annotations

import csv
import datetime as dt
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given
from hypothesis import strategies as st

from contracts.events import Reason, TxColumns
from ingest.files import InputFileError
from ingest.produce import EventBatch, events_from_file
from ingest.validation import Clock

C = TxColumns
KEY = b"fuzz-token-key"
MAX_BYTES = 16_384
#: ingest's clock: 2026-01-01, so that an event dated later than five minutes after it is future_event_time.
CLOCK = Clock(1_767_225_600_000)
COLUMNS = (C.TX_ID, C.CARD_ID, C.TERMINAL_ID, C.AMOUNT, C.EVENT_TIME, C.IS_FRAUD)
#: Good rows, one a fraud (its label is produced too): the fuzzed row goes among them.
GOOD = [
    {C.TX_ID: 1, C.CARD_ID: "596", C.TERMINAL_ID: "3156", C.AMOUNT: 57.16, C.EVENT_TIME: "2018-04-01 00:00:31", C.IS_FRAUD: 0},
    {C.TX_ID: 2, C.CARD_ID: "4961", C.TERMINAL_ID: "3412", C.AMOUNT: 81.5, C.EVENT_TIME: "2018-04-01 00:02:10", C.IS_FRAUD: 1},
    {C.TX_ID: 3, C.CARD_ID: "2", C.TERMINAL_ID: "1365", C.AMOUNT: 146.0, C.EVENT_TIME: "2018-04-02 10:07:56", C.IS_FRAUD: 0},
]  # fmt: skip

FLOATS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([1e39, -1e39, -0.0, -57.16, 0.001, 1e308, 9.223372036854776e18, 1e15]),
)
INTS = st.one_of(
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.sampled_from([-1, 0, 1, 2, 1_522_540_800_000, 4_070_908_800_000, -62_135_596_800_000]),
)
DATES = st.sampled_from(
    [
        "2018-04-01 00:00:31",
        "0001-01-01",
        "1677-09-21 00:12:43",
        "1900-01-01T00:00:00Z",
        "2099-01-01",
        "2262-04-11 23:47:16",
        "2262-04-12",
        "9999-12-31 23:59:59",
        "2018-02-30",
        "2018-04-01T25:00:00",
        "2018-04-01 00:00:31+14:00",
        "yesterday",
        "1e39",
        "NaN",
    ]
)
TEXTS = st.one_of(
    st.text(alphabet=st.characters(exclude_categories=("Cs",)), max_size=40),
    st.sampled_from(["", " ", "nan", "inf", "-inf", "1e39", "NULL", "4111 1111 1111 1111", "x" * 20_000]),
    DATES,
    INTS.map(str),
    FLOATS.map(repr),
)
#: A CSV cell: any text (an empty one is a missing value).
#: A NUL byte makes a CSV file a binary one, refused whole (tests/ingest/test_whole_files.py): not a row.
CELL = TEXTS.filter(lambda text: "\0" not in text)
#: A Parquet column: its Arrow type and a value of that type for the fuzzed row (None: null).
PARQUET_COLUMN = st.one_of(
    st.tuples(st.just(pa.string()), st.one_of(TEXTS, st.none())),
    st.tuples(st.just(pa.int64()), st.one_of(INTS, st.none())),
    st.tuples(st.just(pa.float64()), st.one_of(FLOATS, st.none())),
)
#: The fraud flag's column can also hold booleans; the event time's, timestamps from year 1 to 9999.
PARQUET_FLAG_COLUMN = st.one_of(
    PARQUET_COLUMN, st.tuples(st.just(pa.bool_()), st.one_of(st.booleans(), st.none()))
)
PARQUET_TIME_COLUMN = st.one_of(
    PARQUET_COLUMN,
    st.tuples(
        st.just(pa.timestamp("ms", tz="UTC")),
        st.one_of(
            st.datetimes(
                min_value=dt.datetime(1, 1, 2),  # noqa: DTZ001 - made aware below
                max_value=dt.datetime(9999, 12, 30),  # noqa: DTZ001
            ).map(lambda d: d.replace(tzinfo=dt.UTC)),
            st.none(),
        ),
    ),
)


def good_value(column: str, value: Any, kind: pa.DataType) -> Any:
    """A good row's value in a Parquet column of type ``kind``."""
    if column == C.EVENT_TIME and not pa.types.is_string(kind):  # a timestamp, or a number of epoch ms
        stamp = pd.Timestamp(value, tz="UTC")
        if pa.types.is_timestamp(kind):
            return stamp.to_pydatetime()
        value = int(stamp.value // 1_000_000)
    if pa.types.is_string(kind):
        return str(value)
    if pa.types.is_boolean(kind):
        return bool(value)
    if pa.types.is_integer(kind):
        return int(float(value))
    if pa.types.is_floating(kind):
        return float(value)
    raise AssertionError(f"no good value of {column} as {kind}")


def outcome(path: Path) -> EventBatch | None:
    """The import of ``path`` as `fraud ingest` does it; None when the file as a whole is refused."""
    try:
        return events_from_file(path, {}, KEY, 7 * 86_400_000, MAX_BYTES, CLOCK)
    except InputFileError as error:
        assert "missing column" in str(error)
        return None


#: The import of the good rows alone, by file kind and columns: the same in every example that has them.
_WITHOUT: dict[tuple[str, ...], EventBatch | None] = {}


def once(key: tuple[str, ...], imported: Callable[[], EventBatch | None]) -> EventBatch | None:
    if key not in _WITHOUT:
        _WITHOUT[key] = imported()
    return _WITHOUT[key]


def row_of(letter_source: str) -> int:
    return int(letter_source.rpartition("row ")[2])


def check_rows_alone(with_bad: EventBatch | None, without: EventBatch | None, bad_row: int) -> None:
    """The fuzzed row is one event or one dead letter; every other row comes out as without it."""
    if without is None:  # a required column is missing: the file is refused with or without the row
        assert with_bad is None
        return
    assert with_bad is not None
    assert len(with_bad.tx_values) + len(with_bad.dead_letters) == len(GOOD) + 1
    for letter in with_bad.dead_letters:
        assert letter.reason in Reason and letter.detail
        assert "4111 1111 1111 1111" not in letter.detail and b"4111 1111 1111 1111" not in letter.raw
    assert len(with_bad.dead_letters) <= 1 and all(row_of(d.source) == bad_row for d in with_bad.dead_letters)
    good = [value for value in with_bad.tx_values if value not in without.tx_values]
    assert len(good) == (0 if with_bad.dead_letters else 1), "a good row changed"
    assert set(without.tx_values) <= set(with_bad.tx_values)
    assert set(without.label_values) <= set(with_bad.label_values)
    assert len(with_bad.label_values) - len(without.label_values) <= 1


@pytest.fixture(scope="module")
def directory(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


@given(
    cells=st.fixed_dictionaries({column: CELL for column in COLUMNS}),
    position=st.integers(0, len(GOOD)),
    dropped=st.sets(st.sampled_from(COLUMNS), max_size=1),
)
def test_any_csv_row_is_a_transaction_or_a_dead_letter_and_its_neighbours_are_kept(
    directory: Path, cells: dict[str, str], position: int, dropped: set[str]
) -> None:
    columns = [column for column in COLUMNS if column not in dropped]
    rows = [{column: str(row[column]) for column in columns} for row in GOOD]

    def imported(name: str, table: list[dict[str, str]]) -> EventBatch | None:
        # Every cell quoted: pandas leaves a bare carriage return unquoted, which ends the row in any CSV reader.
        pd.DataFrame(table, columns=columns).to_csv(directory / name, index=False, quoting=csv.QUOTE_ALL)
        return outcome(directory / name)

    without = once(("csv", *columns), lambda: imported("without.csv", rows))
    check_rows_alone(imported("with.csv", [*rows[:position], cells, *rows[position:]]), without, position + 1)


@given(
    fuzzed=st.fixed_dictionaries(
        {
            column: {C.EVENT_TIME: PARQUET_TIME_COLUMN, C.IS_FRAUD: PARQUET_FLAG_COLUMN}.get(
                column, PARQUET_COLUMN
            )
            for column in COLUMNS
        }
    ),
    position=st.integers(0, len(GOOD)),
    dropped=st.sets(st.sampled_from(COLUMNS), max_size=1),
)
def test_any_parquet_row_is_a_transaction_or_a_dead_letter_and_its_neighbours_are_kept(
    directory: Path, fuzzed: dict[str, tuple[pa.DataType, Any]], position: int, dropped: set[str]
) -> None:
    columns = [column for column in COLUMNS if column not in dropped]
    good = [
        {column: good_value(column, row[column], fuzzed[column][0]) for column in columns} for row in GOOD
    ]
    bad = {column: fuzzed[column][1] for column in columns}
    schema = pa.schema([(column, fuzzed[column][0]) for column in columns])

    def imported(name: str, table: list[dict[str, Any]]) -> EventBatch | None:
        pq.write_table(pa.Table.from_pylist(table, schema=schema), directory / name)
        return outcome(directory / name)

    without = once(("parquet", schema.to_string()), lambda: imported("without.parquet", good))
    check_rows_alone(
        imported("with.parquet", [*good[:position], bad, *good[position:]]), without, position + 1
    )
