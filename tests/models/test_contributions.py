"""Each model family's contributions: they add up to the model's own margin on every row, and the feature
that drives a score comes first, on models trained where the answer is known (``tests.support.driven``)."""

from __future__ import annotations

import functools
import itertools
import math

import numpy as np
import pandas as pd
import pytest
from scipy.special import expit

from models.contributions import contributions
from models.estimators import MODEL_KINDS
from tests.support.driven import BY_AMOUNT, BY_RISK, COLUMNS, driven_model, driven_rows, raw_margin

#: The method each family's contributions are computed by, and whether its margin is in log-odds.
METHODS = {
    "lightgbm": ("tree_shap", True),
    "hist_gradient_boosting": ("tree_shap", True),
    "logistic_regression": ("linear_shap", True),
    "random_forest": ("tree_shap", False),
    "decision_tree": ("tree_shap", False),
}


@pytest.mark.parametrize("kind", MODEL_KINDS)
def test_contributions_add_up_to_the_models_margin_and_the_driving_feature_comes_first(kind: str) -> None:
    model = driven_model(kind)
    rows = pd.concat([driven_rows(300, seed=1)[0], pd.DataFrame([BY_RISK, BY_AMOUNT])], ignore_index=True)
    found = contributions(model, rows)
    method, log_odds = METHODS[kind]
    assert found.method == method
    assert found.values.shape == (len(rows), len(COLUMNS))
    scores = model.predict_proba(rows)[:, 1]
    np.testing.assert_allclose(expit(found.margin) if log_odds else found.margin, scores, rtol=0, atol=1e-9)

    by_risk, by_amount = found.values[-2], found.values[-1]
    assert COLUMNS[int(np.argmax(np.abs(by_risk)))] == "terminal_risk_7d" and by_risk[3] > 0
    assert COLUMNS[int(np.argmax(np.abs(by_amount)))] == "amount" and by_amount[0] > 0


@pytest.mark.parametrize("kind", ["lightgbm", "hist_gradient_boosting", "logistic_regression"])
def test_contributions_add_up_to_the_raw_score(kind: str) -> None:
    model = driven_model(kind)
    rows = pd.DataFrame([BY_RISK, BY_AMOUNT])
    np.testing.assert_allclose(contributions(model, rows).margin, raw_margin(model, rows), rtol=0, atol=1e-9)


@pytest.mark.parametrize("kind", ["lightgbm", "hist_gradient_boosting"])
def test_a_missing_value_takes_the_models_own_path(kind: str) -> None:
    """Boosted trees send a missing value down a branch they learnt: the contributions follow it."""
    model = driven_model(kind)
    rows = pd.DataFrame([BY_RISK, BY_AMOUNT]).assign(terminal_risk_7d=[np.nan, 0.9])
    found = contributions(model, rows)
    np.testing.assert_allclose(expit(found.margin), model.predict_proba(rows)[:, 1], rtol=0, atol=1e-9)


def test_a_model_of_another_kind_gives_no_contributions() -> None:
    class Constant:
        def predict_proba(self, frame: pd.DataFrame) -> np.ndarray:
            return np.tile([0.4, 0.6], (len(frame), 1))

    found = contributions(Constant(), pd.DataFrame([BY_RISK]))
    assert found.method == "none" and found.values.shape == (1, 0)


def test_hist_gradient_boostings_contributions_are_its_exact_shap_values() -> None:
    """Against the Shapley values computed from their definition: a coalition's value is the model's
    expected margin given its features, the others averaged over the training rows each node saw (the
    path-dependent expectation that TreeSHAP computes), over all 16 coalitions of the 4 features."""
    model = driven_model("hist_gradient_boosting")
    rows = pd.DataFrame([BY_RISK, BY_AMOUNT])
    inputs = model[:-1].transform(rows)
    classifier = model[-1]
    width = len(COLUMNS)

    def expected(nodes: np.ndarray, x: np.ndarray, known: frozenset[int], node: int = 0) -> float:
        if nodes["is_leaf"][node]:
            return float(nodes["value"][node])
        left, right = int(nodes["left"][node]), int(nodes["right"][node])
        feature = int(nodes["feature_idx"][node])
        if feature in known:
            goes_left = x[feature] <= nodes["num_threshold"][node]
            return expected(nodes, x, known, left if goes_left else right)
        counts = nodes["count"][[left, right]].astype(np.float64)
        both = [expected(nodes, x, known, left), expected(nodes, x, known, right)]
        return float(np.dot(counts, both) / counts.sum())

    @functools.cache
    def value(row: int, known: frozenset[int]) -> float:
        return sum(expected(p[0].nodes, inputs[row], known) for p in classifier._predictors)

    found = contributions(model, rows).values
    for row in range(len(inputs)):
        for i in range(width):
            others = [j for j in range(width) if j != i]
            shapley = 0.0
            for size in range(width):
                for coalition in itertools.combinations(others, size):
                    weight = math.factorial(size) * math.factorial(width - size - 1) / math.factorial(width)
                    known = frozenset(coalition)
                    shapley += weight * (value(row, known | {i}) - value(row, known))
            assert found[row, i] == pytest.approx(shapley, abs=1e-9), (row, COLUMNS[i])
