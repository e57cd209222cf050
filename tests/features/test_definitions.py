"""Feature names, parameters and specs."""

from __future__ import annotations

from pathlib import Path

import pydantic
import pytest

from contracts.events import LabelEvent, TransactionEvent
from features.definitions import (
    DAY_MS,
    DEFAULT_PARAMS,
    EVENT_TIME_MS,
    FEATURE_COLUMNS,
    HANDBOOK_FEATURES,
    LABEL_COLUMNS,
    FeatureParams,
    feature_table,
)


def test_feature_columns_in_canonical_order() -> None:
    assert FEATURE_COLUMNS == (
        "card_nb_tx_1d",
        "card_avg_amount_1d",
        "card_nb_tx_7d",
        "card_avg_amount_7d",
        "card_nb_tx_30d",
        "card_avg_amount_30d",
        "terminal_nb_tx_1d",
        "terminal_risk_1d",
        "terminal_nb_tx_7d",
        "terminal_risk_7d",
        "terminal_nb_tx_30d",
        "terminal_risk_30d",
        "is_weekend",
        "is_night",
        "card_nb_tx_1h",
        "card_secs_since_prev_tx",
        "card_amount_ratio_30d",
        "card_prior_amount_ratio_7d",
        "card_amount_zscore_7d",
        "card_prior_amount_ratio_30d",
        "card_amount_zscore_30d",
        "card_nb_unusual_7d",
        "terminal_nb_fraud_1d",
        "terminal_nb_fraud_7d",
        "terminal_nb_fraud_30d",
        "terminal_days_since_first_fraud",
    )


def test_handbook_features_are_the_15_inputs() -> None:
    assert ("amount", "is_weekend", "is_night", *FEATURE_COLUMNS[:12]) == HANDBOOK_FEATURES


def test_default_params_name_exactly_the_feature_columns() -> None:
    params = FeatureParams()
    assert params.feature_columns == FEATURE_COLUMNS
    assert sorted(params.card_feature_columns + params.terminal_feature_columns) == sorted(
        set(FEATURE_COLUMNS) - {"is_weekend", "is_night"}
    )
    assert params.label_delay_ms == 7 * DAY_MS
    assert params.allowed_lateness_ms == 0
    assert params.longest_window_ms == 30 * DAY_MS
    assert params.short_window_ms == 3_600_000
    assert params == DEFAULT_PARAMS


def test_other_windows_give_their_own_names() -> None:
    params = FeatureParams(window_days=(2, 14), short_window_hours=6)
    assert params.feature_columns == (
        "card_nb_tx_2d",
        "card_avg_amount_2d",
        "card_nb_tx_14d",
        "card_avg_amount_14d",
        "terminal_nb_tx_2d",
        "terminal_risk_2d",
        "terminal_nb_tx_14d",
        "terminal_risk_14d",
        "is_weekend",
        "is_night",
        "card_nb_tx_6h",
        "card_secs_since_prev_tx",
        "card_amount_ratio_14d",
        "card_prior_amount_ratio_14d",
        "card_amount_zscore_14d",
        "card_nb_unusual_7d",
        "terminal_nb_fraud_2d",
        "terminal_nb_fraud_14d",
        "terminal_days_since_first_fraud",
    )


def test_history_covers_windows_delay_and_lateness() -> None:
    params = FeatureParams(allowed_lateness_ms=5)
    assert params.card_history_ms == 30 * DAY_MS + 5
    assert params.terminal_history_ms == 37 * DAY_MS + 5


@pytest.mark.parametrize(
    "bad",
    [
        {"window_days": ()},
        {"window_days": (7, 1)},
        {"window_days": (1, 1)},
        {"window_days": (0, 7)},
        {"label_delay_ms": -1},
        {"allowed_lateness_ms": -1},
        {"short_window_hours": 0},
        {"lateness": 5},
    ],
)
def test_invalid_params_are_rejected(bad: dict[str, object]) -> None:
    with pytest.raises(pydantic.ValidationError):
        FeatureParams.model_validate(bad)


def test_params_are_frozen() -> None:
    with pytest.raises(pydantic.ValidationError):
        DEFAULT_PARAMS.allowed_lateness_ms = 5  # type: ignore[misc]


def test_input_column_names_are_the_wire_field_names() -> None:
    assert set(LABEL_COLUMNS) <= set(LabelEvent.model_fields)
    assert EVENT_TIME_MS in TransactionEvent.model_fields


def test_specs_declare_every_column_once_with_its_type() -> None:
    specs = DEFAULT_PARAMS.specs
    assert tuple(spec.name for spec in specs) == FEATURE_COLUMNS
    assert len({spec.name for spec in specs}) == len(specs)
    counts = [spec.name for spec in specs if spec.dtype == "int64"]
    assert counts == [name for name in FEATURE_COLUMNS if "_nb_" in name or name.startswith("is_")]
    assert all(spec.meaning and spec.entity in ("card", "terminal", "time") for spec in specs)
    assert DEFAULT_PARAMS.spec("terminal_risk_7d").window == "7 d, 7 d before"


def test_the_documented_feature_table_is_generated_from_the_specs() -> None:
    docs = (Path(__file__).resolve().parents[2] / "docs" / "architecture.md").read_text()
    start = docs.index("<!-- features:start")
    body = docs[docs.index("\n", start) + 1 : docs.index("<!-- features:end -->")].strip()
    assert body == feature_table(), "regenerate it: python -m features.definitions"
