"""The scoring stage's pure pieces on inputs whose answers are known by hand, without Spark, Kafka or
MLflow: the alert decision (a score at or above the threshold alerts), an alert's contributions by the
model, the score, alert and dead-letter records, and which feature records are scored at all."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from contracts.errors import ConfigError
from contracts.events import DeadLetter, Reason
from contracts.records import ALERT_SOURCE_HEADER, EXPLANATION_FIELDS, AlertRecord, FeatureRecord, ScoreRecord
from contracts.settings import Topics
from features.definitions import FEATURE_COLUMNS
from infra.spark.kafka_sink.records import SinkRows
from models.estimators import DEFAULT_SPEC
from models.registry import LoadedModel
from scoring.chooser import check_computable
from scoring.core import parse_feature_record, score_rows, shadow_rows
from scoring.redis_hook import topic_values
from tests.support.driven import BY_AMOUNT, BY_RISK, COLUMNS, driven_model, raw_margin
from tests.support.samples import FEATURE

TOPICS = Topics()
T0_MS = 1_523_750_400_000
SCORED_AT_MS = T0_MS + 60_000


class AmountInHundreds:
    """A model whose fraud score is the amount / 100, and NaN (no score) for a negative amount."""

    def predict_proba(self, frame: pd.DataFrame) -> np.ndarray:
        score = frame["amount"].to_numpy(dtype=np.float64) / 100
        score = np.where(score < 0, np.nan, score)
        return np.column_stack([1 - score, score])


def loaded(model: object, threshold: float = 0.5, columns: Sequence[str] = COLUMNS) -> LoadedModel:
    return LoadedModel(
        name="fraud-detector", version=3, threshold=threshold, feature_columns=tuple(columns), model=model
    )


def scored_input(rows: list[tuple[float, float, float, float]]) -> tuple[dict[str, pa.Array], pd.DataFrame]:
    """Event columns and feature frame of transactions 1, 2, ... with (amount, *features) ``rows``."""
    amounts, *features = zip(*rows, strict=True)
    event = {
        "tx_id": pa.array(range(1, len(rows) + 1), pa.int64()),
        "card_id": pa.array([f"{tx_id:032x}" for tx_id in range(1, len(rows) + 1)]),
        "terminal_id": pa.array(["T-1"] * len(rows)),
        "amount": pa.array(amounts, pa.float64()),
        "event_time_ms": pa.array([T0_MS + 1_000 * i for i in range(len(rows))], pa.int64()),
    }
    return event, pd.DataFrame(dict(zip(COLUMNS[1:], features, strict=True)))


def raw_values(n: int) -> pa.Array:
    return pa.array([f"feature record {i}".encode() for i in range(n)], pa.binary())


def headers_of(row: dict[str, Any]) -> dict[str, bytes]:
    return {header["key"]: header["value"] for header in row["headers"] or ()}


def test_a_score_at_the_threshold_alerts_and_one_below_does_not() -> None:
    event, features = scored_input([(49.0, 1, 1, 0.0), (50.0, 2, 5, 0.25), (80.0, 1, 9, 0.5)])
    others = SinkRows()
    model = loaded(AmountInHundreds())
    scores = score_rows(
        model, event, features, raw_values(3), TOPICS, others, SCORED_AT_MS, lambda i: f"features/0@{100 + i}"
    )

    assert scores is not None
    records = [ScoreRecord.model_validate_json(value) for value in topic_values([scores], TOPICS.scores)]
    assert [(r.tx_id, r.score, r.alert) for r in records] == [
        (1, 0.49, False),
        (2, 0.5, True),
        (3, 0.8, True),
    ]
    assert {(r.threshold, r.model_name, r.model_version, r.scored_at_ms) for r in records} == {
        (0.5, "fraud-detector", 3, SCORED_AT_MS)
    }
    assert scores.column("key").to_pylist() == [f"{tx_id:032x}".encode() for tx_id in (1, 2, 3)]
    assert scores.column("timestamp_ms").to_pylist() == [T0_MS, T0_MS + 1_000, T0_MS + 2_000]

    alert_rows = others.batch()
    assert alert_rows is not None
    rows = alert_rows.to_pylist()
    assert [row["topic"] for row in rows] == [TOPICS.alerts, TOPICS.alerts]
    alerts = [AlertRecord.model_validate_json(row["value"]) for row in rows]
    assert [alert.tx_id for alert in alerts] == [2, 3]
    assert [row["key"] for row in rows] == [f"{tx_id:032x}".encode() for tx_id in (2, 3)]
    assert [row["timestamp_ms"] for row in rows] == [T0_MS + 1_000, T0_MS + 2_000]
    assert [headers_of(row)[ALERT_SOURCE_HEADER] for row in rows] == [b"features/0@101", b"features/0@102"]
    assert alerts[0].features == {
        "amount": 50.0,
        "card_nb_tx_1d": 2,
        "card_nb_tx_7d": 5,
        "terminal_risk_7d": 0.25,
    }
    assert alerts[0].model_dump(exclude={"features", *EXPLANATION_FIELDS}) == records[1].model_dump(
        exclude={"alert"}
    )


def test_an_alert_carries_the_models_contributions_strongest_first_adding_up_to_its_margin() -> None:
    """The default model's alerts for a transaction its terminal's risk drives and one its amount drives:
    that feature comes first, pushing the score up, and the base margin plus the contributions is the
    model's raw score (log-odds), whose logistic is the alert's score."""
    pipeline = driven_model(DEFAULT_SPEC.kind)
    rows = [tuple(row[name] for name in COLUMNS) for row in (BY_RISK, BY_AMOUNT)]
    event, features = scored_input(rows)  # type: ignore[arg-type]
    others = SinkRows()
    score_rows(loaded(pipeline), event, features, raw_values(2), TOPICS, others, SCORED_AT_MS)

    out = others.batch()
    assert out is not None
    by_risk, by_amount = [AlertRecord.model_validate_json(v) for v in topic_values([out], TOPICS.alerts)]
    assert by_risk.top_features[0] == "terminal_risk_7d" and by_risk.contributions["terminal_risk_7d"] > 0
    assert by_amount.top_features[0] == "amount" and by_amount.contributions["amount"] > 0
    raw = raw_margin(pipeline, pd.DataFrame([BY_RISK, BY_AMOUNT]))
    for alert, margin in zip((by_risk, by_amount), raw.tolist(), strict=True):
        assert alert.contribution_method != "none"
        assert set(alert.contributions) == set(COLUMNS)
        magnitudes = [abs(value) for value in alert.contributions.values()]
        assert magnitudes == sorted(magnitudes, reverse=True)
        assert alert.top_features == list(alert.contributions)[:3]
        assert alert.base_margin is not None
        assert alert.base_margin + sum(alert.contributions.values()) == pytest.approx(margin, abs=1e-9)
        assert alert.score == pytest.approx(1 / (1 + np.exp(-margin)), abs=1e-12)


def test_an_alert_of_a_model_without_contributions_names_no_features() -> None:
    event, features = scored_input([(60.0, 70, 2, -0.5)])
    others = SinkRows()
    score_rows(loaded(AmountInHundreds()), event, features, raw_values(1), TOPICS, others, SCORED_AT_MS)

    out = others.batch()
    assert out is not None
    (alert,) = [AlertRecord.model_validate_json(value) for value in topic_values([out], TOPICS.alerts)]
    assert (alert.top_features, alert.contributions, alert.base_margin) == ([], {}, None)
    assert alert.contribution_method == "none"


def test_a_row_without_a_score_is_dead_lettered_and_the_alerts_keep_their_own_sources() -> None:
    event, features = scored_input([(-1.0, 1, 1, 0.0), (20.0, 1, 1, 0.0), (70.0, 1, 1, 0.0)])
    others = SinkRows()
    model = loaded(AmountInHundreds())
    scores = score_rows(
        model, event, features, raw_values(3), TOPICS, others, SCORED_AT_MS, lambda i: f"features/0@{i}"
    )

    assert scores is not None
    assert [ScoreRecord.model_validate_json(v).tx_id for v in topic_values([scores], TOPICS.scores)] == [2, 3]
    out = others.batch()
    assert out is not None
    letter, alert = out.to_pylist()
    assert (letter["topic"], letter["value"]) == (TOPICS.dead_letter, b"feature record 0")
    assert headers_of(letter)["dlq.reason"] == Reason.UNSCORABLE.value.encode()
    assert headers_of(letter)["dlq.detail"] == b"the model cannot score it: the model gave no finite score"
    assert AlertRecord.model_validate_json(alert["value"]).tx_id == 3
    assert headers_of(alert)[ALERT_SOURCE_HEADER] == b"features/0@2"  # its own row, not the 2nd of those kept


def test_the_shadow_scores_to_its_own_topic_by_its_own_threshold_and_never_alerts() -> None:
    event, features = scored_input([(20.0, 1, 1, 0.0), (-5.0, 1, 1, 0.0), (60.0, 1, 1, 0.0)])
    shadow = shadow_rows(
        loaded(AmountInHundreds(), threshold=0.25), event, features, topics=TOPICS, scored_at_ms=SCORED_AT_MS
    )

    assert shadow is not None
    assert set(shadow.column("topic").to_pylist()) == {TOPICS.shadow_scores}
    records = [ScoreRecord.model_validate_json(value) for value in shadow.column("value").to_pylist()]
    assert [(r.tx_id, r.score, r.alert, r.threshold) for r in records] == [
        (1, 0.2, False, 0.25),
        (3, 0.6, True, 0.25),
    ]


def test_a_feature_record_is_scored_only_with_exactly_the_features_the_stage_knows() -> None:
    def parsed(features: dict[str, float]) -> FeatureRecord | DeadLetter:
        raw = FeatureRecord.model_validate({**FEATURE, "features": features}).model_dump_json().encode()
        return parse_feature_record(raw, "kafka:features", 16_384, partition=2, offset=7)

    assert isinstance(parsed(FEATURE["features"]), FeatureRecord)
    missing = parsed({k: v for k, v in FEATURE["features"].items() if k != FEATURE_COLUMNS[3]})
    assert isinstance(missing, DeadLetter)
    assert (missing.reason, missing.detail) == (
        Reason.MISSING_FIELD,
        f"features: missing: {FEATURE_COLUMNS[3]}",
    )
    assert (missing.partition, missing.offset) == (2, 7)
    unknown = parsed({**FEATURE["features"], "merchant_risk": 0.5, "device_age_days": 3.0})
    assert isinstance(unknown, DeadLetter)
    assert (unknown.reason, unknown.detail) == (
        Reason.UNEXPECTED_FIELD,
        "features: not known: device_age_days, merchant_risk",
    )


def test_a_model_needing_a_feature_the_job_does_not_compute_is_refused() -> None:
    check_computable(loaded(AmountInHundreds(), columns=("amount", *FEATURE_COLUMNS)), "v3")
    with pytest.raises(
        ConfigError, match=r"^v3 needs features the feature job does not compute: merchant_risk$"
    ):
        check_computable(loaded(AmountInHundreds(), columns=("amount", "merchant_risk")), "v3")
