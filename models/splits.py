"""Honest train/test splits: the handbook's protocol (Le Borgne et al., sections 3.4 and 5.2).

Train on ``train_days`` days, leave a gap of ``gap_days`` (the label delay: the training period's labels
become known during it), then test on ``test_days`` days. Training targets are the labels known before
the first test day starts, nothing later; training features only ever use labels known at their
transaction's time (``features.core``). Several consecutive folds (each ``test_days`` apart) give a mean
and a spread for model selection (the handbook's prequential validation).

The test days follow one protocol, ``evaluation_days``, which `fraud train` and `fraud ab run` both use, so a
model measured on a week by either gives the same figures: on each test day, the cards with a fraud known
before that day are removed (an investigator would already have blocked them), where "known" follows a
``KnownFrauds`` rule (the handbook's ``recent``, the default, or ``all``); a test row's target is whether
a fraud label for it was known by the end of the test period plus the label delay.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, replace
from typing import Literal, get_args

import numpy as np
import pandas as pd

from contracts.events import TxColumns
from features.definitions import DAY_MS, EVENT_TIME_MS, KNOWN_AT_MS, TX_TIME_MS
from models.dataset import Dataset, DatasetError, fraud_known

#: Target column of split frames: 1 for a fraud.
TARGET = TxColumns.IS_FRAUD
#: Test day of a test row: 0 for the first test day.
TEST_DAY = "test_day"
_EPOCH = dt.date(1970, 1, 1)

#: Which known frauds take a card out of a test day: ``recent``, frauds on transactions of the
#: ``RECENT_FRAUD_DAYS`` days before the test period or since (the handbook's protocol: its training week
#: and label delay); ``all``, every fraud of the history. Either way, only frauds whose label was known
#: before the day began.
KnownFrauds = Literal["recent", "all"]
KNOWN_FRAUDS: tuple[str, ...] = get_args(KnownFrauds)
DEFAULT_KNOWN_FRAUDS: KnownFrauds = "recent"
#: The handbook's look-back of known frauds: its 7 training days and 7 days of label delay. Fixed (not the
#: training period of a model), so a test week's frame is the same for every model measured on it.
RECENT_FRAUD_DAYS = 14
#: Labels count for a test row when known by the end of the test period plus this (the label delay).
DEFAULT_LABEL_DELAY_MS = 7 * DAY_MS


@dataclass(frozen=True)
class EvalProtocol:
    """How test days are judged: which known frauds remove a card, and how late a label may come."""

    known_frauds: KnownFrauds = DEFAULT_KNOWN_FRAUDS
    label_delay_ms: int = DEFAULT_LABEL_DELAY_MS

    def __post_init__(self) -> None:
        if self.known_frauds not in KNOWN_FRAUDS:
            raise ValueError(f"known frauds: one of {', '.join(KNOWN_FRAUDS)}, not {self.known_frauds!r}")

    def frauds_since_ms(self, test_start_ms: int) -> int | None:
        """Earliest transaction time whose known fraud removes a card (None: any)."""
        return test_start_ms - RECENT_FRAUD_DAYS * DAY_MS if self.known_frauds == "recent" else None


#: The protocol of both commands unless an option says otherwise.
DEFAULT_PROTOCOL = EvalProtocol()


@dataclass(frozen=True)
class EvalDays:
    """Test rows after the protocol: ``rows`` with a day column and ``TARGET``; what was removed."""

    rows: pd.DataFrame
    removed_rows: int
    removed_cards: int


def cards_with_known_fraud(labels: pd.DataFrame, since_tx_ms: int | None, before_ms: int) -> set[object]:
    """Cards with a fraud on a transaction at or after ``since_tx_ms`` (None: any) whose label was known
    before ``before_ms``."""
    recent = labels if since_tx_ms is None else labels[labels[TX_TIME_MS] >= since_tx_ms]
    fraud = fraud_known(recent, recent[TxColumns.TX_ID], before_ms).astype(bool)
    return set(recent.loc[fraud, TxColumns.CARD_ID])


def evaluation_days(
    rows: pd.DataFrame,
    labels: pd.DataFrame,
    start_ms: int,
    end_ms: int,
    protocol: EvalProtocol,
    day_column: str = TEST_DAY,
) -> EvalDays:
    """The test rows of [start_ms, end_ms) under ``protocol``, the one rule of training and A/B replays.

    Args:
        rows: one row per transaction, with ``card_id``, ``tx_id`` and ``event_time_ms``.
        labels: the label table (``models.dataset.LABEL_TABLE_COLUMNS``).
        start_ms: start of the first test day; days count from it.
        end_ms: end (exclusive) of the test period.
        protocol: the known-frauds rule and the label delay.
        day_column: name of the day column added (0 for the first test day).
    """
    times = rows[EVENT_TIME_MS]
    in_period = rows[(times >= start_ms) & (times < end_ms)]
    days = (in_period[EVENT_TIME_MS] - start_ms) // DAY_MS
    since = protocol.frauds_since_ms(start_ms)
    kept = []
    removed_rows = 0
    removed_cards: set[object] = set()
    for day in range(int(-(-(end_ms - start_ms) // DAY_MS))):
        of_day = in_period[days == day]
        known = cards_with_known_fraud(labels, since, before_ms=start_ms + day * DAY_MS)
        drop = of_day[TxColumns.CARD_ID].isin(known)
        removed_rows += int(drop.sum())
        removed_cards.update(of_day.loc[drop, TxColumns.CARD_ID])
        kept.append(of_day[~drop].assign(**{day_column: day}))
    frame = pd.concat(kept, ignore_index=True)
    by_end = labels[labels[KNOWN_AT_MS] < end_ms + protocol.label_delay_ms]
    frame[TARGET] = fraud_known(by_end, frame[TxColumns.TX_ID])
    return EvalDays(frame, removed_rows, len(removed_cards))


def day_ms(day: dt.date) -> int:
    """UTC milliseconds of a day's start."""
    return (day - _EPOCH).days * DAY_MS


def day_of(ms: int) -> dt.date:
    """The UTC day of an event time."""
    return _EPOCH + dt.timedelta(days=ms // DAY_MS)


@dataclass(frozen=True)
class SplitPlan:
    """Training period, label-delay gap and test days, in whole UTC days."""

    train_start: dt.date
    train_days: int = 7
    gap_days: int = 7
    test_days: int = 7

    def __post_init__(self) -> None:
        if min(self.train_days, self.test_days) < 1 or self.gap_days < 0:
            raise ValueError("train and test need at least one day; the delay cannot be negative")

    @property
    def test_start(self) -> dt.date:
        return self.train_start + dt.timedelta(days=self.train_days + self.gap_days)

    @property
    def train_start_ms(self) -> int:
        return day_ms(self.train_start)

    @property
    def train_end_ms(self) -> int:
        """End (exclusive) of the training period."""
        return self.train_start_ms + self.train_days * DAY_MS

    @property
    def test_start_ms(self) -> int:
        return day_ms(self.test_start)

    @property
    def test_end_ms(self) -> int:
        """End (exclusive) of the test period."""
        return self.test_start_ms + self.test_days * DAY_MS

    def shifted(self, days: int) -> SplitPlan:
        return replace(self, train_start=self.train_start + dt.timedelta(days=days))

    def describe(self) -> str:
        last_train = self.train_start + dt.timedelta(days=self.train_days - 1)
        last_test = self.test_start + dt.timedelta(days=self.test_days - 1)
        return f"train {self.train_start}..{last_train}, test {self.test_start}..{last_test}"


def fold_plans(latest: SplitPlan, folds: int) -> list[SplitPlan]:
    """``folds`` consecutive plans ending with ``latest``, each ``test_days`` earlier than the next."""
    if folds < 1:
        raise ValueError("at least one fold")
    return [latest.shifted(-(folds - 1 - i) * latest.test_days) for i in range(folds)]


def latest_plan(last_ms: int, train_days: int, gap_days: int, test_days: int) -> SplitPlan:
    """The latest plan whose test period ends with the day of ``last_ms`` (the data's last event time)."""
    last_day = day_of(last_ms)
    start = last_day - dt.timedelta(days=train_days + gap_days + test_days - 1)
    return SplitPlan(start, train_days, gap_days, test_days)


@dataclass(frozen=True)
class Split:
    """Frames of one split: dataset rows plus ``TARGET`` (and ``TEST_DAY`` for test rows)."""

    plan: SplitPlan
    train: pd.DataFrame
    test: pd.DataFrame
    removed_test_rows: int
    removed_cards: int


def split(dataset: Dataset, plan: SplitPlan, protocol: EvalProtocol | None = None) -> Split:
    """The training and test frames of ``plan``, its test days under ``protocol`` (default: the default
    ``EvalProtocol``); see the module docstring."""
    rows, labels = dataset.rows, dataset.labels
    if plan.train_start_ms < day_ms(day_of(dataset.first_ms)) or plan.test_end_ms > dataset.last_ms + DAY_MS:
        raise DatasetError(
            f"the data covers {day_of(dataset.first_ms)}..{day_of(dataset.last_ms)}; "
            f"the split needs {plan.describe()}"
        )
    times = rows[EVENT_TIME_MS]
    train = rows[(times >= plan.train_start_ms) & (times < plan.train_end_ms)].copy()
    train[TARGET] = fraud_known(labels, train[TxColumns.TX_ID], before_ms=plan.test_start_ms)

    tested = evaluation_days(rows, labels, plan.test_start_ms, plan.test_end_ms, protocol or DEFAULT_PROTOCOL)
    for name, frame in (("training", train), ("test", tested.rows)):
        if frame.empty:
            raise DatasetError(f"the {name} period of {plan.describe()} has no transactions")
    if not train[TARGET].any():
        raise DatasetError(
            f"the training period of {plan.describe()} holds no fraud known before its test days: a model "
            "learns nothing from it (labels come late); train on more days of data"
        )
    return Split(plan, train.reset_index(drop=True), tested.rows, tested.removed_rows, tested.removed_cards)


def split_counts(result: Split) -> dict[str, int]:
    """Row and fraud counts of a split, for logs and summaries."""
    return {
        "train_rows": len(result.train),
        "train_frauds": int(np.sum(result.train[TARGET])),
        "test_rows": len(result.test),
        "test_frauds": int(np.sum(result.test[TARGET])),
        "test_rows_removed": result.removed_test_rows,
        "test_cards_removed": result.removed_cards,
    }
