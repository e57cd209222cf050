"""The batch reference path: the feature definitions over a file of labelled transactions.

The same ``features.core`` functions as the streaming job, called once over the whole table; rows are
accepted or rejected exactly as ``fraud ingest`` would, so a file's features here equal what the streaming
job computes after ingesting it. Training sets and parity tests use it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from contracts.events import DeadLetter, TxColumns
from features.core import compute_features, labels_from_fraud_flags
from features.definitions import EVENT_TIME_MS, FeatureParams
from ingest.files import clean_table, read_table
from ingest.produce import events_from_table

C = TxColumns


@dataclass
class BatchFeatures:
    """Features of every accepted transaction, and the rows that were rejected."""

    features: pd.DataFrame
    transactions: pd.DataFrame
    rejected: list[DeadLetter]


def transactions_features(
    table: pd.DataFrame, source: str, params: FeatureParams, max_event_bytes: int
) -> BatchFeatures:
    """Features of a canonical transaction table (simulator output or a file read with a mapping).

    Args:
        table: canonical columns (``TxColumns``), an optional ``is_fraud`` column giving the labels.
        source: where the rows come from, for rejected rows.
        params: feature windows and the label delay d: when each fraud label becomes known after its
            transaction (as on ingest), and how long before each transaction the terminal windows end.
        max_event_bytes: the size limit of one event, as on ingest.
    """
    clean = clean_table(table, source)
    # The token key does not matter here: tokens map one to one to card references.
    accepted = events_from_table(clean, source, b"batch", params.label_delay_ms, max_event_bytes)
    transactions = clean.frame.iloc[accepted.accepted].rename(columns={C.EVENT_TIME: EVENT_TIME_MS})
    transactions = transactions.reset_index(drop=True)
    labels = (
        labels_from_fraud_flags(transactions, params.label_delay_ms)
        if C.IS_FRAUD in transactions.columns
        else None
    )
    return BatchFeatures(compute_features(transactions, labels, params), transactions, accepted.dead_letters)


def file_features(
    path: Path, mapping: dict[str, str], params: FeatureParams, max_event_bytes: int
) -> BatchFeatures:
    """Features of a CSV or Parquet file of (optionally labelled) transactions."""
    return transactions_features(read_table(path, mapping), f"file:{path}", params, max_event_bytes)
