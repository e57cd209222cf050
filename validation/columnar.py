"""Columnar validation of raw event bytes: many records at once, judged exactly as ``parse_event`` does.

``validate_many`` is a fast path in front of :func:`validation.parse.parse_event`. It accepts a record
only when pydantic would accept it with exactly the same values; every other record is handed back as
*slow*, for the caller to run ``parse_event`` on (which then gives the dead-letter reason). It never
rejects a record itself, so the dead letters and their reasons stay pydantic's.

How a batch is judged:

1. Records that are None, empty, larger than ``max_bytes`` or contain a newline go slow, and so do
   those whose first and last non-blank bytes are not ``{`` and ``}``.
2. ``pyarrow.json`` parses the rest, newline-joined, against a schema derived from the model. Arrow is
   what checks the JSON syntax and converts the values, and it is as strict as pydantic's strict mode
   about token kinds: an int column refuses ``1.0``, ``"1"`` and ``true``, a bool column refuses ``1``, a
   string column refuses numbers; it refuses repeated keys (pydantic keeps the last one). The row count
   must equal the record count, so that each line gave exactly one object. A key the model does not
   have (also inside a dict field, also with a null value) becomes an extra column; every record that
   spells that key goes slow, and so does one whose keys, decoded, include it (when it has escapes).
3. Arrow parses blocks of 8,192 records. When it refuses one, the record its error names (most of its
   errors name one) goes slow and the records around it are parsed again; if it names the token it
   could not convert instead, the records holding that token, or any number an int field cannot take,
   go slow; else the records are split. Retries stop when they do not pay (see ``_parse``): what is
   still refused then goes slow.
4. Where Arrow accepts more than pydantic, the value decides: a string column must be valid UTF-8
   (Arrow does not check); a ``-0.0`` float goes slow if the record has an integer token ``-0`` (which
   pydantic reads as 0.0); an infinite float only passes if every ``Inf`` in the record is an
   ``Infinity`` (Arrow also reads ``Inf``); a NaN only if positive (Arrow also reads ``-NaN``); a float of
   2**63 or more goes slow if the record has an integer token of 19 digits or more (pydantic converts
   an integer beyond int64 to float itself). A null passes only for an optional field whose default
   is None (else it was absent or null, and they differ).
5. The constraints are checked column-wise from the model's own metadata: ``Ge``/``Gt``/``Le``/``Lt``,
   ``allow_inf_nan``, ``Literal`` values; string constraints (``min_length``, ``max_length``,
   ``pattern``) by pydantic itself, on the distinct values of the column, so that the regex engine and
   the character counting are the model's own.

Nothing here is a second copy of the schema: the plan is derived from ``model.model_fields`` and
``model.model_config`` on first use. A model that uses a feature this module does not reproduce
(validators, aliases, unions, other field types, other constraints or config) raises
:class:`UnsupportedModelError` at call time instead of being judged wrongly.

Delivery guarantee: none of its own; it is a pure function of its input.
"""

from __future__ import annotations

import functools
import itertools
import json
import re
import types
import typing
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Union

import annotated_types as at
import numpy as np
import numpy.typing as npt
import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj
from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError
from pydantic.fields import FieldInfo
from pydantic.types import AllowInfNan, Strict

from contracts.errors import FraudError

Index = npt.NDArray[np.int64]
Mask = npt.NDArray[np.bool_]


@dataclass(frozen=True)
class Validated:
    """The records the fast path accepted, and the ones it leaves to ``parse_event``.

    Every input index is in exactly one of ``positions`` and ``slow``.
    """

    #: The accepted records, one column per model field in model field order, Arrow types.
    table: pa.Table
    #: int64: the input index of each row of ``table``, ascending.
    positions: Index
    #: int64: the input indexes the fast path could not decide, ascending; run ``parse_event`` on them.
    slow: Index


class UnsupportedModelError(FraudError, TypeError):
    """The model uses a feature the columnar fast path cannot reproduce exactly."""


# --- The plan: what the model accepts, derived from its metadata -----------------------------------------

_INT64_MIN = -(2**63)
_INT64_MAX = 2**63 - 1


# model_config keys that do not change how JSON input is validated (or that are honoured below).
_NEUTRAL_CONFIG = frozenset(
    {
        "title",
        "frozen",
        "extra",
        "strict",
        "regex_engine",
        "allow_inf_nan",
        "hide_input_in_errors",
        "protected_namespaces",
        "defer_build",
        "json_schema_extra",
        "json_schema_mode_override",
        "json_schema_serialization_defaults_required",
        "use_attribute_docstrings",
        "ser_json_timedelta",
        "ser_json_temporal",
        "ser_json_bytes",
        "ser_json_inf_nan",
        "cache_strings",
        "arbitrary_types_allowed",
        "revalidate_instances",
        "validate_assignment",
    }
)


@dataclass(frozen=True)
class _Scalar:
    """A scalar JSON value the fast path can check: its kind, nullability and constraints."""

    kind: Literal["int", "float", "str", "bool"]
    nullable: bool
    #: (operator, bound) pairs, operator one of "ge", "gt", "le", "lt".
    bounds: tuple[tuple[str, int | float], ...] = ()
    allow_inf_nan: bool = True
    #: Literal values, or None for any value of the kind.
    choices: tuple[object, ...] | None = None
    #: pydantic's own validator of a list of strings with the field's string constraints.
    strings: TypeAdapter[list[str]] | None = None

    def arrow_type(self) -> pa.DataType:
        return {"int": pa.int64(), "float": pa.float64(), "str": pa.string(), "bool": pa.bool_()}[self.kind]


@dataclass(frozen=True)
class _Field:
    name: str
    required: bool
    default: object
    #: The field's value, or for a ``dict[str, X]`` field the value of each key.
    scalar: _Scalar
    is_dict: bool = False


@dataclass(frozen=True)
class _Plan:
    model: type[BaseModel]
    fields: tuple[_Field, ...]


def _unsupported(model: type[BaseModel], what: str) -> UnsupportedModelError:
    return UnsupportedModelError(f"validate_many cannot check {model.__name__} exactly: {what}")


def _unwrap(tp: Any, metadata: list[Any]) -> Any:
    """The type inside ``Annotated[...]`` layers, their metadata appended to ``metadata``."""
    while typing.get_origin(tp) is Annotated:
        inner, *extras = typing.get_args(tp)
        for extra in extras:
            if isinstance(extra, FieldInfo):
                metadata.extend(extra.metadata)
            else:
                metadata.append(extra)
        tp = inner
    return tp


def _scalar(model: type[BaseModel], name: str, annotation: Any, metadata: list[Any]) -> _Scalar:
    config = model.model_config
    metadata = list(metadata)
    tp = _unwrap(annotation, metadata)
    nullable = False
    if typing.get_origin(tp) in (Union, types.UnionType):
        members = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(members) != 1 or len(typing.get_args(tp)) != 2:
            raise _unsupported(model, f"field {name!r} is a union other than X | None")
        nullable = True
        tp = _unwrap(members[0], metadata)
    choices: tuple[object, ...] | None = None
    if typing.get_origin(tp) is Literal:
        choices = typing.get_args(tp)
        if all(type(c) is int for c in choices):
            tp = int
        elif all(type(c) is str for c in choices):
            tp = str
        elif all(type(c) is bool for c in choices):
            tp = bool
        else:
            raise _unsupported(model, f"field {name!r} mixes Literal value types")
    kinds: dict[Any, Literal["int", "float", "str", "bool"]] = {
        int: "int",
        float: "float",
        str: "str",
        bool: "bool",
    }
    if tp not in kinds:
        raise _unsupported(model, f"field {name!r} has type {tp!r} (int, float, str, bool, Literal only)")
    kind = kinds[tp]
    bounds: list[tuple[str, int | float]] = []
    allow_inf_nan = bool(config.get("allow_inf_nan", True))
    string_metadata: list[Any] = []
    for item in metadata:
        if isinstance(item, at.Ge | at.Gt | at.Le | at.Lt) and kind in ("int", "float"):
            op = type(item).__name__.lower()
            bound = getattr(item, op)
            if kind == "int" and type(bound) is not int:
                raise _unsupported(model, f"field {name!r}: int field with a non-int bound {bound!r}")
            if kind == "float" and not (type(bound) in (int, float) and float(bound) == bound):
                raise _unsupported(model, f"field {name!r}: bound {bound!r} is not exactly a float")
            bounds.append((op, bound))
        elif isinstance(item, AllowInfNan) and kind == "float":
            allow_inf_nan = item.allow_inf_nan
        elif isinstance(item, at.MinLen | at.MaxLen) and kind == "str":
            string_metadata.append(item)
        elif isinstance(item, Strict):
            pass  # the fast path accepts only values that strict and lax mode both take as they are
        elif (
            type(item).__name__ == "_PydanticGeneralMetadata"
            and kind == "str"
            and set(vars(item))
            <= {
                "pattern",
                "strict",
            }
        ):
            string_metadata.append(item)
        else:
            raise _unsupported(model, f"field {name!r} has constraint {item!r}")
    strings = None
    if string_metadata:
        engine = config.get("regex_engine", "rust-regex")
        strings = TypeAdapter(
            list[Annotated[str, *string_metadata]],
            config=ConfigDict(strict=True, regex_engine=engine),
        )
    return _Scalar(kind, nullable, tuple(bounds), allow_inf_nan, choices, strings)


@functools.cache
def _plan(model: type[BaseModel]) -> _Plan:
    config = model.model_config
    unknown = set(config) - _NEUTRAL_CONFIG
    if unknown:
        raise _unsupported(model, f"model_config sets {sorted(unknown)}")
    if config.get("extra", "ignore") not in ("forbid", "ignore"):
        raise _unsupported(model, f"extra={config.get('extra')!r}")
    decorators = model.__pydantic_decorators__
    if decorators.validators or decorators.field_validators or decorators.root_validators:
        raise _unsupported(model, "it has field validators")
    if decorators.model_validators or model.__pydantic_post_init__ is not None:
        raise _unsupported(model, "it has model validators or model_post_init")
    fields = []
    for name, info in model.model_fields.items():
        if info.alias is not None or info.validation_alias is not None:
            raise _unsupported(model, f"field {name!r} has an alias")
        if info.default_factory is not None:
            raise _unsupported(model, f"field {name!r} has a default factory")
        annotation = info.annotation
        if typing.get_origin(annotation) is dict:
            key_type, value_type = typing.get_args(annotation)
            if key_type is not str or info.metadata:
                raise _unsupported(model, f"field {name!r}: only dict[str, X] without constraints")
            if not info.is_required():
                raise _unsupported(model, f"field {name!r}: a dict field needs to be required")
            fields.append(
                _Field(name, True, None, _scalar(model, f"{name}[...]", value_type, []), is_dict=True)
            )
            continue
        scalar = _scalar(model, name, annotation, info.metadata)
        default = None if info.is_required() else info.default
        fields.append(_Field(name, info.is_required(), default, scalar))
    return _Plan(model, tuple(fields))


# --- Records Arrow can take -------------------------------------------------------------------------

_WHITESPACE = np.zeros(256, dtype=bool)
_WHITESPACE[list(b" \t\r\n")] = True
_MAX_SKIP = 64  # records with a longer run of leading or trailing whitespace go slow


def _skip(data: npt.NDArray[np.uint8], at: Index, limit: Index, step: int) -> tuple[Index, Mask]:
    """Move each position past JSON whitespace (forward or backward); False where it ran too far."""
    at = at.copy()
    done = np.ones(len(at), dtype=bool)
    moving = np.flatnonzero((at != limit) & _WHITESPACE[data[np.clip(at, 0, len(data) - 1)]])
    for _ in range(_MAX_SKIP):
        if not len(moving):
            return at, done
        at[moving] += step
        inside = at[moving] != limit[moving]
        moving = moving[inside & _WHITESPACE[data[np.where(inside, at[moving], 0)]]]
    done[moving] = False
    return at, done


def _candidates(valid: Mask, data: npt.NDArray[np.uint8], offsets: Index, max_bytes: int) -> Mask:
    """Records worth giving Arrow: 1 to max_bytes bytes, one line, ``{`` to ``}`` but for blanks."""
    starts, ends = offsets[:-1], offsets[1:]
    sizes = ends - starts
    candidate = valid & (sizes > 0) & (sizes <= max_bytes)
    if not len(data):
        return candidate
    first, first_ok = _skip(data, starts, ends, 1)
    last, last_ok = _skip(data, ends - 1, starts - 1, -1)
    candidate &= first_ok & last_ok & (first < ends) & (last >= starts)
    candidate &= data[np.clip(first, 0, len(data) - 1)] == ord("{")
    candidate &= data[np.clip(last, 0, len(data) - 1)] == ord("}")
    # A newline would split the record in two lines (JSON strings cannot hold one; whitespace can).
    newline = np.flatnonzero(data == ord("\n"))
    candidate[np.searchsorted(offsets, newline, side="right") - 1] = False
    return candidate


# --- Arrow parsing ------------------------------------------------------------------------------------


def _schema(plan: _Plan, dict_keys: Mapping[str, Sequence[str]]) -> pa.Schema:
    """The output schema: one column per field, dict fields as structs of their expected keys."""
    fields = []
    for field in plan.fields:
        value = field.scalar.arrow_type()
        if field.is_dict:
            keys = dict_keys[field.name]
            struct = pa.struct([pa.field(k, value, nullable=False) for k in keys])
            fields.append(pa.field(field.name, struct, nullable=False))
        else:
            fields.append(pa.field(field.name, value, nullable=field.scalar.nullable))
    return pa.schema(fields)


def _nullable(data_type: pa.DataType) -> pa.DataType:
    if pa.types.is_struct(data_type):
        return pa.struct([pa.field(f.name, _nullable(f.type)) for f in data_type])
    return data_type


#: Records per Arrow parse: a record Arrow refuses costs retries of its block only.
_BLOCK_RECORDS = 8192
#: Retries of a block may spend this many times its records (and calls) more than they parse.
_RETRIES = 1.0
#: A retry that parses records earns this many times them back, so that parsing pays for itself and
#: what is spent is failed reads and calls: isolating a bad record costs about two calls and a read up to
#: it, which pays (against parse_event on the whole block) only while bad records are sparse.
_EARN = 2
#: What one call of the Arrow reader costs besides its records, in records (about 300 us here, while
#: parse_event takes 4-9 us a record).
_CALL_COST = 256
#: Bad records Arrow does not name (it miscounts two objects on a line) that any block may isolate by
#: halving, whatever its size: about two calls a halving.
_UNNAMED_ISOLATED = 2
#: The row Arrow names when it refuses a record (most syntax and type errors say it; some do not).
_ROW_OF_ERROR = re.compile(r" in row (\d+)$")
#: The token Arrow could not convert (an int column given 1.0, 1e2 or an integer beyond int64).
_TOKEN_OF_ERROR = re.compile(r"couldn't parse:(\S{1,64})$")


class _Block:
    """Records joined into newline-delimited JSON once; any run of them is a zero-copy slice to parse."""

    def __init__(self, values: pa.Array, rows: Index, schema: pa.Schema) -> None:
        self.rows = rows
        self.int_fields = [f.name for f in schema if pa.types.is_int64(f.type)]
        self.values = values if len(rows) == len(values) else values.take(pa.array(rows))
        self.schema = schema
        # Absent fields come out as nulls; the checks judge them.
        self.parse_schema = pa.schema([pa.field(f.name, _nullable(f.type)) for f in schema])
        lists = pa.LargeListArray.from_arrays(
            pa.array([0, len(rows)], pa.int64()), self.values.cast(pa.large_binary())
        )
        self.buffer = pc.binary_join(lists, pa.scalar(b"\n", pa.large_binary()))[0].as_buffer()
        sizes = pc.binary_length(self.values).to_numpy(zero_copy_only=False).astype(np.int64)
        self.line_start = np.concatenate([[0], np.cumsum(sizes + 1)[:-1]]).astype(np.int64)
        self.line_end = self.line_start + sizes

    def read(self, begin: int, end: int) -> tuple[pa.Table, Mask] | int | Mask | None:
        """Records ``begin:end`` of the block parsed, one row each.

        Returns the table and the rows that may hold a key the schema does not have. If Arrow refuses
        the records: the index (from ``begin``) of the one it names; or the rows that hold the token it
        could not convert; or None when it says neither.
        """
        start = int(self.line_start[begin])
        buffer = self.buffer.slice(start, int(self.line_end[end - 1]) - start)
        try:
            table = pj.read_json(
                pa.BufferReader(buffer),
                # One block: the rows Arrow counts in its errors are then the lines of this call.
                read_options=pj.ReadOptions(use_threads=False, block_size=max(buffer.size + 1, 1 << 20)),
                parse_options=pj.ParseOptions(
                    explicit_schema=self.parse_schema,
                    # Unexpected keys become extra columns (refusing them would not say which record).
                    unexpected_field_behavior="infer",
                    newlines_in_values=False,
                ),
            )
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as error:
            message = str(error)
            named = _ROW_OF_ERROR.search(message)
            if named and int(named.group(1)) < end - begin:
                return int(named.group(1))
            token = _TOKEN_OF_ERROR.search(message)
            if token:
                # Every record with that token as a value, or with a number an int column cannot take
                # after an int field's key (so that the next such record does not fail this read again).
                patterns = [r":\s*" + re.escape(token.group(1)) + r"\s*[,}]"]
                if self.int_fields:
                    keys = "|".join(re.escape(json.dumps(name)) for name in self.int_fields)
                    patterns.append(rf"(?:{keys})\s*:\s*-?[0-9]+(?:[.eE]|[0-9]{{19}})")
                holding = _matches(self.values.slice(begin, end - begin), "|".join(patterns), regex=True)
                return holding if holding.any() else None
            return None
        # Each line must have given exactly one row: then row i is record begin + i.
        if table.num_rows != end - begin:
            return None
        try:
            unexpected = _unexpected(table.schema, self.schema)
        except UnicodeDecodeError:  # a key that is not UTF-8: the records are refused as a whole
            return None
        return table, _mentions(self.values.slice(begin, end - begin), unexpected, self.schema)


def _unexpected(parsed: pa.Schema, schema: pa.Schema) -> list[str]:
    """Keys Arrow found that the schema does not have, at the top level or inside a struct."""
    names = [f.name for f in parsed if f.name not in schema.names]
    for f in schema:
        if pa.types.is_struct(f.type):
            expected = {child.name for child in f.type}
            names += [child.name for child in parsed.field(f.name).type if child.name not in expected]
    return names


def _mentions(values: pa.Array, keys: list[str], schema: pa.Schema) -> Mask:
    """Records that may hold one of the unexpected ``keys`` (a record can spell a key with escapes)."""
    mentions = np.zeros(len(values), dtype=bool)
    if not keys:
        return mentions
    for key in keys:
        mentions |= _matches(values, json.dumps(key, ensure_ascii=False))
    # A record with an escape: decode its keys (orjson decodes them as Arrow does) and look.
    escaped = np.flatnonzero(_matches(values, "\\") & ~mentions)
    for i, raw in zip(escaped.tolist(), values.take(pa.array(escaped)).to_pylist(), strict=True):
        mentions[i] = _has_unexpected_key(raw, schema)
    return mentions


def _matches(values: pa.Array, pattern: str, regex: bool = False) -> Mask:
    match = pc.match_substring_regex if regex else pc.match_substring
    found: Mask = match(values, pattern).fill_null(False).to_numpy(zero_copy_only=False)
    return found


def _has_unexpected_key(raw: bytes, schema: pa.Schema) -> bool:
    try:
        record = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return True
    if not isinstance(record, dict) or not set(record) <= set(schema.names):
        return True
    for field in schema:
        if pa.types.is_struct(field.type) and field.name in record:
            value = record[field.name]
            if not isinstance(value, dict) or not set(value) <= {child.name for child in field.type}:
                return True
    return False


def retry_budget(records: int) -> float:
    """What the retries of a block of ``records`` may spend, in records read (a call costs ``_CALL_COST``)."""
    halvings = _UNNAMED_ISOLATED * 2 * records.bit_length()
    return _RETRIES * records + halvings * _CALL_COST


def _parse(values: pa.Array, rows: Index, schema: pa.Schema) -> tuple[Index, pa.Table | None]:
    """Parse ``rows``: the rows parsed (in order) and their table, without the columns of unexpected keys.

    Records Arrow refuses, or that hold an unexpected key, are left out (they go slow). When Arrow names
    the record it refuses, that one is left out and the records before and after it are parsed again;
    when it names the token it could not convert, the records holding it (or any number an int field
    cannot take) are; otherwise the records are split, in up to eight. Retries spend a budget (the
    records they read, and ``_CALL_COST`` a call) that the records they parse earn back ``_EARN``
    times: sparse bad records are isolated, and a block of dense ones stops after about ``_RETRIES``
    of its records' worth and goes slow, so that bad input costs a bounded amount. Pieces are read in
    the order they are cut, so the good pieces of each cut earn before the bad one is cut further.
    """
    if not len(rows):
        return rows, None
    block = _Block(values, rows, schema)
    parts: list[tuple[int, Index, pa.Table]] = []
    budget = retry_budget(len(rows))
    pending = deque([(0, len(rows))])
    first = True
    while pending:
        begin, end = pending.popleft()
        if not first:
            if budget < _CALL_COST:
                continue  # out of retries: these go slow
            budget -= _CALL_COST
        first = False
        result = block.read(begin, end)
        if isinstance(result, tuple):
            table, unexpected = result
            keep = np.flatnonzero(~unexpected)
            if len(keep):
                taken = table.take(pa.array(keep)) if len(keep) < end - begin else table
                parts.append((begin, begin + keep, taken))
            budget += (_EARN - 1) * (end - begin)  # the call has been paid for
        elif isinstance(result, int):
            budget -= result + 1  # Arrow stopped at the record it names
            named = begin + result
            pending += [(a, b) for a, b in ((begin, named), (named + 1, end)) if b > a]
        else:
            budget -= end - begin
            # The records holding the token (if any) go slow; the rest is cut in up to eight pieces (as
            # many as calls are worth), so that the next refusal without a name costs only its piece.
            held = set((begin + np.flatnonzero(result)).tolist()) if result is not None else set()
            pieces = min(8, max(1 if held else 2, (end - begin) // (8 * _CALL_COST)), end - begin)
            cuts = {*np.linspace(begin, end, pieces + 1).astype(int).tolist(), *held}
            cuts |= {h + 1 for h in held}
            runs = [(a, b) for a, b in itertools.pairwise(sorted(cuts)) if b > a and a not in held]
            if runs != [(begin, end)]:
                pending += runs
    if not parts:
        return rows[:0], None
    parts.sort(key=lambda part: part[0])
    kept = np.concatenate([positions for _, positions, _ in parts])
    tables = [_expected_columns(table, schema) for _, _, table in parts]
    return rows[kept], pa.concat_tables(tables) if len(tables) > 1 else tables[0]


def _expected_columns(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """The table with only the schema's columns, and of a struct column only the expected keys."""
    columns = []
    for field in schema:
        column = table.column(field.name)
        if pa.types.is_struct(field.type) and column.type.num_fields != field.type.num_fields:
            column = pa.chunked_array(
                [
                    pa.StructArray.from_arrays(
                        [chunk.field(key.name) for key in field.type],
                        names=[key.name for key in field.type],
                        mask=pc.invert(chunk.is_valid()),
                    )
                    for chunk in column.chunks
                ],
                type=_nullable(field.type),
            )
        columns.append(column)
    return pa.Table.from_arrays(columns, names=schema.names)


# --- Value checks -------------------------------------------------------------------------------------

#: An integer token -0 (pydantic reads the integer 0, so a float field gets 0.0; Arrow gives -0.0).
_NEGATIVE_ZERO_INT = re.compile(rb"-0(?![0-9.eE])")
#: An integer token beyond int64 (pydantic converts such an integer to float itself).
_HUGE_INT = re.compile(rb"(?<![0-9.eE])[0-9]{19,}(?![0-9.eE])")
_FLOAT_LIMIT = 2.0**63
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"')


def _tokens(raw: bytes) -> bytes:
    """A (valid) JSON record with its strings emptied: what is left are keys' quotes and value tokens."""
    return _STRING.sub(b'""', raw)


class _Raw:
    """The raw bytes of the parsed records, for the few rows whose value needs a second look."""

    def __init__(self, data: npt.NDArray[np.uint8], offsets: Index, rows: Index) -> None:
        self.data, self.offsets, self.rows = data, offsets, rows

    def __getitem__(self, i: int) -> bytes:
        row = self.rows[i]
        return self.data[self.offsets[row] : self.offsets[row + 1]].tobytes()

    def where(self, mask: Mask, test: Callable[[bytes], bool]) -> Mask:
        """``mask``, narrowed to the rows whose raw bytes pass ``test`` (it is rarely set)."""
        out = mask.copy()
        for i in np.flatnonzero(mask):
            out[i] = test(self[int(i)])
        return out


def _compare(values: np.ndarray, op: str, bound: int | float, kind: str) -> Mask:
    if kind == "int" and isinstance(bound, int) and not _INT64_MIN <= bound <= _INT64_MAX:
        # Every int64 is below a bound above int64, above one below it.
        above = bound > _INT64_MAX
        return np.full(len(values), (op in ("le", "lt")) == above, dtype=bool)
    limit: Any = np.int64(bound) if kind == "int" else float(bound)
    result: Mask = {"ge": np.greater_equal, "gt": np.greater, "le": np.less_equal, "lt": np.less}[op](
        values, limit
    )
    return result


def _float_bad(values: npt.NDArray[np.float64], scalar: _Scalar, raw: _Raw) -> Mask:
    """Floats Arrow may have read differently from pydantic, or that the field does not take."""
    negative = np.signbit(values)
    huge = np.isfinite(values) & (np.abs(values) >= _FLOAT_LIMIT)
    bad = raw.where(huge, lambda r: _HUGE_INT.search(_tokens(r)) is not None)
    bad |= raw.where((values == 0) & negative, lambda r: _NEGATIVE_ZERO_INT.search(_tokens(r)) is not None)
    if scalar.allow_inf_nan and scalar.choices is None:
        bad |= np.isnan(values) & negative
        bad |= raw.where(
            np.isinf(values), lambda r: _tokens(r).count(b"Inf") != _tokens(r).count(b"Infinity")
        )
    else:
        bad |= ~np.isfinite(values)
    return bad


def _check_scalar(column: pa.Array, scalar: _Scalar, null_ok: bool, raw: _Raw) -> tuple[pa.Array, Mask]:
    """The rows of one column pydantic might judge differently; ``null_ok``: None is the answer for null."""
    valid = column.is_valid().to_numpy(zero_copy_only=False)
    bad = ~valid if not null_ok else np.zeros(len(column), dtype=bool)
    if scalar.kind in ("int", "float"):
        values = column.fill_null(0).to_numpy(zero_copy_only=False)
        if scalar.kind == "float":
            bad |= valid & _float_bad(values, scalar, raw)
        for op, bound in scalar.bounds:
            bad |= valid & ~_compare(values, op, bound, scalar.kind)
        if scalar.choices is not None:
            bad |= valid & ~np.isin(values, np.asarray(scalar.choices))
        return column, bad
    if scalar.choices is not None:
        bad |= valid & ~pc.is_in(column, pa.array(scalar.choices, column.type)).to_numpy(zero_copy_only=False)
    if scalar.kind == "str":
        bad |= valid & _invalid_utf8(column)
    if scalar.strings is not None:
        distinct = pc.unique(column.filter(pa.array(valid & ~bad)))
        try:
            scalar.strings.validate_python(distinct.to_pylist())
        except ValidationError as error:
            failed = sorted({e["loc"][0] for e in error.errors(include_url=False) if e["loc"]})
            failed_values = distinct.take(pa.array(failed, pa.int64()))
            bad |= valid & pc.is_in(column, failed_values).to_numpy(zero_copy_only=False)
    return column, bad


def _invalid_utf8(column: pa.Array) -> Mask:
    """Rows of a string column whose bytes are not UTF-8 (pydantic rejects them; Arrow does not check)."""
    bad = np.zeros(len(column), dtype=bool)
    if pc.all(pc.string_is_ascii(column)).as_py() is not False:
        return bad
    try:
        column.validate(full=True)
    except pa.ArrowInvalid:
        for i, value in enumerate(column.cast(pa.binary()).to_pylist()):
            try:
                if value is not None:
                    value.decode("utf-8")
            except UnicodeDecodeError:
                bad[i] = True
    return bad


def _check(table: pa.Table, plan: _Plan, raw: _Raw, schema: pa.Schema) -> tuple[list[pa.Array], Mask]:
    """The output columns of a parsed block and the rows that must go slow."""
    bad = np.zeros(table.num_rows, dtype=bool)
    columns = []
    for f, field in enumerate(plan.fields):
        column = table.column(field.name).combine_chunks()
        if field.is_dict:
            # Every expected key present and not null (a null child is a missing key or a null value);
            # keys Arrow found besides them were sent slow when it parsed them.
            valid = column.is_valid()
            bad |= ~valid.to_numpy(zero_copy_only=False)
            children = []
            for key in schema.field(f).type:
                child, child_bad = _check_scalar(column.field(key.name), field.scalar, False, raw)
                children.append(child)
                bad |= child_bad
            column = pa.StructArray.from_arrays(
                children, fields=list(schema.field(f).type), mask=pc.invert(valid)
            )
        else:
            # A null is the answer only if absent and null both give None.
            null_ok = field.scalar.nullable and field.default is None and not field.required
            column, field_bad = _check_scalar(column, field.scalar, null_ok, raw)
            bad |= field_bad
        columns.append(column)
    return columns, bad


# --- Entry point --------------------------------------------------------------------------------------


def _as_binary(values: Sequence[bytes | None] | pa.Array | pa.ChunkedArray) -> pa.Array:
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks() if values.num_chunks else pa.array([], values.type)
    if isinstance(values, pa.Array):
        if not (pa.types.is_binary(values.type) or pa.types.is_large_binary(values.type)):
            raise TypeError(f"validate_many takes binary values, not {values.type}")
        return values
    return pa.array(values, type=pa.binary())


def _buffers(array: pa.Array) -> tuple[npt.NDArray[np.uint8], Index]:
    """The bytes of all values and the offsets of each (from 0), without copying."""
    n = len(array)
    if not n:
        return np.zeros(0, dtype=np.uint8), np.zeros(1, dtype=np.int64)
    offset_buffer, data_buffer = array.buffers()[1:3]
    offset_type = np.int64 if pa.types.is_large_binary(array.type) else np.int32
    offsets = np.frombuffer(offset_buffer, dtype=offset_type)[array.offset : array.offset + n + 1]
    offsets = offsets.astype(np.int64)
    data = np.zeros(0, dtype=np.uint8)
    if data_buffer is not None:
        data = np.frombuffer(data_buffer, dtype=np.uint8)[offsets[0] : offsets[-1]]
    return data, offsets - offsets[0]


def validate_many(
    model: type[BaseModel],
    values: Sequence[bytes | None] | pa.BinaryArray,
    max_bytes: int,
    dict_keys: Mapping[str, Sequence[str]] | None = None,
) -> Validated:
    """Validate many raw JSON records of ``model`` at once; what it cannot decide is left to ``parse_event``.

    Args:
        model: The pydantic model, as given to ``parse_event``.
        values: The raw record values (None for a record without a value), a sequence or a binary
            Arrow array.
        max_bytes: The size limit of ``parse_event``; larger records go slow (they are dead letters).
        dict_keys: For each ``dict[str, X]`` field, the keys its records are expected to have; records
            whose dict has exactly these keys can be accepted, the others go slow.

    Returns:
        The accepted records as an Arrow table (one column per field, ``dict`` fields as structs with
        the keys in ``dict_keys`` order), their input indexes, and the indexes left to ``parse_event``.

    Raises:
        UnsupportedModelError: ``model`` uses a type or constraint the fast path cannot check exactly.
        ValueError: ``dict_keys`` does not name exactly the model's dict fields, or repeats a key.
    """
    plan = _plan(model)
    dict_fields = sorted(f.name for f in plan.fields if f.is_dict)
    keys = {name: tuple(k) for name, k in (dict_keys or {}).items()}
    if sorted(keys) != dict_fields:
        raise ValueError(f"dict_keys must give the keys of the dict fields {dict_fields}, not {sorted(keys)}")
    for name, names in keys.items():
        if not names or len(set(names)) != len(names):
            raise ValueError(f"dict_keys[{name!r}] must be distinct keys, at least one")
    schema = _schema(plan, keys)
    array = _as_binary(values)
    n = len(array)
    valid = array.is_valid().to_numpy(zero_copy_only=False)
    data, offsets = _buffers(array)
    candidate = _candidates(valid, data, offsets, max_bytes)
    accepted: list[Index] = []
    parts: list[list[pa.Array]] = []
    for begin in range(0, n, _BLOCK_RECORDS):
        rows, parsed = _parse(
            array, begin + np.flatnonzero(candidate[begin : begin + _BLOCK_RECORDS]), schema
        )
        if parsed is None:
            continue
        columns, bad = _check(parsed, plan, _Raw(data, offsets, rows), schema)
        keep = np.flatnonzero(~bad)
        if len(keep):
            index = pa.array(keep)
            parts.append([c.take(index) for c in columns])
            accepted.append(rows[keep])
    positions = np.concatenate(accepted) if accepted else np.empty(0, dtype=np.int64)
    if parts:
        batches = [pa.RecordBatch.from_arrays(part, schema=schema) for part in parts]
        table = pa.Table.from_batches(batches, schema=schema).combine_chunks()
    else:
        table = schema.empty_table()
    slow = np.ones(n, dtype=bool)
    slow[positions] = False
    return Validated(table=table, positions=positions.astype(np.int64), slow=np.flatnonzero(slow))
