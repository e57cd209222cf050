"""Transaction files: CSV, Parquet or JSON lines, read into the canonical table or wire events.

CSV and Parquet files hold one transaction per row, with column names given by a mapping (the built-in
``handbook`` mapping reads the fraud-detection handbook's files); timestamps without a zone are taken as
UTC and amounts are rounded to cents. JSON-lines files hold transaction events already in wire format.
Rows that cannot be read become dead letters; the rows around them are unaffected.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import orjson
import pandas as pd
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
    """Read a CSV or Parquet file and rename its columns to the canonical names (values untouched)."""
    suffix = path.suffix.lower()
    if suffix == ".csv":
        frame = pd.read_csv(path, dtype=str, keep_default_na=False, na_values=[""])
    elif suffix in {".parquet", ".pq"}:
        # Integers stay integers in a column with nulls (pandas would make the column float, and every id
        # in it "3156.0" instead of "3156": one empty cell would change the tokens of its neighbours).
        frame = pq.read_table(path).to_pandas(integer_object_nulls=True)
    else:
        raise InputFileError(f"{path}: unknown table format {suffix!r}; use .csv or .parquet")
    frame = frame.rename(columns=mapping)
    missing = [col for col in C.REQUIRED if col not in frame.columns]
    if missing:
        raise InputFileError(
            f"{path}: missing column(s) {', '.join(missing)} (columns: {', '.join(map(str, frame.columns))}); "
            "pass --mapping to map yours"
        )
    keep = [col for col in (*C.REQUIRED, *C.OPTIONAL) if col in frame.columns]
    return frame[keep].reset_index(drop=True)


@dataclass
class CleanTable:
    """Rows of a table converted to canonical types, and the rows that could not be converted."""

    frame: pd.DataFrame
    dead_letters: list[DeadLetter] = field(default_factory=list)


def _to_int(values: pd.Series) -> pd.Series:
    numeric = pd.to_numeric(values, errors="coerce")
    whole = numeric.notna() & np.isfinite(numeric) & (numeric == np.floor(numeric))
    return numeric.where(whole)


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
    """(line number, raw bytes) of each non-empty line of a JSON-lines file."""
    with path.open("rb") as handle:
        return [(n, line.rstrip(b"\r\n")) for n, line in enumerate(handle, start=1) if line.strip()]
