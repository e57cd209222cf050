"""Each model family's contributions: they add up to the model's own margin on every row, and the feature
that drives a score comes first, on models trained where the answer is known (``tests.support.driven``)."""

from __future__ import annotations

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
    "hist_gradient_boosting": ("saabas", True),
    "logistic_regression": ("linear_shap", True),
    "random_forest": ("saabas", False),
    "decision_tree": ("saabas", False),
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
