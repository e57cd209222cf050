"""Feature, score and alert records on the wire, defined once.

The feature job writes one :class:`FeatureRecord` per transaction to the features topic. The scoring job writes one :class:`ScoreRecord` per transaction to the scores topic and an
:class:`AlertRecord` for every transaction scored at or above the model's threshold to the alerts topic.
Both are JSON (``model_dump_json``), keyed by ``card_id``, with an explicit ``schema_version``; event and
scoring times are UTC milliseconds. Consumers parse them with ``model_validate_json``. The same alert
fields are stored in Redis (``infra.redis.store``) for lookups.
"""

from __future__ import annotations

import math
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from contracts.events import (
    SCHEMA_VERSION,
    CardToken,
    EventTimeMs,
    FiniteFloat,
    TerminalId,
    TransactionEvent,
    TxId,
)


class FeatureRecord(TransactionEvent):
    """One transaction with its features, as written to the features topic (keyed by ``card_id``).

    It carries the whole input event (its fields first, as in ``TransactionEvent``), so the scoring stage
    needs nothing else. ``late`` marks a transaction that arrived after the feature job's event-time
    frontier had passed it: its features were computed against the state as it was then.

    As strict as the input events: other producers can write this topic, and a value the model cannot
    score (a string, an infinity) must become a dead letter, not a failed micro-batch. Which feature
    names a record must carry is the scoring stage's to check (``scoring.core.parse_feature_record``).
    """

    late: bool
    features: dict[str, FiniteFloat]


ModelVersion = Annotated[int, Field(ge=1, description="Registered model version (MLflow counts from 1).")]

#: The Kafka header of an alert record: the record it was scored from, ``topic/partition@offset`` (a
#: transaction for the pipeline, a feature record for the scoring job). Traceability, and the jobs' alert
#: latency (``fraud.metrics``).
ALERT_SOURCE_HEADER = "fraud.source"


def source_position(topic: str, partition: int, offset: int) -> str:
    """The value of :data:`ALERT_SOURCE_HEADER` for a record of ``topic``."""
    return f"{topic}/{partition}@{offset}"


def parse_source_position(value: str) -> tuple[str, int] | None:
    """(``topic/partition``, offset) of a :data:`ALERT_SOURCE_HEADER` value; None when it is not one."""
    name, at, offset = value.rpartition("@")
    return (name, int(offset)) if at and "/" in name and offset.isdigit() else None


class _Scored(BaseModel):
    """Fields every score and alert carries: the transaction, the score and the model that gave it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: Literal[1] = SCHEMA_VERSION
    tx_id: TxId
    card_id: CardToken
    terminal_id: TerminalId
    amount: float
    event_time_ms: EventTimeMs = Field(description="The transaction's event time, UTC milliseconds.")
    scored_at_ms: int = Field(
        ge=0, description="When its micro-batch was scored (the same on a re-run), UTC milliseconds."
    )
    score: FiniteFloat = Field(description="The model's fraud score (probability of fraud).")
    threshold: FiniteFloat = Field(description="The model's alert threshold: score >= threshold alerts.")
    model_name: str = Field(min_length=1, description="Registered MLflow model name.")
    model_version: ModelVersion


#: How many features an alert names as having driven its score (``top_features``).
TOP_FEATURES = 3
#: How an alert's contributions were computed (``models.contributions``): exact TreeSHAP values of a tree
#: model, the exact SHAP values of a linear model, or none (a model of another kind).
ContributionMethod = Literal["tree_shap", "linear_shap", "none"]


#: The fields of an alert that explain its score (the others are the score's and the feature values).
EXPLANATION_FIELDS = frozenset({"top_features", "contributions", "base_margin", "contribution_method"})


class Explanation(BaseModel):
    """Why the model scored a transaction as it did: each feature's signed contribution to the model's
    margin (log-odds for boosted trees and logistic regression, the probability for forests), strongest
    first; ``base_margin`` plus the contributions is the margin."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    contributions: dict[str, float]
    base_margin: float | None
    method: ContributionMethod


class ScoreRecord(_Scored):
    """One scored transaction, as written to the scores topic (keyed by ``card_id``)."""

    alert: bool = Field(description="Whether the score reached the threshold (an alert was raised).")

    def to_alert(self, features: dict[str, float | None], explanation: Explanation) -> AlertRecord:
        """The alert for this score, with the feature values and the model's explanation of the score."""
        fields = self.model_dump(exclude={"alert"})
        return AlertRecord(
            **fields,
            features=features,
            top_features=list(explanation.contributions)[:TOP_FEATURES],
            contributions=explanation.contributions,
            base_margin=explanation.base_margin,
            contribution_method=explanation.method,
        )


class AlertRecord(_Scored):
    """A transaction scored at or above the threshold, as written to the alerts topic and to Redis."""

    features: dict[str, float | None] = Field(
        description="The feature values the model scored (null where a feature had no value)."
    )
    top_features: list[str] = Field(
        default_factory=list,
        description="Names of the features that drove the score most, strongest first: the first of "
        "`contributions`.",
    )
    contributions: dict[str, float] = Field(
        default_factory=dict,
        description="Each feature's signed contribution to the model's margin (log-odds for boosted trees "
        "and logistic regression, the probability for forests), largest magnitude first: positive pushed "
        "the score up. `base_margin` plus their sum is the margin. Empty when the model gives none.",
    )
    base_margin: float | None = Field(
        default=None,
        description="The model's margin before any feature is known (null without contributions).",
    )
    contribution_method: ContributionMethod = Field(
        default="none",
        description="How the contributions were computed: tree_shap (exact TreeSHAP values of a tree "
        "model), linear_shap (exact SHAP values of a linear model, features independent), none.",
    )

    @field_validator("features")
    @classmethod
    def _no_nan(cls, value: dict[str, float | None]) -> dict[str, float | None]:
        """NaN and infinities become null, as JSON has no NaN: the record survives a round trip unchanged."""
        return {k: None if v is None or not math.isfinite(v) else v for k, v in value.items()}
