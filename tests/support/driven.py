"""Models trained on rows whose label two known features decide, for the tests of their contributions:
fraud when the terminal's risk is above 0.7 or the amount above 250; the card's counts are noise."""

from __future__ import annotations

import functools

import numpy as np
import pandas as pd
from sklearn.pipeline import Pipeline

from models.estimators import ModelSpec, build_pipeline

#: The inputs, in the models' order.
COLUMNS = ("amount", "card_nb_tx_1d", "card_nb_tx_7d", "terminal_risk_7d")
#: A transaction the terminal's risk drives (its counts at the edge of those seen in training: further
#: from their mean than the risk, in standard deviations), and one the amount drives.
BY_RISK = {"amount": 150.0, "card_nb_tx_1d": 5.0, "card_nb_tx_7d": 29.0, "terminal_risk_7d": 0.95}
BY_AMOUNT = {"amount": 290.0, "card_nb_tx_1d": 1.0, "card_nb_tx_7d": 5.0, "terminal_risk_7d": 0.5}


def driven_rows(n: int = 4_000, seed: int = 0) -> tuple[pd.DataFrame, np.ndarray]:
    rng = np.random.default_rng(seed)
    frame = pd.DataFrame(
        {
            "amount": rng.uniform(0, 300, n),
            "card_nb_tx_1d": rng.integers(0, 6, n).astype(np.float64),
            "card_nb_tx_7d": rng.integers(0, 30, n).astype(np.float64),
            "terminal_risk_7d": rng.uniform(0, 1, n),
        }
    )
    labels = ((frame["terminal_risk_7d"] > 0.7) | (frame["amount"] > 250)).to_numpy(dtype=np.int64)
    return frame, labels


@functools.cache
def driven_model(kind: str) -> Pipeline:
    """A fitted pipeline of ``kind`` (``models.estimators``: scaling, then the classifier), trained once
    per test session (never changed by the tests)."""
    frame, labels = driven_rows()
    return build_pipeline(ModelSpec(kind, n_estimators=50, n_jobs=1)).fit(frame, labels)  # type: ignore[arg-type]


def raw_margin(model: Pipeline, rows: pd.DataFrame) -> np.ndarray:
    """The boosted model's raw score (log-odds) of ``rows``: its decision function, or its booster's."""
    inputs = model[:-1].transform(rows[list(COLUMNS)])
    classifier = model[-1]
    if hasattr(classifier, "decision_function"):
        return np.asarray(classifier.decision_function(inputs), dtype=np.float64)
    return np.asarray(classifier.predict(inputs, raw_score=True), dtype=np.float64)
