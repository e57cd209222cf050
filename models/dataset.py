"""Training data: the feature rows of every transaction and every fraud label, from a file or the log.

Both sources go through the batch path of the feature definitions (``features.core.compute_features``,
via ``features.batch`` for files), so a training row holds exactly the features the streaming job
computed for that transaction. Labels stay a separate table with the time each became known, so that a
split can use only the labels known at a given moment (``models.splits``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from contracts.errors import FraudError
from contracts.events import TxColumns
from features.batch import transactions_features
from features.core import compute_features, labels_from_fraud_flags
from features.definitions import EVENT_TIME_MS, KNOWN_AT_MS, LABEL_COLUMNS, FeatureParams
from ingest.files import _to_event_time_ms

C = TxColumns

#: Columns of ``Dataset.rows`` besides the features: who, where and when.
ROW_KEYS = (C.TX_ID, C.CARD_ID, C.TERMINAL_ID, EVENT_TIME_MS)
#: Columns of ``Dataset.labels``.
LABEL_TABLE_COLUMNS = (*LABEL_COLUMNS, C.CARD_ID)


class DatasetError(FraudError, ValueError):
    """The data cannot give a training set (empty, too short for the split, no labels)."""


@dataclass(frozen=True)
class Dataset:
    """Feature rows of transactions, and every label with the time it became known.

    Attributes:
        rows: ``ROW_KEYS``, ``amount`` and ``params.feature_columns``; one row per transaction (unique
            tx ids), sorted by (event_time_ms, tx_id).
        labels: ``LABEL_TABLE_COLUMNS``: tx_id, terminal_id, tx_time_ms, known_at_ms, is_fraud, card_id.
        source: where the data came from (a file, or topics and their time range).
        rejected: input records that failed validation and were left out.
    """

    rows: pd.DataFrame
    labels: pd.DataFrame
    source: str
    rejected: int = 0

    @property
    def first_ms(self) -> int:
        return int(self.rows[EVENT_TIME_MS].iloc[0])

    @property
    def last_ms(self) -> int:
        return int(self.rows[EVENT_TIME_MS].iloc[-1])


def history_ms(params: FeatureParams) -> int:
    """How much event time before a row its features look back (windows, and label delay for terminals)."""
    return max(params.card_history_ms, params.terminal_history_ms)


def build_dataset(
    transactions: pd.DataFrame,
    labels: pd.DataFrame,
    params: FeatureParams,
    source: str,
    rejected: int = 0,
    features: pd.DataFrame | None = None,
) -> Dataset:
    """Join the features of ``transactions`` (computed here unless given) to their keys.

    Args:
        transactions: tx_id, card_id, terminal_id, amount, event_time_ms; unique tx ids.
        labels: ``LABEL_TABLE_COLUMNS``.
        params: feature parameters.
        source: description of the data.
        rejected: records left out by validation.
        features: ``compute_features`` output for ``transactions``, when already computed.
    """
    if transactions.empty:
        raise DatasetError(f"no transactions in {source}")
    if features is None:
        features = compute_features(transactions, labels[list(LABEL_COLUMNS)], params)
    keys = transactions[[*ROW_KEYS, C.AMOUNT]]
    rows = features.merge(keys, on=C.TX_ID, how="left", validate="one_to_one")
    rows = rows[[*ROW_KEYS, C.AMOUNT, *params.feature_columns]]
    return Dataset(rows.reset_index(drop=True), labels[list(LABEL_TABLE_COLUMNS)], source, rejected)


def event_times_ms(table: pd.DataFrame) -> pd.Series:
    """Event time of each row of a canonical table in UTC ms (NaN where unreadable)."""
    return _to_event_time_ms(table[C.EVENT_TIME])


def in_range(
    times_ms: pd.Series, params: FeatureParams, since_ms: int | None, until_ms: int | None
) -> pd.Series:
    """Rows needed for the features of rows in [since_ms, until_ms): from a feature history earlier on.

    Older rows cannot change those features (windows and label delay end there), so leaving them out
    keeps long histories quick. Unreadable times (NaN) are kept, to be rejected and counted downstream.
    """
    low = -np.inf if since_ms is None else since_ms - history_ms(params)
    high = np.inf if until_ms is None else until_ms
    return times_ms.isna() | ((times_ms >= low) & (times_ms < high))


def file_dataset(
    table: pd.DataFrame,
    source: str,
    params: FeatureParams,
    max_event_bytes: int,
    since_ms: int | None = None,
    until_ms: int | None = None,
) -> Dataset:
    """A dataset from a labelled canonical table (``ingest.files.read_table``): its fraud column becomes
    labels known the label delay (``params.label_delay_ms``) after each fraud, as on ingest. Only the rows
    that matter for [since_ms, until_ms) are used (``in_range``)."""
    if C.IS_FRAUD not in table.columns:
        raise DatasetError(f"{source} has no fraud column: training needs labelled transactions")
    keep = in_range(event_times_ms(table), params, since_ms, until_ms)
    batch = transactions_features(table[keep.to_numpy()], source, params, max_event_bytes)
    labels = labels_from_fraud_flags(batch.transactions, params.label_delay_ms)
    return build_dataset(
        batch.transactions, labels, params, source, len(batch.rejected), features=batch.features
    )


def fraud_known(labels: pd.DataFrame, tx_ids: pd.Series, before_ms: int | None = None) -> np.ndarray:
    """1 for each transaction whose latest label known before ``before_ms`` (or ever, if None) says fraud."""
    known = labels if before_ms is None else labels[labels[KNOWN_AT_MS] < before_ms]
    latest = known.sort_values(KNOWN_AT_MS, kind="stable").drop_duplicates(C.TX_ID, keep="last")
    frauds = latest.loc[latest[C.IS_FRAUD].astype(bool), C.TX_ID]
    return tx_ids.isin(frauds).to_numpy(dtype=np.int64)
