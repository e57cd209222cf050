"""Card tokenisation at the edge: card numbers become keyed-hash tokens before anything is stored.

A token is the first 32 hex digits of HMAC-SHA256(key, card reference). The same key gives the same token
everywhere, so Kafka records keyed by token keep a card's events in one partition; without the key a
token cannot be turned back into the card number.

A terminal id is kept as it is, unless a card number could be read in it (``contracts.privacy``: 13 to 19
digits passing the Luhn check; one random 16-digit id in ten does): then it becomes a terminal token,
``tok-`` and the same keyed hash (of the id, apart from card references), so the transaction is kept and
the terminal's transactions still share one id.
"""

from __future__ import annotations

import hashlib
import hmac

import pandas as pd

from contracts.privacy import mask_card_numbers

TOKEN_HEX_DIGITS = 32
#: What starts a terminal token (a terminal id a card number could be read in, hashed).
TERMINAL_TOKEN_PREFIX = "tok-"  # noqa: S105 - a format, not a secret


def card_token(card_ref: str, key: bytes) -> str:
    """The token of one card reference (card number or customer id)."""
    return hmac.new(key, card_ref.encode(), hashlib.sha256).hexdigest()[:TOKEN_HEX_DIGITS]


def tokenise(card_refs: pd.Series, key: bytes) -> pd.Series:
    """Tokens for a column of card references, hashing each distinct reference once."""
    as_text = card_refs.astype(str)
    uniques = as_text.unique()
    mapping = {ref: card_token(ref, key) for ref in uniques}
    return as_text.map(mapping)


def terminal_token(terminal_id: str, key: bytes) -> str:
    """The token of a terminal id: ``tok-`` and 32 hex digits of the keyed hash, apart from card tokens
    (the same digits as a card's would tell that the terminal id was that card's number)."""
    return TERMINAL_TOKEN_PREFIX + card_token(f"terminal:{terminal_id}", key)


def safe_terminal_id(terminal_id: str, key: bytes) -> str:
    """``terminal_id`` as it may be stored: itself, or its token when a card number could be read in it."""
    return terminal_id if mask_card_numbers(terminal_id) == terminal_id else terminal_token(terminal_id, key)
