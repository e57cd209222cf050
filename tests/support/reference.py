"""A slow, obviously correct implementation of the feature definitions, and random inputs for it.

Nested Python loops straight from the definitions in ``features.definitions``: no sorting tricks, no
state, no integer cents (amount means are plain float means), labels joined to their transactions by
tx id. The fast core is checked against it.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from fractions import Fraction

import numpy as np
import pandas as pd

from contracts.events import TxColumns
from features.definitions import (
    CARD_SECS_SINCE_PREV_TX,
    DAY_MS,
    EVENT_TIME_MS,
    HOUR_MS,
    IS_NIGHT,
    IS_WEEKEND,
    KNOWN_AT_MS,
    TERMINAL_DAYS_SINCE_FIRST_FRAUD,
    TX_TIME_MS,
    UNUSUAL_AMOUNT_FACTOR,
    FeatureParams,
    card_amount_ratio_column,
    card_amount_zscore_column,
    card_avg_amount_column,
    card_nb_tx_column,
    card_nb_tx_hours_column,
    card_nb_unusual_column,
    card_prior_ratio_column,
    terminal_nb_fraud_column,
    terminal_nb_tx_column,
    terminal_risk_column,
)

#: Monday 2024-01-01 00:00 UTC.
MONDAY_MS = 1_704_067_200_000


def reference_features(
    transactions: pd.DataFrame, labels: pd.DataFrame, params: FeatureParams
) -> pd.DataFrame:
    """Features of every transaction, sorted by (event_time_ms, tx_id), the slow way."""
    txs = transactions.to_dict("records")
    first_label: dict[int, dict] = {}
    for label in sorted(
        labels.to_dict("records"), key=lambda lab: (lab[KNOWN_AT_MS], not lab[TxColumns.IS_FRAUD])
    ):
        first_label.setdefault(int(label[TxColumns.TX_ID]), label)
    delay = params.label_delay_ms
    longest = params.window_days[-1]
    rows = []
    for tx in sorted(txs, key=lambda x: (x[EVENT_TIME_MS], x[TxColumns.TX_ID])):
        t, me = tx[EVENT_TIME_MS], (tx[EVENT_TIME_MS], tx[TxColumns.TX_ID])
        row: dict[str, object] = {TxColumns.TX_ID: tx[TxColumns.TX_ID]}
        card_rows = [
            other
            for other in txs
            if other[TxColumns.CARD_ID] == tx[TxColumns.CARD_ID]
            and (other[EVENT_TIME_MS], other[TxColumns.TX_ID]) <= me
        ]
        for days in params.window_days:
            amounts = [o[TxColumns.AMOUNT] for o in card_rows if o[EVENT_TIME_MS] > t - days * DAY_MS]
            row[card_nb_tx_column(days)] = len(amounts)
            row[card_avg_amount_column(days)] = math.fsum(amounts) / len(amounts)
        hour_ms = params.short_window_hours * HOUR_MS
        row[card_nb_tx_hours_column(params.short_window_hours)] = sum(
            1 for o in card_rows if o[EVENT_TIME_MS] > t - hour_ms
        )
        earlier = [o for o in card_rows if o is not tx]
        cap_ms = longest * DAY_MS
        gap_ms = cap_ms
        if earlier:
            previous = max(earlier, key=lambda o: (o[EVENT_TIME_MS], o[TxColumns.TX_ID]))
            gap_ms = min(t - previous[EVENT_TIME_MS], cap_ms)
        row[CARD_SECS_SINCE_PREV_TX] = gap_ms / 1000
        mean = row[card_avg_amount_column(longest)]
        assert isinstance(mean, float)
        row[card_amount_ratio_column(longest)] = tx[TxColumns.AMOUNT] / mean if mean != 0 else 1.0
        for days in params.prior_window_days:
            # In exact fractions of cents: a z-score near 0 is a small difference of large amounts.
            prior = [
                Fraction(round(o[TxColumns.AMOUNT] * 100))
                for o in earlier
                if o[EVENT_TIME_MS] > t - days * DAY_MS
            ]
            cents = Fraction(round(tx[TxColumns.AMOUNT] * 100))
            prior_mean = sum(prior) / len(prior) if prior else Fraction(0)
            row[card_prior_ratio_column(days)] = float(cents / prior_mean) if prior_mean != 0 else 1.0
            variance = sum((c - prior_mean) ** 2 for c in prior) / len(prior) if prior else Fraction(0)
            zscore = float(cents - prior_mean) / math.sqrt(variance) if len(prior) > 1 and variance else 0.0
            row[card_amount_zscore_column(days)] = zscore
        days = params.unusual_window_days
        usual = [Fraction(round(o[TxColumns.AMOUNT] * 100)) for o in earlier if o[EVENT_TIME_MS] > t - cap_ms]
        row[card_nb_unusual_column(days)] = sum(
            1
            for o in earlier
            if o[EVENT_TIME_MS] > t - days * DAY_MS
            and round(o[TxColumns.AMOUNT] * 100) > UNUSUAL_AMOUNT_FACTOR * sum(usual) / len(usual)
        )
        for days in params.window_days:
            window = [
                o
                for o in txs
                if o[TxColumns.TERMINAL_ID] == tx[TxColumns.TERMINAL_ID]
                and t - (days * DAY_MS + delay) < o[EVENT_TIME_MS] <= t - delay
            ]
            frauds = 0
            first_fraud_ms = None
            for o in window:
                label = first_label.get(int(o[TxColumns.TX_ID]))
                if label is not None and label[TxColumns.IS_FRAUD] and label[KNOWN_AT_MS] <= t:
                    frauds += 1
                    first_fraud_ms = min(first_fraud_ms or t, label[TX_TIME_MS])
            row[terminal_nb_tx_column(days)] = len(window)
            row[terminal_risk_column(days)] = frauds / len(window) if window else 0.0
            row[terminal_nb_fraud_column(days)] = frauds
        span_ms = longest * DAY_MS + delay
        row[TERMINAL_DAYS_SINCE_FIRST_FRAUD] = (t - first_fraud_ms if first_fraud_ms else span_ms) / DAY_MS
        moment = datetime.fromtimestamp(t / 1000, tz=UTC)
        row[IS_WEEKEND] = int(moment.weekday() >= 5)
        row[IS_NIGHT] = int(moment.hour <= 6)
        rows.append(row)
    return pd.DataFrame(rows, columns=[TxColumns.TX_ID, *params.feature_columns])


def boundary_offsets(params: FeatureParams) -> list[int]:
    """Time offsets that land exactly on, or 1 ms beside, every window edge of ``params``."""
    edges = [0, params.short_window_ms, params.label_delay_ms]
    for length_ms in params.windows_ms:
        edges += [length_ms, length_ms + params.label_delay_ms]
    return sorted({sign * (edge + nudge) for edge in edges for nudge in (-1, 0, 1) for sign in (-1, 1)})


def random_case(
    rng: np.random.Generator,
    params: FeatureParams,
    n: int = 300,
    n_cards: int = 4,
    n_terminals: int = 3,
    span_days: int = 60,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Random transactions and labels rich in ties, window edges, duplicates and late labels.

    Returns:
        (transactions: tx_id, card_id, terminal_id, amount, event_time_ms, is_fraud; labels:
        tx_id, terminal_id, tx_time_ms, known_at_ms, is_fraud), with labels only for transactions
        of the table.
    """
    offsets = boundary_offsets(params)
    times: list[int] = []
    for _ in range(n):
        if not times or rng.random() < 0.3:
            times.append(MONDAY_MS + int(rng.integers(0, span_days * DAY_MS // 60_000)) * 60_000)
        else:
            times.append(int(rng.choice(times)) + int(rng.choice(offsets)))
    cards = rng.integers(0, n_cards, n)
    amounts = np.round(rng.gamma(2.0, 40.0, n), 2)
    amounts[rng.random(n) < 0.1] = 0.0
    amounts[cards == 0] = 0.0  # one card with only zero amounts: its mean is 0
    transactions = pd.DataFrame(
        {
            TxColumns.TX_ID: rng.permutation(n).astype(np.int64) * 7 + 3,
            TxColumns.CARD_ID: [f"card-{c}" for c in cards],
            TxColumns.TERMINAL_ID: [f"term-{t}" for t in rng.integers(0, n_terminals, n)],
            TxColumns.AMOUNT: amounts,
            EVENT_TIME_MS: np.array(times, dtype=np.int64),
            TxColumns.IS_FRAUD: rng.random(n) < 0.3,
        }
    )
    label_rows = []
    for tx in transactions.to_dict("records"):
        if not tx[TxColumns.IS_FRAUD] and rng.random() > 0.2:
            continue
        for _ in range(1 + int(rng.random() < 0.25)):  # sometimes a duplicate
            lag = int(rng.choice([0, 1, params.label_delay_ms, params.label_delay_ms + 1, *offsets]))
            label_rows.append(
                {
                    TxColumns.TX_ID: tx[TxColumns.TX_ID],
                    TxColumns.TERMINAL_ID: tx[TxColumns.TERMINAL_ID],
                    TX_TIME_MS: tx[EVENT_TIME_MS],
                    KNOWN_AT_MS: tx[EVENT_TIME_MS] + abs(lag),
                    TxColumns.IS_FRAUD: bool(rng.random() < (0.85 if tx[TxColumns.IS_FRAUD] else 0.3)),
                }
            )
    labels = pd.DataFrame(
        label_rows,
        columns=[TxColumns.TX_ID, TxColumns.TERMINAL_ID, TX_TIME_MS, KNOWN_AT_MS, TxColumns.IS_FRAUD],
    )
    return transactions, labels.astype(
        {TxColumns.TX_ID: np.int64, TX_TIME_MS: np.int64, KNOWN_AT_MS: np.int64, TxColumns.IS_FRAUD: bool}
    )
