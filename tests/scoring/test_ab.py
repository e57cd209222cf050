"""An A/B replay judges a week on the frame `fraud train` tests on: the same transactions, days and labels,
under either known-frauds rule (one protocol, ``models.splits.evaluation_days``)."""

from __future__ import annotations

import datetime as dt

import numpy as np
import pandas as pd
import pytest

from contracts.events import TxColumns
from features.definitions import DAY_MS, EVENT_TIME_MS
from models.comparison import CARD_ID, DAY, LABEL, SCORE_A, SCORE_B, TX_ID
from models.dataset import Dataset
from models.splits import KNOWN_FRAUDS, TARGET, TEST_DAY, EvalProtocol, SplitPlan, split
from scoring.ab import evaluation_frame

C = TxColumns
PLAN = SplitPlan(dt.date(2018, 4, 20))


@pytest.mark.parametrize("rule", KNOWN_FRAUDS)
def test_the_ab_frame_of_a_test_week_is_the_training_test_frame(small_dataset: Dataset, rule: str) -> None:
    protocol = EvalProtocol(rule, 7 * DAY_MS)  # type: ignore[arg-type]
    rows = small_dataset.rows
    # Both models score every transaction from the training start on; one row it cannot score is dropped.
    pairs = rows.loc[rows[EVENT_TIME_MS] >= PLAN.train_start_ms, [C.TX_ID, C.CARD_ID, EVENT_TIME_MS]]
    scores = np.random.default_rng(0).random(len(pairs))
    pairs = pairs.assign(**{SCORE_A: scores, SCORE_B: scores[::-1]}).reset_index(drop=True)
    unscorable = pairs.index[(pairs[EVENT_TIME_MS] >= PLAN.test_start_ms)][0]
    pairs.loc[unscorable, SCORE_B] = np.nan

    frame = evaluation_frame(pairs, small_dataset.labels, PLAN.test_start_ms, PLAN.test_end_ms, protocol)
    test = split(small_dataset, PLAN, protocol).test
    test = test[test[C.TX_ID] != pairs.loc[unscorable, C.TX_ID]]
    expected = pd.DataFrame(
        {TX_ID: test[C.TX_ID], CARD_ID: test[C.CARD_ID], DAY: test[TEST_DAY], LABEL: test[TARGET]}
    ).sort_values([DAY, TX_ID], ignore_index=True)
    pd.testing.assert_frame_equal(frame[[TX_ID, CARD_ID, DAY, LABEL]], expected, check_dtype=False)
    assert frame[LABEL].sum() > 0
