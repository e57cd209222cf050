"""Columnar validation of raw event bytes: many records at once, judged exactly as ``parse_event`` does.

``validate_many`` is a fast path in front of :func:`ingest.validation.parse_event`. It accepts a record
only when pydantic would accept it with exactly the same values; every other record is handed back as
*slow*, for the caller to run ``parse_event`` on (which then gives the dead-letter reason). It never
rejects a record itself, so the dead letters and their reasons stay pydantic's.

How a batch is judged:

1. Records that are None, empty, larger than ``max_bytes`` or contain a newline go slow, and so do
   those whose first and last non-blank bytes are not ``{`` and ``}``.
2. ``pyarrow.json`` parses the rest, newline-joined, against a schema derived from the model, with
   unexpected fields refused. Arrow is what checks the JSON syntax and converts the values, and it is as
   strict as pydantic's strict mode about token kinds: an int column refuses ``1.0``, ``"1"`` and
   ``true``, a bool column refuses ``1``, a string column refuses numbers; it refuses repeated keys
   (pydantic keeps the last one) and unknown keys, also nested and null-valued ones. The row count must
   equal the record count, so that each line gave exactly one object.
3. If Arrow refuses the batch, a vectorised byte scan (numpy) finds the records it would refuse (token
   kinds per field, unknown or repeated keys, shape) and the rest is parsed again; a block Arrow still
   refuses is halved until the refused records are isolated. The scan only ever sends records slow;
   correctness does not rest on it.
4. Where Arrow accepts more than pydantic, the value decides: a string column must be valid UTF-8
   (Arrow does not check); a ``-0.0`` float goes slow if the record has an integer token ``-0`` (which
   pydantic reads as 0.0); an infinite float only passes if every ``Inf`` in the record is an
   ``Infinity`` (Arrow also reads ``Inf``); a NaN only if positive (Arrow also reads ``-NaN``); a float of
   2**63 or more goes slow if the record has an integer token of 19 digits or more (pydantic converts
   an integer beyond int64 to float itself).
   A null passes only for an optional field whose default is None (else it was absent or null, and
   they differ).
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
import re
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Union

import annotated_types as at
import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj
from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError
from pydantic.fields import FieldInfo
from pydantic.types import AllowInfNan, Strict

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


class UnsupportedModelError(TypeError):
    """The model uses a feature the columnar fast path cannot reproduce exactly."""


# --- The plan: what the model accepts, derived from its metadata -----------------------------------------

_INT64_MIN = -(2**63)
_INT64_MAX = 2**63 - 1

# Token kinds of a member's value, as the byte scan classifies them.
_ABSENT, _NULL, _STR, _BOOL, _INT, _FLOAT, _NONFINITE, _OBJECT, _OTHER = range(-1, 8)
_N_KINDS = 8

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

    def allowed_kinds(self) -> Mask:
        """Which token kinds the field accepts as they are (strict and lax mode agree on these)."""
        kinds = {"int": [_INT], "float": [_INT, _FLOAT], "str": [_STR], "bool": [_BOOL]}[self.kind]
        if self.kind == "float" and self.allow_inf_nan and self.choices is None:
            kinds.append(_NONFINITE)
        if self.nullable:
            kinds.append(_NULL)
        allowed = np.zeros(_N_KINDS, dtype=bool)
        allowed[kinds] = True
        return allowed


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


# --- The byte scan ------------------------------------------------------------------------------------

# Byte classes the scan looks at (every other byte is 0).
_QUOTE, _BACKSLASH, _COLON, _COMMA, _OPEN, _CLOSE, _BRACKET, _NEWLINE, _HIGH = range(1, 10)
_CLASS = np.zeros(256, dtype=np.uint8)
for _byte, _code in [
    (b'"', _QUOTE),
    (b"\\", _BACKSLASH),
    (b":", _COLON),
    (b",", _COMMA),
    (b"{", _OPEN),
    (b"}", _CLOSE),
    (b"[", _BRACKET),
    (b"]", _BRACKET),
    (b"\n", _NEWLINE),
]:
    _CLASS[_byte[0]] = _code
_CLASS[0x80:] = _HIGH
_WHITESPACE = np.zeros(256, dtype=bool)
_WHITESPACE[list(b" \t\r\n")] = True
_NUMBER_CHAR = np.zeros(256, dtype=bool)
_NUMBER_CHAR[list(b"0123456789+-.eE")] = True
_FIRST_KIND = np.full(256, _OTHER, dtype=np.int8)
_FIRST_KIND[ord('"')] = _STR
_FIRST_KIND[ord("t")] = _BOOL
_FIRST_KIND[ord("f")] = _BOOL
_FIRST_KIND[ord("n")] = _NULL
_FIRST_KIND[ord("{")] = _OBJECT
_FIRST_KIND[list(b"-0123456789")] = _INT  # refined by _number_kinds
#: The non-finite tokens jiter reads (Arrow also takes -NaN, Inf, -Inf, which pydantic rejects).
_NONFINITE_TOKENS = (b"NaN", b"Infinity", b"-Infinity")
_NAME_CHAR = np.zeros(256, dtype=bool)
_NAME_CHAR[list(b"0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_")] = True
_NUMBER_WINDOW = 33  # a longer number token is left to the slow path
_MAX_INT_DIGITS = 19  # longer integers cannot be int64
_MAX_EXPONENT_DIGITS = 3
#: With at most 32 characters and this exponent a float cannot overflow, which Arrow refuses (pydantic
#: gives inf); underflow to subnormals or zero is rounded the same by both.
_MAX_EXPONENT = 275
_MAX_SKIP = 64  # whitespace runs and backslash runs longer than this go slow


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


def _window(data: npt.NDArray[np.uint8], starts: Index, width: int) -> npt.NDArray[np.uint8]:
    """The ``width`` bytes from each start (zeros past the end of the data)."""
    padded = np.concatenate([data, np.zeros(width, dtype=np.uint8)])
    window: npt.NDArray[np.uint8] = np.lib.stride_tricks.sliding_window_view(padded, width)[starts]
    return window


def _lookup(
    data: npt.NDArray[np.uint8], starts: Index, lengths: Index, names: Sequence[str]
) -> npt.NDArray[np.int64]:
    """Index in ``names`` of each raw key ``data[start:start+length]``, -1 when it is none of them."""
    if not names:
        return np.full(len(starts), -1, dtype=np.int64)
    encoded = [n.encode() for n in names]
    width = max([1, *map(len, encoded)])
    order = sorted(range(len(names)), key=lambda i: encoded[i])
    table = np.array([encoded[i] for i in order], dtype=f"S{width}")
    table_lengths = np.array([len(encoded[i]) for i in order], dtype=np.int64)
    window = _window(data, starts, width)
    window[np.arange(width) >= lengths[:, None]] = 0
    keys = np.ascontiguousarray(window).view(f"S{width}").ravel()
    found = np.minimum(np.searchsorted(table, keys), len(table) - 1)
    match = (table[found] == keys) & (table_lengths[found] == lengths)
    return np.where(match, np.asarray(order, dtype=np.int64)[found], -1)


def _number_kinds(data: npt.NDArray[np.uint8], starts: Index) -> npt.NDArray[np.int8]:
    """_INT, _FLOAT, _NONFINITE or _OTHER for values starting with '-', a digit, 'N' or 'I'."""
    count = len(starts)
    window = _window(data, starts, _NUMBER_WINDOW)
    kinds = np.full(count, _OTHER, dtype=np.int8)
    numeric = _NUMBER_CHAR[window]
    length = np.where(numeric.all(axis=1), _NUMBER_WINDOW, numeric.argmin(axis=1))
    in_token = np.arange(_NUMBER_WINDOW) < length[:, None]
    dot = ((window == ord(".")) & in_token).any(axis=1)
    is_e = ((window == ord("e")) | (window == ord("E"))) & in_token
    has_e = is_e.any(axis=1)
    # The exponent's value from its (at most three) digits after an optional sign.
    after_e = np.where(has_e, is_e.argmax(axis=1) + 1, length)
    sign_byte = window[np.arange(count), np.minimum(after_e, _NUMBER_WINDOW - 1)]
    signed = (after_e < length) & ((sign_byte == ord("+")) | (sign_byte == ord("-")))
    negative = signed & (sign_byte == ord("-"))
    first_digit = after_e + signed
    exponent_digits = length - first_digit
    exponent = np.zeros(count, dtype=np.int64)
    for k in range(_MAX_EXPONENT_DIGITS):
        column = np.minimum(first_digit + k, _NUMBER_WINDOW - 1)
        more = k < exponent_digits
        exponent = np.where(
            more, exponent * 10 + window[np.arange(count), column].astype(np.int64) - 48, exponent
        )
    exponent = np.where(negative, -exponent, exponent)
    exponent_ok = ~has_e | ((exponent_digits >= 1) & (exponent_digits <= _MAX_EXPONENT_DIGITS))
    exponent_ok &= exponent <= _MAX_EXPONENT
    digit = np.isin(window[:, :2], list(b"0123456789"))
    starts_like_number = ((window[:, 0] == ord("-")) & digit[:, 1]) | digit[:, 0]
    fits = starts_like_number & (length < _NUMBER_WINDOW)
    digits = length - (window[:, 0] == ord("-"))
    kinds[fits & ~dot & ~has_e & (digits <= _MAX_INT_DIGITS)] = _INT
    kinds[fits & (dot | has_e) & exponent_ok] = _FLOAT
    for token in _NONFINITE_TOKENS:
        size = len(token)
        exact = (window[:, :size] == np.frombuffer(token, dtype=np.uint8)).all(axis=1)
        kinds[exact & ~_NAME_CHAR[window[:, size]]] = _NONFINITE
    return kinds


def _scan(
    data: npt.NDArray[np.uint8],
    offsets: Index,
    plan: _Plan,
    dict_keys: Mapping[str, Sequence[str]],
) -> Mask:
    """The records Arrow would refuse or pydantic would judge differently, from their bytes alone.

    Per record: one object from the first to the last non-blank byte, balanced quotes and braces, no
    arrays, each key a field (or an expected key of a dict field), no key twice, every required field
    there, and each value's token kind one the field takes as it is.
    """
    n = len(offsets) - 1
    starts, ends = offsets[:-1], offsets[1:]
    fields = plan.fields
    n_fields = len(fields)
    bad = ends <= starts
    kinds = np.full((n, n_fields), _ABSENT, dtype=np.int8)
    dict_kinds = {
        f: np.full((n, len(dict_keys[field.name])), _ABSENT, dtype=np.int8)
        for f, field in enumerate(fields)
        if field.is_dict
    }
    if not n:
        return bad

    # Every byte of interest, its class and its row.
    codes = _CLASS[data]
    positions = np.flatnonzero(codes)
    classes = codes[positions]
    del codes
    bounds = np.searchsorted(positions, offsets)
    row = np.repeat(np.arange(n), np.diff(bounds))
    bad[row[(classes == _NEWLINE)]] = True

    # Quotes escaped by an odd run of backslashes are string content.
    quote = classes == _QUOTE
    quote_at = np.flatnonzero(quote)
    candidate = quote_at[
        (positions[quote_at] > starts[row[quote_at]]) & (data[positions[quote_at] - 1] == 92)
    ]
    escaped = np.zeros(len(candidate), dtype=bool)
    active = np.arange(len(candidate))
    for run in range(1, _MAX_SKIP + 2):
        if not len(active):
            break
        before = positions[candidate[active]] - run
        continues = (before >= starts[row[candidate[active]]]) & (data[np.maximum(before, 0)] == 92)
        stopped = active[~continues]
        escaped[stopped] = run % 2 == 0
        active = active[continues]
    bad[row[candidate[active]]] = True
    quote[candidate[escaped]] = False

    # Inside a string: an odd number of (unescaped) quotes before it in its row.
    quotes_through = np.cumsum(quote, dtype=np.int64)
    row_base = np.where(bounds[:-1] > 0, quotes_through[np.maximum(bounds[:-1] - 1, 0)], 0)
    quotes_before = quotes_through - quote - row_base[row]
    row_quotes = np.where(bounds[1:] > 0, quotes_through[np.maximum(bounds[1:] - 1, 0)], 0) - row_base
    bad |= (row_quotes % 2).astype(bool)
    outside = ((quotes_before % 2) == 0) & ~quote
    bad[row[outside & ((classes == _BACKSLASH) | (classes == _BRACKET))]] = True

    # Structure outside strings: one object from the first to the last non-blank byte, depth <= 2.
    out = np.flatnonzero(outside & (classes != _NEWLINE) & (classes != _HIGH) & (classes != _BACKSLASH))
    out_class = classes[out]
    out_row = row[out]
    out_bounds = np.searchsorted(out_row, np.arange(n + 1))
    step = (out_class == _OPEN).astype(np.int64) - (out_class == _CLOSE)
    depth_through = np.cumsum(step)
    depth_base = np.where(out_bounds[:-1] > 0, depth_through[np.maximum(out_bounds[:-1] - 1, 0)], 0)
    depth = depth_through - depth_base[out_row]
    empty_row = out_bounds[1:] == out_bounds[:-1]
    bad |= empty_row
    first = np.minimum(out_bounds[:-1], len(out) - 1)
    last = np.maximum(out_bounds[1:] - 1, 0)
    first_byte, first_ok = _skip(data, starts, ends, 1)
    last_byte, last_ok = _skip(data, ends - 1, starts - 1, -1)
    bad |= ~first_ok | ~last_ok
    if len(out):
        bad |= (out_class[first] != _OPEN) | (positions[out[first]] != first_byte)
        bad |= (out_class[last] != _CLOSE) | (positions[out[last]] != last_byte) | (depth[last] != 0)
        brace = (out_class == _OPEN) | (out_class == _CLOSE)
        bad |= np.bincount(out_row[brace & (depth == 0)], minlength=n) != 1
        max_depth = 2 if dict_kinds else 1
        bad[out_row[depth > max_depth]] = True
        # Commas: one fewer than the members of each non-empty object.
        opens = out_class == _OPEN
        empty_object = opens & np.append(out_class[1:] == _CLOSE, False)
        colons_per_row = np.bincount(out_row[out_class == _COLON], minlength=n)
        commas_per_row = np.bincount(out_row[out_class == _COMMA], minlength=n)
        nonempty_objects = np.bincount(out_row[opens & ~empty_object], minlength=n)
        bad |= commas_per_row != colons_per_row - nonempty_objects

    # Members: each colon outside strings, its key (the string before it) and its value's first byte.
    colon = out[out_class == _COLON]
    colon_depth = depth[out_class == _COLON]
    colon_row = row[colon]
    last_quote = np.maximum.accumulate(np.where(quote, np.arange(len(positions)), -1))
    close = last_quote[colon]
    open_ = last_quote[np.maximum(close - 1, 0)]
    key_ok = (close - 1 >= bounds[colon_row]) & (open_ >= bounds[colon_row])
    bad[colon_row[~key_ok]] = True
    key_start = positions[np.maximum(open_, 0)] + 1
    key_length = positions[np.maximum(close, 0)] - key_start
    value_start, value_ok = _skip(data, positions[colon] + 1, ends[colon_row], 1)
    bad[colon_row[~value_ok]] = True
    value_kind = _FIRST_KIND[data[np.minimum(value_start, len(data) - 1)]]
    numeric = (value_kind == _INT) | np.isin(data[np.minimum(value_start, len(data) - 1)], list(b"NI"))
    value_kind[numeric] = _number_kinds(data, value_start[numeric])

    top = colon_depth == 1
    field_index = np.full(len(colon), -1, dtype=np.int64)
    field_index[top] = _lookup(data, key_start[top], key_length[top], [f.name for f in fields])
    bad[colon_row[top & (field_index < 0)]] = True  # extra="forbid"; "ignore" leaves them to pydantic
    known = top & (field_index >= 0)
    counts = np.bincount(colon_row[known] * n_fields + field_index[known], minlength=n * n_fields)
    counts = counts.reshape(n, n_fields)
    bad |= (counts > 1).any(axis=1)
    kinds[colon_row[known], field_index[known]] = value_kind[known]
    for f, field in enumerate(fields):
        allowed = np.zeros(_N_KINDS, dtype=bool)
        if field.is_dict:
            allowed[_OBJECT] = True
        else:
            allowed = field.scalar.allowed_kinds()
        present = kinds[:, f] != _ABSENT
        bad |= present & ~allowed[np.maximum(kinds[:, f], 0)]
        if field.required:
            bad |= ~present

    # Members of dict fields: exactly the expected keys, once each, with values the value type takes.
    nested = colon_depth == 2
    if nested.any():
        top_colon = np.maximum.accumulate(np.where(top, np.arange(len(colon)), -1))
        parent_colon = top_colon[nested]
        parent = np.where(parent_colon >= 0, field_index[np.maximum(parent_colon, 0)], -1)
        parent_ok = (parent_colon >= 0) & (colon_row[np.maximum(parent_colon, 0)] == colon_row[nested])
        nested_at = np.flatnonzero(nested)
        bad[colon_row[nested_at[~parent_ok | ~np.isin(parent, list(dict_kinds))]]] = True
        for f, table in dict_kinds.items():
            names = dict_keys[fields[f].name]
            members = nested_at[parent_ok & (parent == f)]
            key = _lookup(data, key_start[members], key_length[members], names)
            member_row = colon_row[members]
            bad[member_row[key < 0]] = True
            members, member_row, key = members[key >= 0], member_row[key >= 0], key[key >= 0]
            key_counts = np.bincount(member_row * len(names) + key, minlength=n * len(names))
            bad |= (key_counts.reshape(n, len(names)) > 1).any(axis=1)
            table[member_row, key] = value_kind[members]
    for f, table in dict_kinds.items():
        allowed = fields[f].scalar.allowed_kinds()
        bad |= (kinds[:, f] == _OBJECT) & (
            (table == _ABSENT).any(axis=1) | ~allowed[np.maximum(table, 0)].all(axis=1)
        )
    return bad


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


def _read(values: pa.Array, rows: Index, schema: pa.Schema) -> pa.Table | None:
    """``values[rows]`` parsed as newline-delimited JSON, one row each; None if Arrow refuses them."""
    chosen = values if len(rows) == len(values) else values.take(pa.array(rows))
    lists = pa.LargeListArray.from_arrays(
        pa.array([0, len(rows)], pa.int64()), chosen.cast(pa.large_binary())
    )
    buffer = pc.binary_join(lists, pa.scalar(b"\n", pa.large_binary()))[0].as_buffer()
    # Absent fields come out as nulls; the checks judge them.
    parse_schema = pa.schema([pa.field(f.name, _nullable(f.type)) for f in schema])
    try:
        table = pj.read_json(
            pa.BufferReader(buffer),
            read_options=pj.ReadOptions(use_threads=False, block_size=max(buffer.size + 1, 1 << 20)),
            parse_options=pj.ParseOptions(
                explicit_schema=parse_schema,
                unexpected_field_behavior="error",
                newlines_in_values=False,
            ),
        )
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    # Each line must have given exactly one row: then row i is record rows[i].
    return table if table.num_rows == len(rows) else None


def _parse(values: pa.Array, rows: Index, schema: pa.Schema) -> list[tuple[Index, pa.Table]]:
    """Parse ``rows``; halve any block Arrow refuses until the refused records are single (left out)."""
    parsed: list[tuple[Index, pa.Table]] = []
    pending = [rows] if len(rows) else []
    while pending:
        block = pending.pop()
        table = _read(values, block, schema)
        if table is not None:
            parsed.append((block, table))
        elif len(block) > 1:
            middle = len(block) // 2
            pending += [block[middle:], block[:middle]]
    return parsed


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
            # Every expected key present and not null (a null child is a missing key or a null value).
            bad |= ~column.is_valid().to_numpy(zero_copy_only=False)
            for k in range(column.type.num_fields):
                _, child_bad = _check_scalar(column.field(k), field.scalar, False, raw)
                bad |= child_bad
        else:
            # A null is the answer only if absent and null both give None.
            null_ok = field.scalar.nullable and field.default is None and not field.required
            column, field_bad = _check_scalar(column, field.scalar, null_ok, raw)
            bad |= field_bad
        columns.append(column.cast(schema.field(f).type) if not field.is_dict else column)
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
    starts, ends = offsets[:-1], offsets[1:]
    sizes = ends - starts

    candidate = valid & (sizes > 0) & (sizes <= max_bytes)
    if len(data):
        first, first_ok = _skip(data, starts, ends, 1)
        last, last_ok = _skip(data, ends - 1, starts - 1, -1)
        candidate &= first_ok & last_ok & (first < ends) & (last >= starts)
        candidate &= (data[np.clip(first, 0, len(data) - 1)] == ord("{")) & (
            data[np.clip(last, 0, len(data) - 1)] == ord("}")
        )
        newline = np.flatnonzero(data == ord("\n"))
        candidate[np.searchsorted(offsets, newline, side="right") - 1] = False
    rows = np.flatnonzero(candidate)
    table = _read(array, rows, schema) if len(rows) else None
    if table is not None:
        parsed = [(rows, table)]
    else:
        # Some record makes Arrow refuse the batch: find them from their bytes, parse the others.
        rows = rows[~_scan(data, offsets, plan, keys)[rows]]
        parsed = _parse(array, rows, schema)

    accepted: list[Index] = []
    parts: list[list[pa.Array]] = []
    for block, block_table in sorted(parsed, key=lambda part: int(part[0][0])):
        columns, bad = _check(block_table, plan, _Raw(data, offsets, block), schema)
        keep = np.flatnonzero(~bad)
        if len(keep):
            index = pa.array(keep)
            parts.append([c.take(index) for c in columns])
            accepted.append(block[keep])
    positions = np.concatenate(accepted) if accepted else np.empty(0, dtype=np.int64)
    if parts:
        batches = [pa.RecordBatch.from_arrays(part, schema=schema) for part in parts]
        table = pa.Table.from_batches(batches, schema=schema).combine_chunks()
    else:
        table = schema.empty_table()
    slow = np.ones(n, dtype=bool)
    slow[positions] = False
    return Validated(table=table, positions=positions.astype(np.int64), slow=np.flatnonzero(slow))
