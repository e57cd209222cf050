"""The live page's figures: the pipeline at a glance, one route per part of the page.

``/live/status`` (the status strip: each running job's rate, lag and last micro-batch, and the model
version scoring, since when), ``/live/alerts`` (alerts and scores per minute) and ``/live/scores`` (the
distribution of the scores against the model's threshold). Minutes are of scoring time (a score record's
``scored_at_ms``, wall clock), counted by the scoring job in Redis (``scoring.score_stats``); the jobs are
seen through what the server is given (:class:`JobsView`: the app passes the jobs registered under
``FRAUD_HOME``, or the demo's own). Read-only, like the rest of the API.
"""

from __future__ import annotations

import time
from typing import Annotated, Any, Protocol

from fastapi import FastAPI, Query
from pydantic import BaseModel, Field

from scoring.score_stats import MINUTE_MS, SCORE_BINS, Counts, ScoredModel, read_minutes, read_models

#: The minutes a chart covers by default, and at most.
DEFAULT_MINUTES, MAX_MINUTES = 30, 1440

MinutesParam = Annotated[
    int,
    Query(
        ge=1,
        le=MAX_MINUTES,
        description="The last this many minutes of scoring time, the current (partial) one included.",
    ),
]


class JobStatus(BaseModel):
    """A running job, as its last micro-batch left it."""

    name: str = Field(description="features, scoring or pipeline (namespace. first, for a namespace's).")
    answering: bool = Field(description="Whether its figures could be read (false: the others are null).")
    records_per_s: float | None = Field(
        None, description="Kafka records read per second of the last micro-batch's duration."
    )
    lag_records: int | None = Field(None, description="Records of its input behind the log's end.")
    last_batch_id: int | None = Field(None, description="The last micro-batch run (null before the first).")
    last_batch_at_ms: int | None = Field(None, description="When it ended (UTC ms).")
    model_versions: dict[str, int] = Field(
        default_factory=dict, description="Model versions serving, by role (champion, shadow)."
    )


class JobsView(Protocol):
    """The running jobs the server shows (``fraud.live``)."""

    def jobs(self) -> list[JobStatus]: ...


class ModelInUse(BaseModel):
    """The model version that scored last."""

    model_name: str
    model_version: int
    threshold: float
    since_ms: int = Field(
        description="When it took over (UTC ms): its first score after another version's last one."
    )
    last_scored_ms: int = Field(description="Its latest scoring time (UTC ms).")


class LiveStatus(BaseModel):
    """The status strip."""

    now_ms: int = Field(description="The server's clock (UTC ms), to age the times by.")
    jobs: list[JobStatus] | None = Field(
        description="The running jobs (null: this server does not see them)."
    )
    model: ModelInUse | None = Field(description="The model version that scored last (null: no scores).")


class Minute(BaseModel):
    start_ms: int = Field(description="The minute's start (UTC ms).")
    scores: int = Field(description="Transactions scored in it.")
    alerts: int = Field(description="Alerts raised in it.")


class AlertsPerMinute(BaseModel):
    """Alerts and scores per minute of scoring time, oldest first; the last minute is the current one."""

    minutes: list[Minute]


class ScoreDistribution(BaseModel):
    """How the scores of the model version that scored last fall into bins of equal width over [0, 1]."""

    minutes: int = Field(description="The minutes counted.")
    bin_width: float
    counts: list[int] = Field(description="Scores per bin, from [0, bin_width) up; 1.0 is in the last.")
    scores: int = Field(description="Scores counted.")
    alerts: int = Field(description="Alerts among them (score at or above the threshold).")
    model: ModelInUse | None = Field(description="The version counted (null: no scores ever).")
    other_versions: int = Field(description="Scores of other versions in these minutes, not counted.")


def minutes_until(now_ms: int, minutes: int) -> list[int]:
    """The last ``minutes`` minute numbers (UTC ms // 60,000) up to the one of ``now_ms``, oldest first."""
    current = now_ms // MINUTE_MS
    return list(range(current - minutes + 1, current + 1))


def model_in_use(models: list[ScoredModel]) -> ModelInUse | None:
    """The version that scored last (``models``: newest last score first), and when it took over."""
    if not models:
        return None
    latest, others = models[0], models[1:]
    before = [m.last_ms for m in others if m.last_ms <= latest.last_ms]
    return ModelInUse(
        model_name=latest.name,
        model_version=latest.version,
        threshold=latest.threshold,
        since_ms=max([latest.first_ms, *before]),
        last_scored_ms=latest.last_ms,
    )


def distribution(counts: dict[int, dict[int, Counts]], model: ModelInUse | None) -> ScoreDistribution:
    """The score distribution of ``model``'s version in ``counts`` (by minute, then version)."""
    kept, others = Counts(), 0
    for by_version in counts.values():
        for version, found in by_version.items():
            if model is not None and version == model.model_version:
                kept.add(found)
            else:
                others += found.scores
    return ScoreDistribution(
        minutes=len(counts),
        bin_width=1 / SCORE_BINS,
        counts=kept.bins,
        scores=kept.scores,
        alerts=kept.alerts,
        model=model,
        other_versions=others,
    )


def add_live_routes(app: FastAPI, redis: Any, prefix: str, guarded: list[Any], jobs: JobsView | None) -> None:
    """``/live/status``, ``/live/alerts`` and ``/live/scores`` over the counts under ``prefix``."""

    def now_ms() -> int:
        return int(time.time() * 1000)

    @app.get("/live/status", response_model=LiveStatus, tags=["live"], dependencies=guarded)
    def live_status() -> LiveStatus:
        """The running jobs (rate, lag, last micro-batch) and the model version scoring, since when."""
        return LiveStatus(
            now_ms=now_ms(),
            jobs=None if jobs is None else jobs.jobs(),
            model=model_in_use(read_models(redis, prefix)),
        )

    @app.get("/live/alerts", response_model=AlertsPerMinute, tags=["live"], dependencies=guarded)
    def live_alerts(minutes: MinutesParam = DEFAULT_MINUTES) -> AlertsPerMinute:
        """Alerts and scores per minute of scoring time (all model versions), oldest minute first."""
        counts = read_minutes(redis, minutes_until(now_ms(), minutes), prefix)
        return AlertsPerMinute(
            minutes=[
                Minute(
                    start_ms=minute * MINUTE_MS,
                    scores=sum(c.scores for c in by_version.values()),
                    alerts=sum(c.alerts for c in by_version.values()),
                )
                for minute, by_version in counts.items()
            ]
        )

    @app.get("/live/scores", response_model=ScoreDistribution, tags=["live"], dependencies=guarded)
    def live_scores(minutes: MinutesParam = DEFAULT_MINUTES) -> ScoreDistribution:
        """The distribution of the scores of the model version that scored last, over the last minutes, and
        its threshold."""
        model = model_in_use(read_models(redis, prefix))
        return distribution(read_minutes(redis, minutes_until(now_ms(), minutes), prefix), model)
