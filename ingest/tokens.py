"""Card tokenisation at the edge: card numbers become keyed-hash tokens before anything is stored.

A token is the first 32 hex digits of HMAC-SHA256(key, card reference). The same key gives the same token
everywhere, so Kafka records keyed by token keep a card's events in one partition; without the key a
token cannot be turned back into the card number.
"""

from __future__ import annotations

import hashlib
import hmac

import pandas as pd

TOKEN_HEX_DIGITS = 32


def card_token(card_ref: str, key: bytes) -> str:
    """The token of one card reference (card number or customer id)."""
    return hmac.new(key, card_ref.encode(), hashlib.sha256).hexdigest()[:TOKEN_HEX_DIGITS]


def tokenise(card_refs: pd.Series, key: bytes) -> pd.Series:
    """Tokens for a column of card references, hashing each distinct reference once."""
    as_text = card_refs.astype(str)
    uniques = as_text.unique()
    mapping = {ref: card_token(ref, key) for ref in uniques}
    return as_text.map(mapping)
