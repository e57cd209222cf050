"""Honest train/test splits: the handbook's protocol (Le Borgne et al., sections 3.4 and 5.2).

Train on ``train_days`` days, leave a gap of ``delay_days`` (the label delay: the training period's labels
become known during it), then test on ``test_days`` days. Training targets are the labels known before
the first test day starts, nothing later; training features only ever use labels known at their
transaction's time (``features.core``). On each test day, cards with a fraud known before that day
(a fraud from the start of the training period on, whose label was known before the day began) are
removed: an investigator would already have blocked them. Test targets are all labels, known whenever.
Several consecutive folds (each shifted back by ``test_days``) give a mean and a spread for model
selection (the handbook's prequential validation).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from contracts.events import TxColumns
from features.definitions import DAY_MS, EVENT_TIME_MS
from models.dataset import Dataset, DatasetError, cards_with_known_fraud, fraud_known

#: Target column of split frames: 1 for a fraud.
TARGET = TxColumns.IS_FRAUD
#: Test day of a test row: 0 for the first test day.
TEST_DAY = "test_day"
_EPOCH = dt.date(1970, 1, 1)


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
    delay_days: int = 7
    test_days: int = 7

    def __post_init__(self) -> None:
        if min(self.train_days, self.test_days) < 1 or self.delay_days < 0:
            raise ValueError("train and test need at least one day; the delay cannot be negative")

    @property
    def test_start(self) -> dt.date:
        return self.train_start + dt.timedelta(days=self.train_days + self.delay_days)

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


def latest_plan(last_ms: int, train_days: int, delay_days: int, test_days: int) -> SplitPlan:
    """The latest plan whose test period ends with the day of ``last_ms`` (the data's last event time)."""
    last_day = day_of(last_ms)
    start = last_day - dt.timedelta(days=train_days + delay_days + test_days - 1)
    return SplitPlan(start, train_days, delay_days, test_days)


@dataclass(frozen=True)
class Split:
    """Frames of one split: dataset rows plus ``TARGET`` (and ``TEST_DAY`` for test rows)."""

    plan: SplitPlan
    train: pd.DataFrame
    test: pd.DataFrame
    removed_test_rows: int
    removed_cards: int


def split(dataset: Dataset, plan: SplitPlan) -> Split:
    """The training and test frames of ``plan`` (see the module docstring for the protocol)."""
    rows, labels = dataset.rows, dataset.labels
    if plan.train_start_ms < day_ms(day_of(dataset.first_ms)) or plan.test_end_ms > dataset.last_ms + DAY_MS:
        raise DatasetError(
            f"the data covers {day_of(dataset.first_ms)}..{day_of(dataset.last_ms)}; "
            f"the split needs {plan.describe()}"
        )
    times = rows[EVENT_TIME_MS]
    train = rows[(times >= plan.train_start_ms) & (times < plan.train_end_ms)].copy()
    train[TARGET] = fraud_known(labels, train[TxColumns.TX_ID], before_ms=plan.test_start_ms)

    test_days = []
    removed_rows = 0
    removed_cards: set[object] = set()
    for day in range(plan.test_days):
        start = plan.test_start_ms + day * DAY_MS
        of_day = rows[(times >= start) & (times < start + DAY_MS)]
        known = cards_with_known_fraud(labels, since_tx_ms=plan.train_start_ms, before_ms=start)
        drop = of_day[TxColumns.CARD_ID].isin(known)
        removed_rows += int(drop.sum())
        removed_cards.update(of_day.loc[drop, TxColumns.CARD_ID])
        test_days.append(of_day[~drop].assign(**{TEST_DAY: day}))
    test = pd.concat(test_days, ignore_index=True)
    test[TARGET] = fraud_known(labels, test[TxColumns.TX_ID])
    for name, frame in (("training", train), ("test", test)):
        if frame.empty:
            raise DatasetError(f"the {name} period of {plan.describe()} has no transactions")
    return Split(plan, train.reset_index(drop=True), test, removed_rows, len(removed_cards))


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
