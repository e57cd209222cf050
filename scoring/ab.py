"""A/B replays: two models score the same transactions of a range of history, and the frame the comparison
(``models.comparison``) judges them on.

The range is replayed from the features topic (Kafka is the system of record): a bounded Spark read of the
records whose event time is in [start, end), each scored by both models in the same task, so both see the
same transactions in the same state. When the features topic lacks what a model needs (records of an
older feature job), the features are recomputed from the transactions and labels topics by the batch path
of the same definitions (``recomputed_pairs``). Or, in shadow mode, the live job has scored every
transaction with both already (its scores and shadow scores topics), and the replay only pairs them.

The test protocol is the training's, from one function (``models.splits.evaluation_days``): each day, the
cards with a fraud already known before the day are left out (they would be blocked, not scored; which
frauds count is the protocol's ``known_frauds`` rule), and a transaction's label is whether a fraud label
for it was known by the end of the range plus the label delay.

Delivery guarantee: none needed; a replay only reads, and writes nothing to any topic, Redis key or
checkpoint.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pandas as pd
import pyarrow as pa
from pyspark.sql import SparkSession

from contracts.events import TxColumns
from contracts.records import ScoreRecord
from contracts.settings import Topics
from features.definitions import EVENT_TIME_MS, FeatureParams
from infra.spark.kafka_sink.records import SinkRows
from infra.spark.kafka_source import KafkaInput, read_batch
from infra.spark.schemas import spark_ddl
from models.comparison import CARD_ID, DAY, LABEL, SCORE_A, SCORE_B, TX_ID
from models.registry import LoadedModel
from models.replay import ReplayedEvents, replay_dataset
from models.splits import TARGET, EvalProtocol, evaluation_days
from scoring.core import Scorer, score_each
from scoring.model_cache import worker_model

C = TxColumns

#: What the pair scorer yields: a transaction and both models' scores (NaN where a model cannot score it).
PAIR_FIELDS = pa.schema(
    [
        (TX_ID, pa.int64()),
        (CARD_ID, pa.string()),
        (EVENT_TIME_MS, pa.int64()),
        (SCORE_A, pa.float64()),
        (SCORE_B, pa.float64()),
    ]
)


@dataclass(frozen=True, kw_only=True)
class PairScorer:
    """``mapInArrow`` function: raw feature records -> the scores by both versions of each valid record
    with an event time in [start_ms, end_ms).

    Records the scoring job would dead-letter are left out here (they are on the dead-letter topic since
    the live run); a record one model cannot score keeps a NaN for it.
    """

    tracking_uri: str
    version_a: int
    version_b: int
    topics: Topics
    max_event_bytes: int
    start_ms: int
    end_ms: int

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        models = [worker_model(self.tracking_uri, version) for version in (self.version_a, self.version_b)]
        validator = Scorer(
            tracking_uri=self.tracking_uri,
            version=self.version_a,
            topics=self.topics,
            max_event_bytes=self.max_event_bytes,
        )
        for records in batches:
            for event, all_features, _, _ in validator.valid(records, SinkRows()):
                times = event[EVENT_TIME_MS].to_numpy(zero_copy_only=False)
                keep = (times >= self.start_ms) & (times < self.end_ms)
                if not keep.any():
                    continue
                event = {name: column.filter(pa.array(keep)) for name, column in event.items()}
                features = all_features[keep].reset_index(drop=True)
                frame = features.assign(**{C.AMOUNT: event[C.AMOUNT].to_numpy(zero_copy_only=False)})
                scores = [score_each(model, frame)[0] for model in models]
                yield pa.RecordBatch.from_arrays(
                    [
                        event[C.TX_ID].cast(pa.int64()),
                        event[C.CARD_ID].cast(pa.string()),
                        event[EVENT_TIME_MS].cast(pa.int64()),
                        pa.array(scores[0], pa.float64()),
                        pa.array(scores[1], pa.float64()),
                    ],
                    schema=PAIR_FIELDS,
                )


def score_range(spark: SparkSession, kafka_config: dict[str, object], scorer: PairScorer) -> pd.DataFrame:
    """Both models' scores of every feature record of the scorer's range, one row per transaction (a
    transaction on the topic twice counts once).

    The whole topic is read: the feature job writes in processing order, bucket by bucket, so a record's
    offset says little about its event time (a time index would skip records), and the range is cut by
    event time before any scoring.
    """
    source = KafkaInput(kafka_config, (scorer.topics.features,))
    pairs = pd.DataFrame(read_batch(spark, source).mapInArrow(scorer, spark_ddl(PAIR_FIELDS)).toPandas())
    return pairs.drop_duplicates(TX_ID).reset_index(drop=True)


def recomputed_pairs(
    models: tuple[LoadedModel, LoadedModel],
    events: ReplayedEvents,
    params: FeatureParams,
    *,
    start_ms: int,
    end_ms: int,
) -> pd.DataFrame:
    """Both models' scores of every transaction with an event time in [start_ms, end_ms), its features
    computed from the replayed transactions and labels (the batch path, exact to the feature job's)."""
    rows = replay_dataset(events, params, since_ms=start_ms, until_ms=end_ms).rows
    rows = rows[(rows[EVENT_TIME_MS] >= start_ms) & (rows[EVENT_TIME_MS] < end_ms)].reset_index(drop=True)
    scores = [score_each(model, rows)[0] for model in models]
    return pd.DataFrame(
        {
            TX_ID: rows[C.TX_ID].astype(np.int64),
            CARD_ID: rows[C.CARD_ID].astype(str),
            EVENT_TIME_MS: rows[EVENT_TIME_MS].astype(np.int64),
            SCORE_A: scores[0],
            SCORE_B: scores[1],
        }
    )


def shadow_pairs(scores: list[ScoreRecord], shadow_scores: list[ScoreRecord]) -> pd.DataFrame:
    """Pair the live scores with the shadow's of the same transactions."""
    shadow = {record.tx_id: record for record in shadow_scores}
    rows = [
        (record.tx_id, record.card_id, record.event_time_ms, record.score, shadow[record.tx_id].score)
        for record in scores
        if record.tx_id in shadow
    ]
    frame = pd.DataFrame(rows, columns=list(PAIR_FIELDS.names)).drop_duplicates(TX_ID)
    return frame.reset_index(drop=True)


def evaluation_frame(
    pairs: pd.DataFrame, labels: pd.DataFrame, start_ms: int, end_ms: int, protocol: EvalProtocol
) -> pd.DataFrame:
    """The comparison's frame (``models.comparison.COLUMNS``) of scored transactions in [start_ms, end_ms),
    under the test protocol of training (``models.splits.evaluation_days``).

    Args:
        pairs: ``PAIR_FIELDS`` rows; rows either model could not score are dropped.
        labels: the label table (``models.dataset.LABEL_TABLE_COLUMNS``) of the labels topic.
        start_ms: the range's start; days count from it.
        end_ms: the range's end.
        protocol: which known frauds remove a card, and the label delay.
    """
    scored = pairs[np.isfinite(pairs[SCORE_A]) & np.isfinite(pairs[SCORE_B])]
    frame = evaluation_days(scored, labels, start_ms, end_ms, protocol, day_column=DAY).rows
    frame = frame.rename(columns={TARGET: LABEL})
    return frame[[TX_ID, CARD_ID, DAY, LABEL, SCORE_A, SCORE_B]].sort_values([DAY, TX_ID], ignore_index=True)
