"""The fast core against the slow reference implementation, on small random inputs."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import features.core
from features.core import compute_features
from features.definitions import DAY_MS, FeatureParams
from tests.support.reference import random_case, reference_features

PARAMS = [
    FeatureParams(),
    FeatureParams(label_delay_ms=2 * DAY_MS + 5),
    FeatureParams(label_delay_ms=0, window_days=(2, 5), short_window_hours=3),
]


def assert_same_features(actual: pd.DataFrame, expected: pd.DataFrame) -> None:
    """Ints and columns exactly equal, floats within 1e-12 (the reference sums floats, not cents)."""
    assert list(actual.columns) == list(expected.columns)
    for name in expected.columns:
        if pd.api.types.is_integer_dtype(expected[name]):
            assert actual[name].dtype == np.int64, name
            np.testing.assert_array_equal(actual[name].to_numpy(), expected[name].to_numpy(), err_msg=name)
        else:
            assert actual[name].dtype == np.float64, name
            np.testing.assert_allclose(
                actual[name].to_numpy(), expected[name].to_numpy(), rtol=1e-12, atol=0, err_msg=name
            )


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("params", PARAMS, ids=["handbook", "odd-delay", "no-delay"])
def test_compute_features_matches_reference(seed: int, params: FeatureParams) -> None:
    transactions, labels = random_case(np.random.default_rng(seed), params)

    actual = compute_features(transactions.sample(frac=1.0, random_state=seed), labels, params)

    assert_same_features(actual, reference_features(transactions, labels, params))


def test_random_cases_exercise_the_edges() -> None:
    """Guards the generator: the cases above must contain ties, zero means, risks and capped gaps."""
    params = FeatureParams()
    transactions, labels = random_case(np.random.default_rng(0), params)
    expected = reference_features(transactions, labels, params)

    assert transactions.duplicated(["card_id", "event_time_ms"]).any()
    assert labels.duplicated("tx_id").any()
    assert (expected["card_amount_ratio_30d"] == 1.0).any()
    assert ((expected["terminal_risk_7d"] > 0) & (expected["terminal_risk_7d"] < 1)).any()
    assert (expected["card_secs_since_prev_tx"] == 2_592_000.0).sum() >= transactions["card_id"].nunique()
    assert (expected["card_secs_since_prev_tx"] == 0.0).any()
    assert (expected["card_nb_tx_1h"] > 1).any()


def test_rank_keyspace_gives_the_same_features(monkeypatch: pytest.MonkeyPatch) -> None:
    """The overflow fallback (times replaced by ranks) must not change any feature."""
    params = FeatureParams(label_delay_ms=3 * DAY_MS)
    transactions, labels = random_case(np.random.default_rng(11), params)
    expected = compute_features(transactions, labels, params)

    monkeypatch.setattr(features.core, "_COMPOSITE_LIMIT", 0)
    actual = compute_features(transactions, labels, params)

    pd.testing.assert_frame_equal(actual, expected, check_exact=True)
