"""JSON objects built column by column in Arrow: one record per row, no Python loop over the rows.

The stream jobs write one JSON record per transaction (feature records, scores). Built row by row with a
dict per record, that cost ~10 µs each; here every column is formatted once by Arrow (numbers with its
shortest round-trip conversion, so they parse back to the same value) and the pieces are joined
element-wise, well under a microsecond per record::

    json_objects([("schema_version", 1), ("tx_id", tx_ids), ("features", [("card_nb_tx_1d", counts)])])

A field is a literal (int, float, bool, str: the same in every record), an Arrow array (int, float,
bool, string; null and non-finite numbers become ``null``), or a list of fields (a nested object).

:func:`read_records` reads such records back as columns, and :func:`text_arrays` makes each row's values a
JSON array of their text, as Python writes the values a JSON reader gets from those records: for Redis
hashes.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import Union

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json

Value = Union[pa.Array, pa.ChunkedArray, int, float, bool, str, "Fields"]
Fields = Sequence[tuple[str, Value]]


def json_objects(fields: Fields, length: int | None = None) -> pa.Array:
    """The JSON object of each row as a binary array (``length`` rows: needed when no field is an array)."""
    parts: list[pa.Array | str] = []
    _append_object(parts, fields)
    arrays = [part for part in parts if not isinstance(part, str)]
    rows = len(arrays[0]) if arrays else length
    if rows is None:
        raise ValueError("json_objects needs `length` when no field is an array")
    if any(len(array) != rows for array in arrays):
        raise ValueError(f"json_objects: fields have different lengths {sorted({len(a) for a in arrays})}")
    if not rows:
        return pa.array([], pa.binary())
    if not arrays:
        return pa.array([_joined(parts)] * rows, pa.binary())
    merged = _merge_literals(parts)
    return pc.binary_join_element_wise(*merged, "").cast(pa.binary())


def _append_object(parts: list[pa.Array | str], fields: Fields) -> None:
    parts.append("{")
    for position, (name, value) in enumerate(fields):
        parts.append(("," if position else "") + orjson.dumps(name).decode() + ":")
        if isinstance(value, list | tuple):
            _append_object(parts, value)
        elif isinstance(value, pa.Array | pa.ChunkedArray):
            parts.append(_formatted(value))
        else:
            parts.append(orjson.dumps(value).decode())
    parts.append("}")


def _formatted(values: pa.Array | pa.ChunkedArray) -> pa.Array:
    """Each value as JSON text (string array)."""
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    kind = values.type
    if pa.types.is_boolean(kind):
        text = pc.if_else(values, "true", "false")
    elif pa.types.is_floating(kind):
        finite = pc.is_finite(values)
        if not pc.all(finite).as_py():  # JSON has no NaN or infinity: those become null
            values = pc.if_else(finite, values, pa.scalar(None, kind))
        text = pc.cast(values, pa.string())
    elif pa.types.is_integer(kind):
        text = pc.cast(values, pa.string())
    elif pa.types.is_string(kind) or pa.types.is_large_string(kind):
        encoded = pc.dictionary_encode(values)
        escaped = [orjson.dumps(value).decode() for value in encoded.dictionary.to_pylist()]
        text = pa.array(escaped, pa.string()).take(encoded.indices)
    else:
        raise TypeError(f"json_objects cannot format Arrow type {kind}")
    return pc.fill_null(text, "null") if text.null_count else text


def _merge_literals(parts: list[pa.Array | str]) -> list[pa.Array | str]:
    """Adjacent literal pieces joined into one (fewer arguments for the element-wise join)."""
    merged: list[pa.Array | str] = []
    for part in parts:
        if isinstance(part, str) and merged and isinstance(merged[-1], str):
            merged[-1] += part
        else:
            merged.append(part)
    return merged


def _joined(parts: list[pa.Array | str]) -> bytes:
    return "".join(part for part in parts if isinstance(part, str)).encode()


def read_records(records: Sequence[bytes], schema: pa.Schema) -> pa.Table:
    """JSON records as columns of ``schema``'s types (fields the schema lacks are left out)."""
    text = b"\n".join(records)
    return pyarrow.json.read_json(
        io.BytesIO(text),
        read_options=pyarrow.json.ReadOptions(block_size=len(text) + 1),  # one block: no type drift
        parse_options=pyarrow.json.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore"),
    )


def newest_rows(rows: pa.Table, key: str, order: Sequence[str]) -> pa.Table:
    """The last row of each ``key`` value by the ``order`` columns (ascending): the latest record per key of
    records read back (:func:`read_records`)."""
    ordered = rows.take(pc.sort_indices(rows, [(name, "ascending") for name in (key, *order)]))
    keys = ordered.column(key).combine_chunks()
    last = pc.not_equal(keys.slice(1), keys.slice(0, len(keys) - 1)).to_numpy(zero_copy_only=False)
    return ordered.filter(pa.array(np.append(last, True)))


def text_arrays(columns: Sequence[pa.Array | pa.ChunkedArray], typed: bool = False) -> pa.Array:
    """Each row as a JSON array of strings: its value in each column, as text (:func:`python_texts`).

    The values of a Redis hash's fields in one argument (``infra.redis.store.set_latest_encoded``), built
    without a Python loop over the rows.
    """
    if not columns or not len(columns[0]):
        return pa.array([], pa.binary())
    parts: list[pa.Array | str] = ["["]
    for position, values in enumerate(columns):
        if position:
            parts.append(",")
        texts = python_texts(values, typed)
        if pa.types.is_string(values.type) or pa.types.is_large_string(values.type):
            parts.append(_escaped(texts))
        else:  # digits, signs, points, exponents, nan, inf: nothing to escape
            parts += ['"', texts, '"']
    parts.append("]")
    return pc.binary_join_element_wise(*_merge_literals(parts), "").cast(pa.binary())


def python_texts(values: pa.Array | pa.ChunkedArray, typed: bool = False) -> pa.Array:
    """Each value as the text Python gives the value a JSON reader gets from a record :func:`json_objects`
    wrote: ``repr`` of the number (one written without a fraction or an exponent reads as an int, so 3.0
    is ``3``; with ``typed``, a float column's values are read as floats, as a typed model reads them:
    ``3.0``), a string as it is, a bool as 1 or 0; null as empty text. It is what ``set_latest`` stores
    for a record parsed with ``orjson`` (or, ``typed``, a pydantic model).

    Arrow's own text of a number is Python's except for an exponent, a magnitude below 1e-4 or from 1e16
    on and -0 (the tests compare them over every magnitude): those few are written by Python.
    """
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    kind = values.type
    if pa.types.is_null(kind):
        return pa.array([""] * len(values), pa.string())
    if pa.types.is_boolean(kind):
        text = pc.if_else(values, "1", "0")
    elif pa.types.is_integer(kind) or pa.types.is_string(kind) or pa.types.is_large_string(kind):
        text = pc.cast(values, pa.string())
    elif pa.types.is_floating(kind):
        text = pc.cast(values, pa.string())
        magnitude = pc.abs(values)
        odd = pc.or_(
            pc.or_(pc.match_substring(text, "e"), pc.invert(pc.is_finite(values))),
            pc.or_(
                pc.and_(pc.less(magnitude, 1e-4), pc.not_equal(magnitude, 0)),
                pc.or_(pc.greater_equal(magnitude, 1e16), pc.equal(text, "-0")),
            ),
        )
        odd = pc.fill_null(odd, False)
        where = np.flatnonzero(odd.to_numpy(zero_copy_only=False))
        if len(where):
            reread = (lambda value: repr(float(value))) if typed else _reread
            fixed = [reread(value) for value in text.take(pa.array(where)).to_pylist()]
            text = pc.replace_with_mask(text, odd, pa.array(fixed, pa.string()))
        if typed:  # the rest of the integral ones: 3 -> 3.0
            whole = pc.fill_null(pc.match_substring_regex(text, r"^-?[0-9]+$"), False)
            text = pc.if_else(whole, pc.binary_join_element_wise(text, ".0", ""), text)
    else:
        raise TypeError(f"python_texts cannot write Arrow type {kind}")
    return pc.fill_null(text, "") if text.null_count else text


def _reread(text: str) -> str:
    """Python's text of the number Arrow wrote as ``text`` (non-finite ones, not JSON, as floats)."""
    try:
        return repr(orjson.loads(text))
    except orjson.JSONDecodeError:
        return repr(float(text))


def _escaped(texts: pa.Array) -> pa.Array:
    """Each text as a JSON string (escaped once per distinct text)."""
    encoded = pc.dictionary_encode(texts)
    escaped = [orjson.dumps(value).decode() for value in encoded.dictionary.to_pylist()]
    return pa.array(escaped, pa.string()).take(encoded.indices)
