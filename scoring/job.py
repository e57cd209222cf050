"""The streaming scoring job: features topic -> the champion model -> scores and alerts (Kafka) + Redis.

Each micro-batch of feature records is scored, vectorised, by one registered model version
(``mapInArrow``; each Python worker loads a version once and keeps it). Every transaction gets a score
record on the scores topic; those at or above the model's threshold also become alerts on the alerts
topic, both keyed by card and stamped with the transaction's event time. Records that are not feature
records go to the dead-letter topic with the reason.

Model updates without a restart: the driver re-reads the alias (``champion`` by default) every
``model_check_interval_s``. A new version is loaded once in the driver first; if that fails, the old
version keeps serving and the error is logged. The switch happens between micro-batches, and every
record names the version that scored it.

Delivery guarantee: exactly-once for read_committed consumers of the scores, alerts and dead-letter
topics. Each micro-batch is written with the sink's commit markers under its batch id (``foreachBatch``
plus ``batch.id``), and the model version used for each micro-batch is recorded in the checkpoint before
its rows are written, so a micro-batch re-run after a crash is scored by the same version and writes
nothing twice. Redis (``alert:{tx_id}``, ``card:{card}:alerts``, ``card:{card}:score``) is written after
each committed Kafka transaction, idempotently.
"""

from __future__ import annotations

import gc
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, Observation, SparkSession
from pyspark.sql.streaming import StreamingQuery

from contracts.errors import ConfigError, ServiceUnavailableError
from contracts.events import SCHEMA_VERSION, DeadLetter, Reason, TxColumns
from contracts.privacy import redact_url
from contracts.records import (
    ALERT_SOURCE_HEADER,
    AlertRecord,
    FeatureRecord,
    ScoreRecord,
    source_position,
)
from contracts.settings import Topics
from features.definitions import EVENT_TIME_MS, FEATURE_COLUMNS
from infra.arrow_json import Value, json_objects
from infra.checkpoints import PerBatch, pinned_layout, query_location
from infra.kafka_sink.config import KafkaSinkConfig, checkpoint_sink_id
from infra.kafka_sink.datasource import register as register_sink
from infra.kafka_sink.datasource import write_micro_batch
from infra.kafka_sink.records import (
    HEADERS_ARROW_TYPE,
    PACKED_DDL,
    RECORDS_COLUMN,
    SinkRows,
    newest_per_key,
    pack_records,
)
from infra.kafka_source.config import EARLIEST, LATEST, KafkaSourceConfig
from infra.kafka_source.datasource import read_stream
from infra.metrics import (
    COUNTS_DDL,
    COUNTS_FIELDS,
    OBSERVATION,
    alert_sources,
    batch_counts,
    counts_row,
    observations,
)
from infra.redis_store import RedisTarget, write_alerts, write_score_values
from infra.retry import wait_out
from infra.score_stats import score_stats, write_score_stats
from infra.spark import start_stream
from ingest.columnar import validate_many
from ingest.validation import MAX_DETAIL_CHARS, parse_event
from models.registry import (
    CHAMPION,
    MODEL_NAME,
    LoadedModel,
    MissingFeaturesError,
    ModelNotFoundError,
    load_model,
    resolve_version,
)

C = TxColumns
_log = logging.getLogger(__name__)

#: Event fields of a feature record that its score record repeats.
SCORED_EVENT_FIELDS = (C.TX_ID, C.CARD_ID, C.TERMINAL_ID, C.AMOUNT, EVENT_TIME_MS)
#: How many features an alert names as having driven its score.
TOP_FEATURES = 3


@dataclass(frozen=True)
class ScoringJobConfig:
    """What one run of the scoring job reads, uses and writes (all from parameters, never globals)."""

    kafka_config: dict[str, Any] = field(repr=False)  # credentials: never in a repr
    topics: Topics
    checkpoint: Path
    redis: RedisTarget
    tracking_uri: str = field(repr=False)  # may carry credentials (https://user:password@...)
    max_event_bytes: int
    model_check_interval_s: float
    alias: str = CHAMPION
    max_records_per_trigger: int | None = None
    #: A second alias scored beside the serving one (a challenger): its scores go to the shadow scores
    #: topic, never to alerts or Redis.
    shadow_alias: str | None = None
    #: Where the input is read from and, for a ``once`` run, up to (``infra.kafka_source.config``): a
    #: time range replays just that range.
    starting_offsets: str = EARLIEST
    ending_offsets: str = LATEST


#: What the scoring ``mapInArrow`` yields: a task's sink records, packed, and their counts (``infra.metrics``).
SCORED_SCHEMA = pa.schema([(RECORDS_COLUMN, pa.binary()), *COUNTS_FIELDS])
#: Gets each micro-batch's summed counts (``infra.metrics.COUNTS``) and the model versions that served it.
BatchObserver = Callable[[Mapping[str, Any], Mapping[str, int | None]], None]


# --- The model of each micro-batch (driver) ------------------------------------------------------------


class ModelChooser:
    """Which model version scores each micro-batch.

    The alias is re-read at most every ``interval_s``, off the micro-batch's path: the check runs in a
    thread of its own and a micro-batch waits for it at most ``check_timeout_s`` (an MLflow outage costs
    one such wait per interval, never a stalled job; the version serving goes on serving). A version that
    fails to load keeps the current one serving. The choice for each batch id is recorded in ``path``
    before the batch is written, so a re-run of a batch (after a crash) uses the version it used the first
    time.
    """

    #: Batch ids remembered: a re-run is always the last batch or so.
    KEPT = 100

    def __init__(
        self, tracking_uri: str, alias: str, *, interval_s: float, path: Path, check_timeout_s: float = 2.0
    ) -> None:
        self.tracking_uri = tracking_uri
        self.alias = alias
        self.interval_s = interval_s
        self.check_timeout_s = check_timeout_s
        self.chosen = PerBatch(path, self.KEPT)
        self.current: LoadedModel | None = None
        self.checked_at = -float("inf")
        self._checking: threading.Thread | None = None
        self._failing = False

    def version_for(self, batch_id: int) -> int:
        """The version that scores ``batch_id`` (recorded before it is returned)."""
        return int(self.chosen.get(batch_id, self._serving))

    def _serving(self) -> int:
        """The version serving now (the alias checked if it is time)."""
        if self.current is None:
            self.refresh()  # the first: raises when there is no model at all
        elif time.monotonic() - self.checked_at >= self.interval_s:
            self._check()
        if self.current is None:  # pragma: no cover - refresh raises instead
            raise ModelNotFoundError(f"no model for alias {self.alias!r}")
        return self.current.version

    def _check(self) -> None:
        """Re-read the alias in the background, waiting for it at most ``check_timeout_s``; while an
        earlier check still waits for the registry, the micro-batch does not wait at all."""
        if self._checking is not None and self._checking.is_alive():
            return
        self.checked_at = time.monotonic()
        self._checking = threading.Thread(target=self.refresh, name=f"alias-{self.alias}", daemon=True)
        self._checking.start()
        self._checking.join(self.check_timeout_s)

    def refresh(self) -> None:
        """Re-read the alias; switch to its version if that version loads.

        Raises:
            ModelNotFoundError: there is no model to serve at all (nothing loaded yet).
        """
        self.checked_at = time.monotonic()
        try:
            version = resolve_version(self.tracking_uri, self.alias)
            loaded = (
                self.current
                if self.current is not None and version == self.current.version
                else load_model(self.tracking_uri, version=version)
            )
        except Exception as exc:
            if self.current is None:
                raise
            if not self._failing:  # one line per outage, not one per check
                _log.error(
                    "model alias %r: cannot check or switch (%s); version %d keeps serving",
                    self.alias,
                    exc,
                    self.current.version,
                )
            self._failing = True
            return
        if self._failing:
            _log.warning("model alias %r: checks work again", self.alias)
            self._failing = False
        if self.current is not None and loaded.version != self.current.version:
            _log.warning(
                "model alias %r moved: version %d -> %d from the next micro-batch",
                self.alias,
                self.current.version,
                loaded.version,
            )
        self.current = loaded


# --- Scoring (Python workers) ---------------------------------------------------------------------------

#: Models loaded in this worker process, by (tracking URI, version).
_MODELS: dict[tuple[str, int], LoadedModel] = {}


#: Versions a worker keeps loaded: the one serving and the shadow's.
KEPT_MODELS = 2


def worker_model(tracking_uri: str, version: int) -> LoadedModel:
    """The model version, loaded once per worker process (the oldest loaded one is dropped). A worker
    that needs it while MLflow is away waits for MLflow (``infra.retry.wait_out``) rather than fail."""
    key = (tracking_uri, version)
    if key not in _MODELS:
        while len(_MODELS) >= KEPT_MODELS:
            del _MODELS[next(iter(_MODELS))]  # a replaced version is never needed again
        _MODELS[key] = wait_out(
            lambda: load_model(tracking_uri, version=version),
            f"MLflow at {redact_url(tracking_uri)}",
            (ServiceUnavailableError,),
        )
        # The model, and the MLflow and scikit-learn modules imported to load it, live as long as the
        # worker: out of the full collection PySpark runs after every task (it took 100-300 ms a task).
        # Unfrozen first, so that the collection frees what the replaced model leaves behind.
        gc.unfreeze()
        gc.collect()
        gc.freeze()
    return _MODELS[key]


def top_features(model: LoadedModel, frame: pd.DataFrame, k: int = TOP_FEATURES) -> list[list[str]]:
    """For each row, the ``k`` features that drove its score most, strongest first.

    A cheap, model-agnostic attribution: how far each (scaled) feature value is from the training mean,
    weighted by the model's global importance of that feature (tree importances, or the absolute
    coefficients of a linear model; equal weights when the model has neither).
    """
    values = frame[list(model.feature_columns)].to_numpy(dtype=np.float64)
    steps = getattr(model.model, "named_steps", {})
    scaler = next((s for s in steps.values() if hasattr(s, "scale_") and hasattr(s, "mean_")), None)
    scaled = (values - scaler.mean_) / scaler.scale_ if scaler is not None else values
    estimator = steps[list(steps)[-1]] if steps else model.model
    weights = getattr(estimator, "feature_importances_", None)
    if weights is None and hasattr(estimator, "coef_"):
        weights = np.abs(np.ravel(estimator.coef_))
    if weights is None or len(weights) != values.shape[1]:
        weights = np.ones(values.shape[1])
    drive = np.abs(np.nan_to_num(scaled)) * weights
    order = np.argsort(-drive, axis=1, kind="stable")[:, :k]
    names = np.asarray(model.feature_columns, dtype=object)
    return [list(names[row]) for row in order]


@dataclass(frozen=True, kw_only=True)
class Scorer:
    """``mapInArrow`` function: raw feature records -> score, alert and dead-letter records, packed for the
    sink; with a shadow version, the shadow's score records too.

    Score records are built column by column (``infra.arrow_json``); alerts, a small share, one by one.
    """

    tracking_uri: str
    version: int
    topics: Topics
    max_event_bytes: int
    shadow_version: int | None = None
    #: The records' ``scored_at_ms``: the micro-batch's, recorded in the checkpoint, so that a re-run writes
    #: the same records (None: now).
    scored_at_ms: int | None = None

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        model = worker_model(self.tracking_uri, self.version)
        shadow = None if self.shadow_version is None else worker_model(self.tracking_uri, self.shadow_version)
        for records in batches:
            if records.num_rows:
                scored = self.score(model, records, shadow)
                counts = counts_row(batch_counts(scored, self.topics), alert_sources(scored, self.topics))
                yield pa.RecordBatch.from_pydict(
                    {RECORDS_COLUMN: [pack_records(scored)], **counts}, schema=SCORED_SCHEMA
                )

    def score(
        self, model: LoadedModel, records: pa.RecordBatch, shadow: LoadedModel | None = None
    ) -> pa.Table:
        """The sink records (``infra.kafka_sink.records.COLUMNS``) for a batch of raw feature records."""
        others = SinkRows()
        scored = []
        at_ms = now_ms() if self.scored_at_ms is None else self.scored_at_ms
        for event, frame, raws, rows in self.valid(records, others):
            source_of = _renumbered(lambda i: position_of(records, i), rows)
            scored.append(score_rows(model, event, frame, raws, self.topics, others, at_ms, source_of))
            if shadow is not None:
                scored.append(shadow_rows(shadow, event, frame, topics=self.topics, scored_at_ms=at_ms))
        batches = [batch for batch in (*scored, others.batch()) if batch is not None]
        return pa.Table.from_batches(batches)

    def valid(
        self, records: pa.RecordBatch, others: SinkRows
    ) -> Iterator[tuple[dict[str, pa.Array], pd.DataFrame, pa.Array, list[int]]]:
        """The valid feature records as (event columns, feature frame, raw values, their rows in
        ``records``), in one or two parts; the others become dead letters in ``others``.

        Records are validated in bulk (``ingest.columnar``); the few it cannot decide go through
        ``parse_event`` one by one, which also gives dead letters their reasons.
        """
        values = records.column("value")
        found = validate_many(FeatureRecord, values, self.max_event_bytes, {"features": FEATURE_COLUMNS})
        if found.table.num_rows:
            table = found.table
            features = table.column("features").combine_chunks()
            frame = pd.DataFrame(
                {name: features.field(name).to_numpy(zero_copy_only=False) for name in FEATURE_COLUMNS}
            )
            event = {name: table.column(name).combine_chunks() for name in SCORED_EVENT_FIELDS}
            yield event, frame, values.take(found.positions), found.positions.tolist()
        if len(found.slow):
            slow = found.slow.tolist()
            source = f"kafka:{self.topics.features}"
            good: list[FeatureRecord] = []
            raws: list[bytes] = []
            rows: list[int] = []
            for row, raw, partition, offset in zip(
                slow,
                values.take(slow).to_pylist(),
                records.column("partition").take(slow).to_pylist(),
                records.column("offset").take(slow).to_pylist(),
                strict=True,
            ):
                event_or_letter = parse_feature_record(
                    raw or b"", source, self.max_event_bytes, partition, offset
                )
                if isinstance(event_or_letter, DeadLetter):
                    others.add_dead_letter(event_or_letter, self.topics.dead_letter)
                else:
                    good.append(event_or_letter)
                    raws.append(raw)
                    rows.append(row)
            if good:
                event = {
                    name: pa.array([getattr(record, name) for record in good]) for name in SCORED_EVENT_FIELDS
                }
                frame = pd.DataFrame.from_records([record.features for record in good])
                yield event, frame, pa.array(raws), rows


def position_of(records: pa.RecordBatch, row: int) -> str:
    """The source position (``contracts.records.source_position``) of a source batch's record."""
    return source_position(*(records.column(name)[row].as_py() for name in ("topic", "partition", "offset")))


def _renumbered(source_of: Callable[[int], str], rows: list[int]) -> Callable[[int], str]:
    """``source_of`` for the i-th of ``rows``."""
    return lambda i: source_of(rows[i])


def parse_feature_record(
    raw: bytes, source: str, max_bytes: int, partition: int | None = None, offset: int | None = None
) -> FeatureRecord | DeadLetter:
    """A feature record that carries exactly the features the scoring stage knows, or a dead letter."""
    record = parse_event(FeatureRecord, raw, source, max_bytes, partition, offset)
    if isinstance(record, DeadLetter):
        return record
    missing = [name for name in FEATURE_COLUMNS if name not in record.features]
    unknown = sorted(set(record.features) - set(FEATURE_COLUMNS))
    if not missing and not unknown:
        return record
    reason, names = (Reason.MISSING_FIELD, missing) if missing else (Reason.UNEXPECTED_FIELD, unknown)
    problem = "missing" if missing else "not known"
    return DeadLetter(
        raw=raw,
        source=source,
        reason=reason,
        detail=f"features: {problem}: {', '.join(names)}"[:MAX_DETAIL_CHARS],
        partition=partition,
        offset=offset,
    )


def score_rows(
    model: LoadedModel,
    event: dict[str, pa.Array],
    features: pd.DataFrame,
    raws: pa.Array,
    topics: Topics,
    others: SinkRows,
    scored_at_ms: int,
    source_of: Callable[[int], str] | None = None,
) -> pa.RecordBatch | None:
    """Score records of valid feature records (returned); their alerts and dead letters go to ``others``.

    ``event`` holds the records' event fields as columns, ``features`` their feature values and ``raws``
    the feature records as they are on the features topic (the dead letters' content); ``source_of(i)``
    where the i-th came from (``contracts.records.source_position``: its alert's header, asked of alerts
    only). A record the model
    cannot score becomes a dead letter (``unscorable``) alone; the others are scored.
    """
    frame = features.assign(**{C.AMOUNT: event[C.AMOUNT].to_numpy()})
    source = f"kafka:{topics.features}"
    try:
        scores, failed = score_each(model, frame)
    except MissingFeaturesError as exc:  # the batch lacks a column: no record of it can be scored
        scores, failed = np.full(len(frame), np.nan), dict.fromkeys(range(len(frame)), str(exc))
    if failed:
        for position, why in failed.items():
            letter = DeadLetter(
                raw=raws[position].as_py(),
                source=source,
                reason=Reason.UNSCORABLE,
                detail=f"the model cannot score it: {why}"[:MAX_DETAIL_CHARS],
            )
            others.add_dead_letter(letter, topics.dead_letter)
        kept = np.setdiff1d(np.arange(len(frame)), np.fromiter(failed, dtype=np.int64))
        if not len(kept):
            return None
        taken = pa.array(kept)
        event = {name: column.take(taken) for name, column in event.items()}
        if source_of is not None:
            source_of = _renumbered(source_of, kept.tolist())
        frame, scores = frame.iloc[kept].reset_index(drop=True), scores[kept]
    alerting = scores >= model.threshold
    values = score_values(
        event,
        scored_at_ms=scored_at_ms,
        scores=pa.array(scores, pa.float64()),
        alerts=pa.array(alerting),
        model=model,
    )
    if alerting.any():
        chosen = np.flatnonzero(alerting)
        drivers = top_features(model, frame.iloc[chosen])
        named = list(dict.fromkeys([*model.feature_columns, C.AMOUNT]))
        rows = frame[named].iloc[chosen].to_dict("records")
        for index, row, driving in zip(chosen.tolist(), rows, drivers, strict=True):
            scored = ScoreRecord.model_validate_json(values[index].as_py())
            others.add(
                topics.alerts,
                scored.card_id.encode(),
                scored.to_alert(row, driving).model_dump_json().encode(),
                scored.event_time_ms,
                None if source_of is None else [(ALERT_SOURCE_HEADER, source_of(index).encode())],
            )
    return score_batch(topics.scores, event, values)


def shadow_rows(
    model: LoadedModel,
    event: dict[str, pa.Array],
    features: pd.DataFrame,
    *,
    topics: Topics,
    scored_at_ms: int,
) -> pa.RecordBatch | None:
    """The shadow model's score records of valid feature records, for the shadow scores topic: the same
    record as a live score (``alert`` says whether it would have alerted), never an alert, never Redis.
    Rows it cannot score are left out (the live model's dead letters already cover bad records)."""
    frame = features.assign(**{C.AMOUNT: event[C.AMOUNT].to_numpy()})
    scores, failed = score_each(model, frame)
    kept = np.setdiff1d(np.arange(len(frame)), np.fromiter(failed, dtype=np.int64))
    if not len(kept):
        return None
    taken = pa.array(kept)
    event = {name: column.take(taken) for name, column in event.items()}
    scores = scores[kept]
    values = score_values(
        event,
        scored_at_ms=scored_at_ms,
        scores=pa.array(scores, pa.float64()),
        alerts=pa.array(scores >= model.threshold),
        model=model,
    )
    return score_batch(topics.shadow_scores, event, values)


def score_batch(topic: str, event: dict[str, pa.Array], values: pa.Array) -> pa.RecordBatch:
    """Sink records of score records: keyed by card, the transaction's event time as Kafka timestamp."""
    n = len(values)
    return pa.RecordBatch.from_arrays(
        [
            pa.array([topic] * n, pa.string()),
            event[C.CARD_ID].cast(pa.binary()),
            values,
            event[EVENT_TIME_MS].cast(pa.int64()),
            pa.nulls(n, HEADERS_ARROW_TYPE),
        ],
        names=list(SinkRows.NAMES),
    )


#: Model calls one batch may spend finding the rows the model cannot score (halving the rows each time).
MAX_SCORE_CALLS = 256


def score_each(model: LoadedModel, frame: pd.DataFrame) -> tuple[np.ndarray, dict[int, str]]:
    """Scores of the rows, and for those the model refuses (NaN in the scores), why, by position.

    The whole frame is scored at once; only when the model raises are the rows halved until the ones it
    refuses are found alone: a few bad rows cost a few dozen calls. Past :data:`MAX_SCORE_CALLS`, a part
    that still fails is refused whole rather than spend more.
    """
    scores = np.full(len(frame), np.nan)
    failed: dict[int, str] = {}
    calls = 0
    parts = [(0, len(frame))]
    while parts:
        start, stop = parts.pop()
        calls += 1
        try:
            scores[start:stop] = model.score(frame.iloc[start:stop])
            continue
        except MissingFeaturesError:
            raise
        except Exception as exc:  # models raise ValueError, OverflowError, ... on values they cannot take
            why = f"{type(exc).__name__}: {exc}"
        if stop - start == 1 or calls >= MAX_SCORE_CALLS:
            failed.update(dict.fromkeys(range(start, stop), why))
            continue
        middle = (start + stop) // 2
        parts += [(middle, stop), (start, middle)]
    for position in np.flatnonzero(~np.isfinite(scores)).tolist():
        failed.setdefault(position, "the model gave no finite score")
    return scores, dict(sorted(failed.items()))


def score_values(
    event: dict[str, pa.Array], *, scored_at_ms: int, scores: pa.Array, alerts: pa.Array, model: LoadedModel
) -> pa.Array:
    """``ScoreRecord`` JSON of each scored transaction, field for field in the record's own order."""
    given: dict[str, Value] = {
        **event,
        "schema_version": SCHEMA_VERSION,
        "scored_at_ms": scored_at_ms,
        "score": scores,
        "threshold": model.threshold,
        "model_name": model.name,
        "model_version": model.version,
        "alert": alerts,
    }
    return json_objects([(name, given[name]) for name in ScoreRecord.model_fields])


# --- Redis, after each committed Kafka transaction ------------------------------------------------------


@dataclass(frozen=True)
class ScoresToRedis:
    """The sink's after-commit hook: alerts, then the newest score of each card, into Redis.

    Alerts go first: they are few and what alert consumers wait for; the scores are one per card.
    """

    redis: RedisTarget
    alerts_topic: str
    scores_topic: str

    def __call__(self, batches: list[pa.RecordBatch]) -> None:
        alerts = [
            AlertRecord.model_validate_json(value) for value in topic_values(batches, self.alerts_topic)
        ]
        prefix, retention_s = self.redis.prefix, self.redis.retention_s
        if alerts:
            self.redis.write(lambda client: write_alerts(client, alerts, prefix, retention_s))
        # Only the newest score per card is stored: read just those (ties are broken by tx id).
        scores = newest_per_key(batches, self.scores_topic)
        self.redis.write(lambda client: write_score_values(client, scores, prefix, retention_s))
        # Every score counts in the live page's figures (infra.score_stats: once per task and micro-batch).
        stats = score_stats(topic_values(batches, self.scores_topic))
        self.redis.write(lambda client: write_score_stats(client, stats, prefix, retention_s))


def topic_values(batches: list[pa.RecordBatch], topic: str) -> list[bytes]:
    """The values of the sink rows for ``topic``."""
    return [
        value
        for batch in batches
        for value in batch.column("value").filter(pc.equal(batch.column("topic"), topic)).to_pylist()
    ]


# --- The query -------------------------------------------------------------------------------------------


def feature_records(spark: SparkSession, config: ScoringJobConfig) -> DataFrame:
    """The raw records of the features topic, as a stream."""
    source = KafkaSourceConfig(
        kafka_config=config.kafka_config,
        topics=(config.topics.features,),
        max_records_per_trigger=config.max_records_per_trigger,
        starting_offsets=config.starting_offsets,
        ending_offsets=config.ending_offsets,
        # One task per core when the checkpoint starts; a restart elsewhere keeps the count: a re-run
        # micro-batch must give each write task (and its exactly-once marker) the rows it had the first time.
        read_tasks=pinned_layout(config.checkpoint, {"read_tasks": spark.sparkContext.defaultParallelism})[
            "read_tasks"
        ],
    )
    return read_stream(spark, source)


def model_chooser(
    tracking_uri: str, alias: str, *, interval_s: float, checkpoint: Path, role: str = "model"
) -> ModelChooser:
    """The chooser of a job's model versions (``role``: the serving ``model`` or the ``shadow``), with the
    current one loaded.

    Raises:
        ModelNotFoundError: no model holds the alias (train one with ``fraud train``): the job fails at
            its start, not in its first micro-batch.
        ConfigError: the model needs features the feature records do not carry.
    """
    checkpoint.mkdir(parents=True, exist_ok=True)
    chooser = ModelChooser(
        tracking_uri, alias, interval_s=interval_s, path=checkpoint / f"{role}-versions.json"
    )
    chooser.refresh()
    if chooser.current is not None:
        check_computable(chooser.current, f"{MODEL_NAME}@{alias} (version {chooser.current.version})")
    return chooser


def now_ms() -> int:
    return int(time.time() * 1000)


def scoring_clock(checkpoint: Path) -> PerBatch:
    """When each micro-batch is scored (its records' ``scored_at_ms``), recorded in the checkpoint before
    the batch is written: a re-run writes the same records, and Redis agrees with the topic."""
    return PerBatch(checkpoint / "scored-at.json")


def check_computable(model: LoadedModel, name: str) -> None:
    """Raise ConfigError when ``model`` needs a feature the feature definitions do not compute."""
    missing = sorted(set(model.feature_columns) - {*FEATURE_COLUMNS, C.AMOUNT})
    if missing:
        raise ConfigError(f"{name} needs features the feature job does not compute: {', '.join(missing)}")


def batch_versions(batch_id: int, chooser: ModelChooser, shadow: ModelChooser | None) -> dict[str, int]:
    """The versions that score ``batch_id``, by role: the serving ``model`` and, with one, the ``shadow``."""
    versions = {"model": chooser.version_for(batch_id)}
    if shadow is not None:
        versions["shadow"] = shadow.version_for(batch_id)
    return versions


def model_choosers(
    tracking_uri: str, *, alias: str, shadow_alias: str | None, interval_s: float, checkpoint: Path
) -> tuple[ModelChooser, ModelChooser | None]:
    """The choosers of a job's serving model and of its shadow (None without one): see
    :func:`model_chooser`."""
    shadow = (
        None
        if shadow_alias is None
        else model_chooser(
            tracking_uri, shadow_alias, interval_s=interval_s, checkpoint=checkpoint, role="shadow"
        )
    )
    return model_chooser(tracking_uri, alias, interval_s=interval_s, checkpoint=checkpoint), shadow


def start_scoring_job(
    spark: SparkSession,
    config: ScoringJobConfig,
    *,
    once: bool,
    trigger_interval_s: float = 1.0,
    on_batch: BatchObserver | None = None,
) -> StreamingQuery:
    """Start the streaming scoring job: ``once`` scores everything available, then stops. ``on_batch`` gets
    each micro-batch's counts and model versions (``infra.metrics.JobMetrics.on_batch``).

    Raises:
        ModelNotFoundError: no model holds the alias (train one with ``fraud train``).
    """
    register_sink(spark)
    chooser, shadow = model_choosers(
        config.tracking_uri,
        alias=config.alias,
        shadow_alias=config.shadow_alias,
        interval_s=config.model_check_interval_s,
        checkpoint=config.checkpoint,
    )
    sink = KafkaSinkConfig(
        kafka_config=config.kafka_config,
        sink_id=checkpoint_sink_id(config.checkpoint, "scores"),
        marker_topic=config.topics.scores,
        after_commit=ScoresToRedis(config.redis, config.topics.alerts, config.topics.scores),
    )

    clock = scoring_clock(config.checkpoint)

    def score_micro_batch(records: DataFrame, batch_id: int) -> None:
        versions = batch_versions(batch_id, chooser, shadow)
        scorer = Scorer(
            tracking_uri=config.tracking_uri,
            version=versions["model"],
            topics=config.topics,
            max_event_bytes=config.max_event_bytes,
            shadow_version=versions.get("shadow"),
            scored_at_ms=clock.get(batch_id, now_ms),
        )
        counted = Observation(OBSERVATION)
        scored = records.mapInArrow(scorer, f"{PACKED_DDL}, {COUNTS_DDL}")
        observed = scored.observe(counted, *observations())
        write_micro_batch(observed.select(RECORDS_COLUMN), sink, batch_id)
        if on_batch is not None:
            on_batch(counted.get, versions)

    writer = (
        feature_records(spark, config)
        .writeStream.foreachBatch(score_micro_batch)
        .option("checkpointLocation", str(query_location(config.checkpoint)))
        .queryName(f"scoring-{config.topics.scores}")
    )
    return start_stream(writer, once, trigger_interval_s)
