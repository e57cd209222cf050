"""Routing of events to state keys: cards and terminals hashed into a few buckets each (few large state
calls are faster than many small ones). Stable across processes and runs: a checkpoint's state is keyed
by them."""

from __future__ import annotations

import zlib

import numpy as np
import pandas as pd


def card_hash(card_id: str) -> int:
    """The 32-bit routing hash of a card token: its first 8 hex digits (uniformly distributed); CRC-32 for
    an id that is not hex."""
    try:
        return int(card_id[:8], 16)
    except ValueError:
        return zlib.crc32(card_id.encode())


def terminal_hash(terminal_id: str) -> int:
    """The 32-bit routing hash of a terminal id (CRC-32: stable across processes and runs)."""
    return zlib.crc32(terminal_id.encode())


def card_bucket(card_id: str, buckets: int) -> int:
    """Bucket of a card token."""
    return card_hash(card_id) % buckets


def card_buckets(card_ids: pd.Series, buckets: int) -> np.ndarray:
    """Bucket of each card token (:func:`card_bucket`)."""
    mapping = {card: card_bucket(str(card), buckets) for card in card_ids.unique()}
    return card_ids.map(mapping).to_numpy(dtype=np.int32)


def terminal_buckets(terminal_ids: pd.Series, buckets: int) -> np.ndarray:
    """Bucket of each terminal id (CRC-32, stable across processes and runs)."""
    mapping = {t: terminal_hash(str(t)) % buckets for t in terminal_ids.unique()}
    return terminal_ids.map(mapping).to_numpy(dtype=np.int32)
