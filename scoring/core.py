"""The scoring core: raw feature records -> score, alert and dead-letter records, packed for the sink.

Records are validated (in bulk, the rest one by one), scored by the model version the driver chose, and
turned into score records (every transaction), alerts (a score at or above the model's threshold, with the
model's own contribution of each feature to the score: ``models.contributions``) and dead letters (records
that are not feature records, or that the model cannot score); with a shadow version, the shadow's score
records too. No Spark and no I/O here but the model's loading (``scoring.model_cache``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import pandas as pd
import pyarrow as pa

from contracts.events import SCHEMA_VERSION, DeadLetter, Reason, TxColumns
from contracts.records import ALERT_SOURCE_HEADER, Explanation, FeatureRecord, ScoreRecord, source_position
from contracts.settings import Topics
from features.counts import COUNTS_FIELDS, alert_sources, batch_counts, counts_row
from features.definitions import EVENT_TIME_MS, FEATURE_COLUMNS
from infra.arrow_json import Value, json_objects
from infra.spark.kafka_sink.records import HEADERS_ARROW_TYPE, RECORDS_COLUMN, SinkRows, pack_records
from models.registry import LoadedModel, MissingFeaturesError
from scoring.model_cache import worker_model
from validation.parse import MAX_DETAIL_CHARS, parse_event

C = TxColumns

#: Event fields of a feature record that its score record repeats.
SCORED_EVENT_FIELDS = (C.TX_ID, C.CARD_ID, C.TERMINAL_ID, C.AMOUNT, EVENT_TIME_MS)


#: What the scoring ``mapInArrow`` yields: a task's sink records, packed, and their counts (``features.counts``).
SCORED_SCHEMA = pa.schema([(RECORDS_COLUMN, pa.binary()), *COUNTS_FIELDS])


def explanations(model: LoadedModel, frame: pd.DataFrame) -> list[Explanation]:
    """For each row, the model's own contribution of each feature to its margin (``models.contributions``),
    largest magnitude first (ties in the model's column order), with the base margin and the method."""
    found = model.contributions(frame)
    if found.method == "none":
        return [Explanation(contributions={}, base_margin=None, method="none")] * len(frame)
    order = np.argsort(-np.abs(found.values), axis=1, kind="stable")
    names = model.feature_columns
    return [
        Explanation(
            contributions={
                names[j]: value for j, value in zip(ranks.tolist(), row[ranks].tolist(), strict=True)
            },
            base_margin=base,
            method=found.method,
        )
        for row, ranks, base in zip(found.values, order, found.base.tolist(), strict=True)
    ]


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
        """The sink records (``infra.spark.kafka_sink.records.COLUMNS``) for a batch of raw feature records."""
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
        ``records``); the others become dead letters in ``others``, with their reasons
        (:func:`parse_feature_record`)."""
        source = f"kafka:{self.topics.features}"
        good: list[FeatureRecord] = []
        raws: list[bytes] = []
        rows: list[int] = []
        columns = (records.column(name).to_pylist() for name in ("value", "partition", "offset"))
        for row, (raw, partition, offset) in enumerate(zip(*columns, strict=True)):
            found = parse_feature_record(raw or b"", source, self.max_event_bytes, partition, offset)
            if isinstance(found, DeadLetter):
                others.add_dead_letter(found, self.topics.dead_letter)
            else:
                good.append(found)
                raws.append(raw)
                rows.append(row)
        if good:
            event = {
                name: pa.array([getattr(record, name) for record in good]) for name in SCORED_EVENT_FIELDS
            }
            frame = pd.DataFrame.from_records([record.features for record in good], columns=FEATURE_COLUMNS)
            yield event, frame, pa.array(raws, pa.binary()), rows


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
        explained = explanations(model, frame.iloc[chosen])
        named = list(dict.fromkeys([*model.feature_columns, C.AMOUNT]))
        rows = frame[named].iloc[chosen].to_dict("records")
        for index, row, explanation in zip(chosen.tolist(), rows, explained, strict=True):
            scored = ScoreRecord.model_validate_json(values[index].as_py())
            others.add(
                topics.alerts,
                scored.card_id.encode(),
                scored.to_alert(row, explanation).model_dump_json().encode(),
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


def now_ms() -> int:
    return int(time.time() * 1000)
