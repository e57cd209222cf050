"""The model report's choice of the default: the shallowest candidate validation cannot tell from the best."""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

import pandas as pd
import pytest

from models.estimators import ModelSpec


@pytest.fixture
def eval_models(bench_script: Callable[[str], ModuleType]) -> ModuleType:
    return bench_script("eval_models")


def validated(eval_models: ModuleType, *found: tuple[int | None, int, float, float]) -> list:
    """(candidate, metrics) pairs, best AP first, of (depth, training days, mean AP, its std)."""
    pairs = [
        (
            eval_models.Candidate(
                f"depth {depth}, {days} days", ModelSpec("hist_gradient_boosting", depth), "all", days
            ),
            {"average_precision": ap, "average_precision_std": std},
        )
        for depth, days, ap, std in found
    ]
    return sorted(pairs, key=lambda pair: -pair[1]["average_precision"])


def test_a_shallower_candidate_within_one_standard_error_of_the_best_is_chosen(
    eval_models: ModuleType,
) -> None:
    # One standard error of the best: 0.02 / sqrt(4) = 0.01, so the floor is 0.74.
    found = validated(eval_models, (None, 56, 0.75, 0.02), (8, 56, 0.745, 0.02), (3, 28, 0.741, 0.02))
    assert eval_models.choose(found).name == "depth 3, 28 days"


def test_a_shallower_candidate_past_one_standard_error_is_not(eval_models: ModuleType) -> None:
    found = validated(eval_models, (None, 56, 0.75, 0.02), (8, 56, 0.745, 0.02), (3, 28, 0.739, 0.02))
    assert eval_models.choose(found).name == "depth 8, 56 days"


def test_at_the_same_depth_the_better_one_is_chosen(eval_models: ModuleType) -> None:
    found = validated(eval_models, (None, 56, 0.75, 0.2), (5, 28, 0.70, 0.1), (5, 56, 0.72, 0.1))
    assert eval_models.choose(found).name == "depth 5, 56 days"


def test_a_terminal_fraud_counts_as_known_once_its_label_is_and_for_a_compromise_s_days(
    eval_models: ModuleType,
) -> None:
    """What the report's ceilings call knowable: a fraud of the row's terminal whose label is known by the
    row's time, from the compromise length before it."""
    day = 86_400_000
    rows = pd.DataFrame(
        {
            "terminal_id": ["7", "7", "7", "8"],
            "event_time_ms": [10 * day, 20 * day, 40 * day, 20 * day],
        }
    )
    labels = pd.DataFrame(
        {
            "tx_id": [1, 2],
            "terminal_id": ["7", "7"],
            "tx_time_ms": [5 * day, 11 * day],
            "known_at_ms": [12 * day, 18 * day],
            "is_fraud": [1, 0],
        }
    )

    known = eval_models._terminal_fraud_known(rows, labels)

    # Day 10: the day-5 fraud is not known yet; day 20: it is; day 40: it is 35 days old (past 28);
    # terminal 8 has none. The day-11 label is not a fraud.
    assert known.tolist() == [False, True, False, False]
