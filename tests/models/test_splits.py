"""The split protocol leaks nothing and removes the cards an investigator already knows about."""

from __future__ import annotations

import datetime as dt

import numpy as np
import pandas as pd
import pytest

from contracts.events import TxColumns
from features.definitions import DAY_MS, DEFAULT_PARAMS, EVENT_TIME_MS, KNOWN_AT_MS, TX_TIME_MS
from models.dataset import Dataset, DatasetError, build_dataset
from models.splits import (
    RECENT_FRAUD_DAYS,
    TARGET,
    TEST_DAY,
    EvalProtocol,
    SplitPlan,
    fold_plans,
    latest_plan,
    split,
)

C = TxColumns
PLAN = SplitPlan(dt.date(2018, 4, 20), train_days=7, gap_days=7, test_days=7)


def _transactions(dataset: Dataset) -> pd.DataFrame:
    return dataset.rows[[C.TX_ID, C.CARD_ID, C.TERMINAL_ID, C.AMOUNT, EVENT_TIME_MS]]


def _with_labels(dataset: Dataset, labels: pd.DataFrame) -> Dataset:
    """The same transactions with other labels, features recomputed through the batch path."""
    return build_dataset(_transactions(dataset), labels, DEFAULT_PARAMS, "test")


def test_no_label_unknown_at_the_test_start_reaches_training(small_dataset: Dataset) -> None:
    """Labels known at or after the first test day's start (late confirmations of training frauds, and
    fraud labels on genuine training transactions) must change neither training features nor targets."""
    labels = small_dataset.labels
    train_tx = small_dataset.rows[
        (small_dataset.rows[EVENT_TIME_MS] >= PLAN.train_start_ms)
        & (small_dataset.rows[EVENT_TIME_MS] < PLAN.train_end_ms)
    ]
    # Half of the training period's frauds are confirmed late: only after the test period starts.
    train_frauds = labels[labels[C.TX_ID].isin(train_tx[C.TX_ID])]
    late = train_frauds[C.TX_ID].iloc[::2]
    delayed = labels.copy()
    delayed.loc[delayed[C.TX_ID].isin(late), KNOWN_AT_MS] = PLAN.test_start_ms + 3 * DAY_MS
    # And some genuine training transactions are (wrongly) flagged as frauds, from the test start on.
    genuine = train_tx[~train_tx[C.TX_ID].isin(labels[C.TX_ID])].head(50)
    bogus = pd.DataFrame(
        {
            C.TX_ID: genuine[C.TX_ID],
            C.TERMINAL_ID: genuine[C.TERMINAL_ID],
            TX_TIME_MS: genuine[EVENT_TIME_MS],
            KNOWN_AT_MS: PLAN.test_start_ms,
            C.IS_FRAUD: True,
            C.CARD_ID: genuine[C.CARD_ID],
        }
    )
    future = pd.concat([delayed, bogus], ignore_index=True)
    known_then = future[future[KNOWN_AT_MS] < PLAN.test_start_ms]

    with_future = split(_with_labels(small_dataset, future), PLAN).train
    without_future = split(_with_labels(small_dataset, known_then), PLAN).train
    pd.testing.assert_frame_equal(with_future, without_future)
    # The late-confirmed frauds are genuine for training, the bogus flags too.
    targets = with_future.set_index(C.TX_ID)[TARGET]
    assert (targets.loc[late] == 0).all()
    assert (targets.loc[genuine[C.TX_ID]] == 0).all()
    assert targets.sum() == len(train_frauds) - len(late)


def test_a_training_period_whose_frauds_are_all_known_too_late_is_refused(small_dataset: Dataset) -> None:
    """A model of no known fraud scores every transaction alike, and its budget's threshold then alerts on all
    of them: such a training period is an error, not a model."""
    labels = small_dataset.labels.copy()
    in_training = labels[TX_TIME_MS].between(PLAN.train_start_ms, PLAN.train_end_ms - 1)
    labels.loc[in_training, KNOWN_AT_MS] = PLAN.test_start_ms
    with pytest.raises(DatasetError, match="holds no fraud known before its test days"):
        split(_with_labels(small_dataset, labels), PLAN)
    labels.loc[labels.index[in_training][:1], KNOWN_AT_MS] = PLAN.test_start_ms - 1
    assert split(_with_labels(small_dataset, labels), PLAN).train[TARGET].sum() == 1


def test_training_period_and_targets(small_dataset: Dataset) -> None:
    train = split(small_dataset, PLAN).train
    times = train[EVENT_TIME_MS]
    assert times.min() >= PLAN.train_start_ms
    assert times.max() < PLAN.train_end_ms
    assert train[C.TX_ID].is_unique
    assert set(train[TARGET].unique()) <= {0, 1}
    # With labels known one delay after each fraud, every training fraud is known by the test start.
    expected = small_dataset.labels[C.TX_ID].isin(train[C.TX_ID]).sum()
    assert train[TARGET].sum() == expected > 0


def test_each_test_day_drops_the_cards_with_a_fraud_known_before_it(small_dataset: Dataset) -> None:
    """The handbook's rule: on test day i, cards with a fraud on days [train start, train end + i)."""
    result = split(small_dataset, PLAN)
    rows, labels = small_dataset.rows, small_dataset.labels
    assert sorted(result.test[TEST_DAY].unique()) == list(range(PLAN.test_days))
    total_dropped = 0
    for day in range(PLAN.test_days):
        start = PLAN.test_start_ms + day * DAY_MS
        known_cards = set(
            labels.loc[
                (labels[TX_TIME_MS] >= PLAN.train_start_ms)
                & (labels[TX_TIME_MS] < PLAN.train_end_ms + day * DAY_MS),
                C.CARD_ID,
            ]
        )
        kept = result.test[result.test[TEST_DAY] == day]
        all_of_day = rows[(rows[EVENT_TIME_MS] >= start) & (rows[EVENT_TIME_MS] < start + DAY_MS)]
        assert not set(kept[C.CARD_ID]) & known_cards
        assert len(kept) == (~all_of_day[C.CARD_ID].isin(known_cards)).sum()
        total_dropped += len(all_of_day) - len(kept)
    assert result.removed_test_rows == total_dropped > 0
    # Test targets are the eventual truth: every label, known whenever.
    assert result.test[TARGET].sum() == labels[C.TX_ID].isin(result.test[C.TX_ID]).sum()


def test_folds_and_latest_plan(small_dataset: Dataset) -> None:
    latest = latest_plan(small_dataset.last_ms, 7, 7, 7)
    assert latest.test_start + dt.timedelta(days=6) == dt.date(2018, 5, 15)  # the 45th day
    plans = fold_plans(latest, 3)
    assert [p.train_start for p in plans] == [latest.train_start - dt.timedelta(days=d) for d in (14, 7, 0)]
    with pytest.raises(DatasetError):
        split(small_dataset, latest.shifted(1))  # test period past the data
    assert np.all(np.diff([p.test_start_ms for p in plans]) == 7 * DAY_MS)


def test_the_known_frauds_rule_is_anchored_at_the_test_period_not_the_training(
    small_dataset: Dataset,
) -> None:
    """``recent`` looks back RECENT_FRAUD_DAYS from the test start whatever the training period (a test
    week's frame is the same for every model on it); ``all`` also removes cards of older known frauds."""
    long = SplitPlan(PLAN.train_start - dt.timedelta(days=14), train_days=21)
    assert long.test_start == PLAN.test_start
    handbook, longer = split(small_dataset, PLAN), split(small_dataset, long)
    assert PLAN.test_start_ms - PLAN.train_start_ms == RECENT_FRAUD_DAYS * DAY_MS
    pd.testing.assert_frame_equal(handbook.test, longer.test)

    everything = split(small_dataset, PLAN, EvalProtocol("all"))
    labels = small_dataset.labels
    old = labels[labels[TX_TIME_MS] < PLAN.train_start_ms]
    old_cards = set(old[C.CARD_ID]) - set(labels.loc[labels[TX_TIME_MS] >= PLAN.train_start_ms, C.CARD_ID])
    assert old_cards & set(handbook.test[C.CARD_ID]), (
        "the sample has cards of old frauds to tell the rules apart"
    )
    assert not old_cards & set(everything.test[C.CARD_ID])
    assert set(everything.test[C.TX_ID]) < set(handbook.test[C.TX_ID])
    assert everything.removed_test_rows > handbook.removed_test_rows


def test_test_targets_are_the_labels_known_by_the_end_plus_the_label_delay(small_dataset: Dataset) -> None:
    labels = small_dataset.labels.copy()
    test = split(small_dataset, PLAN).test
    late = test.loc[test[TARGET] == 1, C.TX_ID].iloc[:3]
    labels.loc[labels[C.TX_ID].isin(late), KNOWN_AT_MS] = PLAN.test_end_ms + 7 * DAY_MS
    relabelled = split(_with_labels(small_dataset, labels), PLAN, EvalProtocol()).test
    assert relabelled.set_index(C.TX_ID).loc[late, TARGET].tolist() == [0, 0, 0]
    waited = split(_with_labels(small_dataset, labels), PLAN, EvalProtocol(label_delay_ms=8 * DAY_MS)).test
    assert waited.set_index(C.TX_ID).loc[late, TARGET].tolist() == [1, 1, 1]
