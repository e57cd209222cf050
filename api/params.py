"""The path and query parameters the API's routes share: what a transaction id, a card token and a limit
may be."""

from __future__ import annotations

from typing import Annotated

from fastapi import Path, Query

from contracts.events import CARD_TOKEN_PATTERN

TxIdParam = Annotated[int, Path(ge=0, lt=2**63, description="Transaction id (non-negative int64).")]
CardIdParam = Annotated[str, Path(pattern=CARD_TOKEN_PATTERN, description="Card token (32 hex digits).")]
Limit = Annotated[int, Query(ge=1, le=1000, description="At most this many alerts, newest first.")]
