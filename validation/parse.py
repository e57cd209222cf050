"""Validation of one raw record against its model: the valid record, or a dead letter with a machine-readable
reason.

Errors are data: nothing here raises for bad input. The same function serves file import, the stream jobs
and the replays, so a record is judged the same wherever it enters.
"""

from __future__ import annotations

from typing import TypeVar

from pydantic import BaseModel, ValidationError

from contracts.events import (
    DeadLetter,
    Reason,
)

EventT = TypeVar("EventT", bound=BaseModel)

# Pydantic error types, by the reason they stand for; the first reason found in this order wins.
_REASON_OF_ERROR: list[tuple[Reason, frozenset[str]]] = [
    (Reason.MALFORMED_JSON, frozenset({"json_invalid", "json_type"})),
    (Reason.NOT_AN_OBJECT, frozenset({"model_type", "model_attributes_type", "dict_type"})),
    (Reason.MISSING_FIELD, frozenset({"missing"})),
    (Reason.UNEXPECTED_FIELD, frozenset({"extra_forbidden"})),
    (
        Reason.WRONG_TYPE,
        frozenset({"int_type", "float_type", "string_type", "bool_type", "int_from_float", "int_parsing"}),
    ),
]
#: Dead-letter details are cut to this many characters.
MAX_DETAIL_CHARS = 500


def reason_of(error: ValidationError) -> tuple[Reason, str]:
    """The dead-letter reason and a short human detail for a pydantic validation error."""
    errors = error.errors(include_url=False, include_input=False)
    detail = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'record'}: {e['msg']}" for e in errors)[
        :MAX_DETAIL_CHARS
    ]
    for e in errors:
        if e["loc"] == ("schema_version",) and e["type"] == "literal_error":
            return Reason.UNKNOWN_SCHEMA_VERSION, detail
    types = {e["type"] for e in errors}
    for reason, kinds in _REASON_OF_ERROR:
        if types & kinds:
            return reason, detail
    return Reason.INVALID_VALUE, detail


def parse_event(
    model: type[EventT],
    raw: bytes,
    source: str,
    max_bytes: int,
    partition: int | None = None,
    offset: int | None = None,
) -> EventT | DeadLetter:
    """Parse and validate one JSON event of ``model``; a :class:`DeadLetter` when it is not valid."""
    if len(raw) > max_bytes:
        return DeadLetter(
            raw=raw,
            source=source,
            reason=Reason.OVERSIZED,
            detail=f"{len(raw)} bytes, more than the limit of {max_bytes}",
            partition=partition,
            offset=offset,
        )
    try:
        return model.model_validate_json(raw)
    except ValidationError as error:
        reason, detail = reason_of(error)
        return DeadLetter(
            raw=raw, source=source, reason=reason, detail=detail, partition=partition, offset=offset
        )
