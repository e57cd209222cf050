"""The path and query parameters the API's routes share: what a transaction id, a card token and a limit
may be; and how a route that answers one thing or 404 is declared."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

from fastapi import FastAPI, Path, Query
from fastapi.types import DecoratedCallable

from contracts.events import CARD_TOKEN_PATTERN

TxIdParam = Annotated[int, Path(ge=0, lt=2**63, description="Transaction id (non-negative int64).")]
CardIdParam = Annotated[str, Path(pattern=CARD_TOKEN_PATTERN, description="Card token (32 hex digits).")]
Limit = Annotated[int, Query(ge=1, le=1000, description="At most this many alerts, newest first.")]


def lookup_route(
    app: FastAPI, guarded: list[Any], path: str, model: Any, *, tag: str, missing: str
) -> Callable[[DecoratedCallable], DecoratedCallable]:
    """The decorator of a guarded GET route at ``path`` that answers one ``model``, or 404 when there is
    none (``missing``: when, for the OpenAPI description)."""
    return app.get(
        path,
        dependencies=guarded,
        response_model=model,
        tags=[tag],
        responses={404: {"description": missing}},
    )
