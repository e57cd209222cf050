"""Transaction files: CSV, Parquet or JSON lines, read into the canonical table or wire events.

CSV and Parquet files hold one transaction per row, with column names given by a mapping (the built-in
``handbook`` mapping reads the fraud-detection handbook's files); timestamps without a zone are taken as
UTC and amounts are rounded to cents; ids are read as exact integers. JSON-lines files hold transaction
events already in wire format. Rows that cannot be read (a value, or a CSV row with more fields than its
header) become dead letters; the rows around them are unaffected. A file that cannot be read as a whole
(empty, binary, not UTF-8, not Parquet, a required column missing) is refused with the reason.
"""

from __future__ import annotations

import codecs
import csv
import io
import warnings
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path

import numpy as np
import orjson
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from contracts.errors import ConfigError
from contracts.events import DeadLetter, Reason, TxColumns

C = TxColumns

#: Built-in column mappings: source column -> canonical column.
MAPPINGS: dict[str, dict[str, str]] = {
    "canonical": {},
    "handbook": {
        "TRANSACTION_ID": C.TX_ID,
        "TX_DATETIME": C.EVENT_TIME,
        "CUSTOMER_ID": C.CARD_ID,
        "TERMINAL_ID": C.TERMINAL_ID,
        "TX_AMOUNT": C.AMOUNT,
        "TX_FRAUD": C.IS_FRAUD,
        "TX_FRAUD_SCENARIO": C.FRAUD_SCENARIO,
    },
}
TABLE_SUFFIXES = {".csv", ".parquet", ".pq"}
JSONL_SUFFIXES = {".jsonl", ".ndjson"}


class InputFileError(ConfigError, ValueError):
    """The file as a whole cannot be read (unknown format, missing required columns, bad mapping)."""


def parse_mapping(spec: str) -> dict[str, str]:
    """A mapping from a built-in name or ``SRC=DST,SRC=DST`` pairs (DST a canonical column name)."""
    if spec in MAPPINGS:
        return MAPPINGS[spec]
    canonical = set(C.REQUIRED) | set(C.OPTIONAL)
    mapping = {}
    for pair in filter(None, (p.strip() for p in spec.split(","))):
        source, sep, target = pair.partition("=")
        if not sep or not source or target not in canonical:
            raise InputFileError(
                f"bad mapping entry {pair!r}: use a built-in mapping ({', '.join(MAPPINGS)}) or "
                f"SRC=DST pairs with DST one of {', '.join(sorted(canonical))}"
            )
        mapping[source] = target
    return mapping


def read_table(path: Path, mapping: dict[str, str]) -> pd.DataFrame:
    """Read a CSV or Parquet file and rename its columns to the canonical names (values untouched); rows
    of a CSV with more fields than its header are left out (:func:`load_table` makes them dead letters).

    Raises:
        InputFileError: the file as a whole cannot be read: empty, binary, not UTF-8, not Parquet, or
            without a required column.
    """
    return _read_table(path, mapping, f"file:{path}")[0]


def load_table(path: Path, mapping: dict[str, str], source: str) -> CleanTable:
    """A CSV or Parquet file as a clean canonical table (:func:`clean_table`), with a dead letter for each
    row that could not be read: one with more fields than the header, one with an unreadable value.

    Raises:
        InputFileError: as :func:`read_table`.
    """
    frame, malformed = _read_table(path, mapping, source)
    clean = clean_table(frame, source)
    clean.dead_letters[:0] = malformed
    return clean


def _read_table(path: Path, mapping: dict[str, str], source: str) -> tuple[pd.DataFrame, list[DeadLetter]]:
    suffix = path.suffix.lower()
    malformed: list[DeadLetter] = []
    if suffix not in TABLE_SUFFIXES:
        raise InputFileError(f"{path}: unknown table format {suffix!r}; use .csv or .parquet")
    check_not_empty(path)
    if suffix == ".csv":
        frame, malformed = _read_csv(path, source)
    else:
        try:
            # Integers stay integers in a column with nulls (pandas would make the column float, and every
            # id in it "3156.0" instead of "3156": one empty cell would change the tokens of its neighbours).
            frame = pq.read_table(path).to_pandas(integer_object_nulls=True)
        except (pa.ArrowException, OSError) as exc:
            raise InputFileError(f"{path} is not a Parquet file that can be read ({exc})") from None
    frame = frame.rename(columns=mapping)
    missing = [col for col in C.REQUIRED if col not in frame.columns]
    if missing:
        raise InputFileError(
            f"{path}: missing column(s) {', '.join(missing)} (columns: {', '.join(map(str, frame.columns))}); "
            "pass --mapping to map yours"
        )
    keep = [col for col in (*C.REQUIRED, *C.OPTIONAL) if col in frame.columns]
    return frame[keep], malformed  # indexed by row (from 0): rows left out keep their numbers


#: Bytes of a file's start looked at to tell text from a binary file.
SNIFF_BYTES = 8192


def check_not_empty(path: Path) -> None:
    """Refuse an empty file: it holds nothing to import, not even the header of a table.

    Raises:
        InputFileError: the file is empty.
    """
    if path.stat().st_size == 0:
        raise InputFileError(f"{path} is empty: there is nothing to import")


#: Bytes decoded at a time by :func:`check_text`.
CHUNK_BYTES = 1 << 24


def check_not_binary(path: Path) -> None:
    """Refuse a binary file given as text (a NUL byte among its first bytes).

    Raises:
        InputFileError: it is a binary file.
    """
    with path.open("rb") as handle:
        if b"\0" in handle.read(SNIFF_BYTES):
            raise InputFileError(f"{path} is a binary file, not CSV or JSON-lines text")


def check_text(path: Path) -> None:
    """Refuse a file that is not UTF-8 text (a binary file, or text in another encoding), saying where.

    Raises:
        InputFileError: a NUL byte among its first bytes, or bytes that are not UTF-8 (their line named).
    """
    check_not_binary(path)
    decoder = codecs.getincrementaldecoder("utf-8")()
    lines = 1
    with path.open("rb") as handle:
        while chunk := handle.read(CHUNK_BYTES):
            try:
                decoder.decode(chunk)
            except UnicodeDecodeError as exc:
                held = len(exc.object) - len(chunk)  # bytes of the previous chunk the decoder held back
                line = lines + chunk.count(b"\n", 0, max(exc.start - held, 0))
                raise InputFileError(
                    f"{path} is not UTF-8 text (line {line}); convert it first, for example with "
                    "`iconv -f latin1 -t utf-8`"
                ) from None
            lines += chunk.count(b"\n")
        try:
            decoder.decode(b"", final=True)
        except UnicodeDecodeError:
            raise InputFileError(f"{path} is not UTF-8 text (it ends inside a character)") from None


def _read_csv(path: Path, source: str) -> tuple[pd.DataFrame, list[DeadLetter]]:
    """A CSV file's cells as text (empty cells: missing), and a dead letter for each row with more fields
    than the header. The fast reader takes a well-formed file; a file with such rows is read again row by
    row, so that they are left out alone."""
    check_text(path)
    try:
        with warnings.catch_warnings():
            # A first row longer than the header: pandas would cut it (index_col=False) with this warning,
            # or, by default, shift every column of the file into an index.
            warnings.simplefilter("error", pd.errors.ParserWarning)
            frame = pd.read_csv(
                path, dtype=str, keep_default_na=False, na_values=[""], encoding="utf-8", index_col=False
            )
    except pd.errors.EmptyDataError:
        raise InputFileError(f"{path} has no header row: there is nothing to import") from None
    except (pd.errors.ParserError, pd.errors.ParserWarning):
        return _read_csv_rows(path, source)
    return frame, []


def _read_csv_rows(path: Path, source: str) -> tuple[pd.DataFrame, list[DeadLetter]]:
    """:func:`_read_csv` row by row: blank lines skipped, short rows filled with missing cells (as the fast
    reader does), empty fields past the header's dropped (a delimiter at the end of a line), rows with
    more fields than the header dead letters (``unexpected_field``)."""
    rows: list[list[str | None]] = []
    numbers: list[int] = []
    malformed = []
    with path.open(newline="", encoding="utf-8-sig") as handle:
        reader = csv.reader(handle)
        header = next(reader, [])
        number = 0
        for row in reader:
            if not row:
                continue
            if len(row) > len(header) and not any(row[len(header) :]):
                row = row[: len(header)]
            if len(row) > len(header):
                line = io.StringIO()
                csv.writer(line).writerow(row)
                malformed.append(
                    DeadLetter(
                        raw=line.getvalue().rstrip("\r\n").encode(),
                        source=f"{source}:row {number + 1}",
                        reason=Reason.UNEXPECTED_FIELD,
                        detail=f"{len(row)} fields in a row of a file whose header has {len(header)}",
                    )
                )
            else:
                rows.append(
                    [cell if cell != "" else None for cell in row] + [None] * (len(header) - len(row))
                )
                numbers.append(number)
            number += 1
    return pd.DataFrame(rows, columns=header, index=numbers, dtype=object), malformed


@dataclass
class CleanTable:
    """Rows of a table converted to canonical types, and the rows that could not be converted."""

    frame: pd.DataFrame
    dead_letters: list[DeadLetter] = field(default_factory=list)


#: The integers a column of the wire format can hold (int64).
_INT64 = (-(2**63), 2**63)


def _to_int(values: pd.Series) -> pd.Series:
    """Whole numbers, exactly: a column of text or objects (a CSV's cells, a Parquet integer column with
    nulls) is read value by value when it is not all int64, so no id goes through a float (which has 53
    bits: 9007199254740993 would become ...992). Other values: missing."""
    numeric = pd.to_numeric(values, errors="coerce")
    if not pd.api.types.is_numeric_dtype(values.dtype) and not pd.api.types.is_integer_dtype(numeric.dtype):
        # Built as objects: Series.map would make ints with a None among them floats again.
        return pd.Series([_exact_int(value) for value in values.tolist()], index=values.index, dtype=object)
    whole = numeric.notna() & np.isfinite(numeric) & (numeric == np.floor(numeric))
    return numeric.where(whole)


def _exact_int(value: object) -> int | None:
    """The whole number ``value`` is exactly (text as written: 12, 12.0, 1.2e1), else None."""
    if value is None or isinstance(value, bool | np.bool_):
        return None if value is None else int(value)
    if isinstance(value, int | np.integer):
        number = int(value)
    elif isinstance(value, float | np.floating):
        if not np.isfinite(value) or value != np.floor(value):
            return None
        number = int(value)
    else:
        try:
            exact = Decimal(str(value).strip())
        except ArithmeticError:
            return None
        if not exact.is_finite() or exact != exact.to_integral_value():
            return None
        number = int(exact)
    return number if _INT64[0] <= number < _INT64[1] else None


#: A number written as text (a CSV cell): epoch milliseconds, like a number column.
_NUMBER_TEXT = r"\s*-?\d+(?:\.\d*)?\s*"


def _to_event_time_ms(values: pd.Series) -> pd.Series:
    """Epoch milliseconds from datetimes (naive = UTC), date strings, or numbers (already epoch ms), also
    numbers written as text (a CSV's cells are all text)."""
    numbers = pd.api.types.infer_dtype(values, skipna=True) in ("integer", "floating", "mixed-integer-float")
    if pd.api.types.is_numeric_dtype(values) or numbers:  # numbers, also with nulls among them
        return _to_int(values)
    if isinstance(values.dtype, pd.DatetimeTZDtype) or pd.api.types.is_datetime64_any_dtype(values):
        stamps = pd.to_datetime(values, utc=True)
        numbered = pd.Series(np.nan, index=values.index)
    else:
        as_number = values.astype("string").str.fullmatch(_NUMBER_TEXT).fillna(False).astype(bool)
        numbered = _to_int(values.where(as_number))
        stamps = pd.to_datetime(values.where(~as_number), utc=True, errors="coerce", format="mixed")
    ms = stamps.astype("datetime64[ms, UTC]").astype("int64").astype("float64")
    return ms.where(stamps.notna(), numbered)


_PROBLEM = {
    Reason.MISSING_FIELD: "value is missing:",
    Reason.WRONG_TYPE: "cannot read",
    Reason.INVALID_VALUE: "not finite:",
}


def clean_table(frame: pd.DataFrame, source: str) -> CleanTable:
    """Convert canonical columns to their types; rows with missing or unreadable values become dead letters.

    Value checks (negative amounts, absurd times) are left to the event schema, which judges every row.
    """
    out = pd.DataFrame(index=frame.index)
    reasons = pd.Series("", index=frame.index, dtype=object)
    converters = {
        C.TX_ID: _to_int,
        C.CARD_ID: lambda s: s.astype(object).where(s.notna()).map(lambda v: v if v is None else str(v)),
        C.TERMINAL_ID: lambda s: s.astype(object).where(s.notna()).map(lambda v: v if v is None else str(v)),
        # Always a float: an integer column (or one empty cell in it) must not change how amounts are written.
        C.AMOUNT: lambda s: pd.to_numeric(s, errors="coerce").astype("float64").round(2),
        C.EVENT_TIME: _to_event_time_ms,
        C.IS_FRAUD: _to_int,
        C.FRAUD_SCENARIO: _to_int,
        C.TERMINAL_X: lambda s: pd.to_numeric(s, errors="coerce"),
        C.TERMINAL_Y: lambda s: pd.to_numeric(s, errors="coerce"),
    }
    for column in frame.columns:
        raw = frame[column]
        converted = converters[column](raw)
        absent = raw.isna()
        unreadable = converted.isna() & ~absent
        if column in C.REQUIRED:
            reasons = reasons.mask(absent & (reasons == ""), f"{Reason.MISSING_FIELD}:{column}")
        reasons = reasons.mask(unreadable & (reasons == ""), f"{Reason.WRONG_TYPE}:{column}")
        if column in (C.AMOUNT, C.TERMINAL_X, C.TERMINAL_Y):
            infinite = np.isinf(converted.to_numpy(dtype="float64", na_value=np.nan))
            reasons = reasons.mask(infinite & (reasons == ""), f"{Reason.INVALID_VALUE}:{column}")
        out[column] = converted
    bad = reasons != ""
    dead_letters = []
    if bad.any():
        originals = frame[bad].astype(object).where(frame[bad].notna(), None)
        for row_number, row in originals.iterrows():
            reason, _, column = reasons[row_number].partition(":")
            dead_letters.append(
                DeadLetter(
                    raw=orjson.dumps(row.to_dict(), default=str),
                    source=f"{source}:row {int(str(row_number)) + 1}",
                    reason=Reason(reason),
                    detail=f"{column}: {_PROBLEM[Reason(reason)]} {frame.at[row_number, column]!r}",
                )
            )
    good = out[~bad].copy()
    good[C.TX_ID] = good[C.TX_ID].astype("int64")
    good[C.EVENT_TIME] = good[C.EVENT_TIME].astype("int64")
    good["source_row"] = good.index.to_numpy() + 1
    return CleanTable(good.reset_index(drop=True), dead_letters)


def read_jsonl(path: Path) -> list[tuple[int, bytes]]:
    """(line number, raw bytes) of each non-empty line of a JSON-lines file (a line that is not JSON, not
    UTF-8 included, is the validation's to dead-letter).

    Raises:
        InputFileError: the file is empty, or binary.
    """
    check_not_empty(path)
    check_not_binary(path)
    with path.open("rb") as handle:
        return [(n, line.rstrip(b"\r\n")) for n, line in enumerate(handle, start=1) if line.strip()]
