"""Ingest loses nothing it could keep: a CSV row with more fields than its header is one dead letter and
the rest of the file goes through; ids are read as exact integers whatever other cells hold; terminal ids
a card number could be read in are tokenised, on every path (CSV, Parquet, JSON lines); a file that
cannot be read as a whole (empty, binary, not UTF-8, not Parquet) is refused with one reason.

Each case imports a small file as `fraud ingest` does (``events_from_file``).
"""

from __future__ import annotations

import re
from pathlib import Path

import orjson
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contracts.events import Reason, TransactionEvent, TxColumns
from contracts.privacy import mask_card_numbers
from ingest.files import InputFileError
from ingest.produce import EventBatch, events_from_file
from ingest.tokens import TERMINAL_TOKEN_PREFIX, card_token, terminal_token
from tests.ingest.test_file_fuzz import CLOCK, COLUMNS, GOOD, KEY, MAX_BYTES, check_rows_alone, outcome

C = TxColumns
HEADER = ",".join(COLUMNS)
#: Luhn-valid 15- and 16-digit terminal ids (a merchant's numbering may make such ids).
CARD_LIKE = ["4111111111111111", "378282246310005", "5500 0000 0000 0004"]


def imported(path: Path) -> EventBatch:
    return events_from_file(path, {}, KEY, 7 * 86_400_000, MAX_BYTES, CLOCK)


def events(batch: EventBatch) -> list[TransactionEvent]:
    return [TransactionEvent.model_validate_json(value) for value in batch.tx_values]


def good_lines() -> list[str]:
    return [",".join(str(row[column]) for column in COLUMNS) for row in GOOD]


def test_a_row_with_more_fields_than_the_header_is_one_dead_letter_and_the_rest_goes_through(
    tmp_path: Path,
) -> None:
    lines = good_lines()
    path = tmp_path / "extra.csv"
    path.write_text("\n".join([HEADER, lines[0], lines[1] + ",surplus,4111111111111111", lines[2]]) + "\n")
    batch = imported(path)
    assert sorted(event.tx_id for event in events(batch)) == [1, 3]
    (letter,) = batch.dead_letters
    assert (letter.reason, letter.source) == (Reason.UNEXPECTED_FIELD, f"file:{path}:row 2")
    assert "8 fields" in letter.detail and "header has 6" in letter.detail
    assert b"surplus" in letter.raw and b"4111111111111111" not in letter.raw, "kept, card numbers masked"


#: A CSV cell of a line written by hand: no quotes, commas or line ends (which would join lines).
PLAIN_CELL = st.text(
    alphabet=st.characters(exclude_categories=("Cs", "Cc", "Zl", "Zp"), exclude_characters='",\r\n'),
    max_size=12,
)


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture], max_examples=40)
@given(cells=st.lists(PLAIN_CELL, min_size=1, max_size=12), position=st.integers(0, len(GOOD)))
def test_any_line_of_any_number_of_fields_is_one_record_or_one_dead_letter(
    tmp_path: Path, cells: list[str], position: int
) -> None:
    lines = good_lines()
    with_line, without = tmp_path / "with.csv", tmp_path / "without.csv"
    with_line.write_text("\n".join([HEADER, *lines[:position], ",".join(cells), *lines[position:]]) + "\n")
    without.write_text("\n".join([HEADER, *lines]) + "\n")
    if not ",".join(cells).strip():  # a blank line is no row
        return
    check_rows_alone(outcome(with_line), outcome(without), position + 1)


def test_ids_are_exact_integers_whatever_the_other_cells_of_their_column_hold(tmp_path: Path) -> None:
    row = {column: str(GOOD[0][column]) for column in COLUMNS}
    ids = ["9007199254740993", "9007199254740992", "", "x", "9223372036854775808", " 17 ", "1.8e1", "19.0"]
    path = tmp_path / "ids.csv"
    pd.DataFrame([{**row, C.TX_ID: tx_id} for tx_id in ids], columns=COLUMNS).to_csv(path, index=False)
    batch = imported(path)
    assert [event.tx_id for event in events(batch)] == [9007199254740993, 9007199254740992, 17, 18, 19]
    reasons = {letter.source.rpartition(" ")[2]: letter.reason for letter in batch.dead_letters}
    assert reasons == {"3": Reason.MISSING_FIELD, "4": Reason.WRONG_TYPE, "5": Reason.WRONG_TYPE}


def test_parquet_ids_with_nulls_stay_exact(tmp_path: Path) -> None:
    path = tmp_path / "ids.parquet"
    rows = [
        {**GOOD[0], C.TX_ID: tx_id, C.EVENT_TIME: str(GOOD[0][C.EVENT_TIME])} for tx_id in (2**53 + 1, None)
    ]
    pq.write_table(pa.Table.from_pylist(rows), path)
    batch = imported(path)
    assert [event.tx_id for event in events(batch)] == [2**53 + 1]
    assert [letter.reason for letter in batch.dead_letters] == [Reason.MISSING_FIELD]


def write_card_like_terminals(path: Path) -> None:
    rows = [
        {**GOOD[n % len(GOOD)], C.TX_ID: n, C.TERMINAL_ID: terminal}
        for n, terminal in enumerate(CARD_LIKE * 2)
    ]
    if path.suffix == ".csv":
        pd.DataFrame(rows, columns=COLUMNS).to_csv(path, index=False)
    elif path.suffix == ".parquet":
        pq.write_table(
            pa.Table.from_pylist([{**row, C.EVENT_TIME: str(row[C.EVENT_TIME])} for row in rows]), path
        )
    else:
        lines = []
        for row in rows:
            ms = int(pd.Timestamp(str(row[C.EVENT_TIME]), tz="UTC").value // 1_000_000)
            event = {
                "schema_version": 1,
                "tx_id": row[C.TX_ID],
                "card_id": card_token(str(row[C.CARD_ID]), KEY),
            }
            lines.append(
                orjson.dumps(
                    {**event, "terminal_id": row[C.TERMINAL_ID], "amount": row[C.AMOUNT], "event_time_ms": ms}
                )
            )
        path.write_bytes(b"\n".join(lines) + b"\n")


@pytest.mark.parametrize("suffix", [".csv", ".parquet", ".jsonl"])
def test_terminal_ids_a_card_number_could_be_read_in_are_tokenised_on_every_path(
    tmp_path: Path, suffix: str
) -> None:
    path = tmp_path / f"terminals{suffix}"
    write_card_like_terminals(path)
    batch = imported(path)
    assert not batch.dead_letters
    terminals = [event.terminal_id for event in events(batch)]
    assert terminals == [terminal_token(terminal, KEY) for terminal in CARD_LIKE * 2], (
        "one token per terminal"
    )
    assert all(terminal.startswith(TERMINAL_TOKEN_PREFIX) for terminal in terminals)
    stored = b"\n".join(batch.tx_values + batch.label_values).decode()
    assert mask_card_numbers(stored) == stored, "no card number in what is produced"
    assert len(batch.label_values) == (0 if suffix == ".jsonl" else 2)  # a fraud row's label
    assert all(TERMINAL_TOKEN_PREFIX in label.decode() for label in batch.label_values)


def test_a_terminal_token_is_apart_from_the_card_token_of_the_same_number() -> None:
    assert terminal_token(CARD_LIKE[0], KEY)[len(TERMINAL_TOKEN_PREFIX) :] != card_token(CARD_LIKE[0], KEY)
    assert terminal_token(CARD_LIKE[0], KEY) != terminal_token(CARD_LIKE[0], b"another key")


@pytest.mark.parametrize(
    ("name", "content", "reason"),
    [
        ("empty.csv", b"", "is empty"),
        ("empty.parquet", b"", "is empty"),
        ("empty.jsonl", b"", "is empty"),
        ("binary.csv", bytes(range(256)) * 4, "is a binary file"),
        ("binary.jsonl", b"PAR1\x00\x15\x04" * 50, "is a binary file"),
        (
            "latin1.csv",
            f"{HEADER}\n1,596,Caf\u00e9,5.0,2018-04-01,0\n".encode("latin-1"),
            "is not UTF-8 text (line 2)",
        ),
        ("garbage.parquet", b"not a parquet file at all\n", "is not a Parquet file"),
        ("text.parquet", f"{HEADER}\n".encode(), "is not a Parquet file"),
    ],
)
def test_a_file_that_cannot_be_read_as_a_whole_is_refused_with_its_reason(
    tmp_path: Path, name: str, content: bytes, reason: str
) -> None:
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(InputFileError, match=re.escape(reason)) as refused:
        imported(path)
    assert "\n" not in str(refused.value)


def test_a_header_alone_is_a_file_of_no_rows(tmp_path: Path) -> None:
    path = tmp_path / "header.csv"
    path.write_text(HEADER + "\n")
    batch = imported(path)
    assert (batch.tx_values, batch.dead_letters) == ([], [])


def test_a_first_row_longer_than_the_header_is_a_dead_letter_not_a_shift_of_every_column(
    tmp_path: Path,
) -> None:
    lines = good_lines()
    path = tmp_path / "first.csv"
    path.write_text("\n".join([HEADER, "7," + lines[0], *lines[1:]]) + "\n")
    batch = imported(path)
    assert sorted(event.tx_id for event in events(batch)) == [2, 3], "no column shifted into an index"
    assert [(letter.reason, letter.source.rpartition(":")[2]) for letter in batch.dead_letters] == [
        (Reason.UNEXPECTED_FIELD, "row 1")
    ]


def test_a_delimiter_at_the_end_of_every_row_loses_nothing(tmp_path: Path) -> None:
    path = tmp_path / "trailing.csv"
    path.write_text("\n".join([HEADER, *(line + "," for line in good_lines())]) + "\n")
    batch = imported(path)
    assert sorted(event.tx_id for event in events(batch)) == [1, 2, 3] and not batch.dead_letters
