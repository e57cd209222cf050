"""The streaming feature job as the integration tests run it: simulated input with the batch path's
features as reference, clients with topics of their own, the job's config over a test's topics, one
availableNow run of the job, and the checks of its output against the batch path."""

from __future__ import annotations

import collections
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pandas as pd
import redis
from confluent_kafka import Message
from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQuery

from contracts.events import SCHEMA_VERSION, TransactionEvent, TxColumns
from contracts.records import FeatureRecord
from contracts.redis_keys import card_features_key
from contracts.settings import DEFAULT_RETENTION_S, Settings, Topics
from features.batch import transactions_features
from features.definitions import EVENT_TIME_MS, FeatureParams
from features.job import FeatureJobConfig, start_feature_job
from features.state_layout import Start, bind
from infra.clients import Clients, Endpoints
from infra.embedded.stack import StackInfo
from infra.kafka.admin import ensure_topics
from infra.kafka.log import read_topic
from infra.redis.connection import RedisTarget
from infra.spark.session import ONCE
from ingest.files import clean_table
from ingest.produce import EventBatch, events_from_table
from ingest.simulator import SimulatorConfig, simulate
from models.registry import load_model
from scoring.core import score_each

C = TxColumns
MAX_EVENT_BYTES = 16_384
#: Feature values equal to the batch path's within this.
TOLERANCE = 1e-9
JOB_TIMEOUT_S = 240


@dataclass
class Simulated:
    """A simulated table's events as ingest builds them, and the batch path's features of the table."""

    events: EventBatch
    reference: pd.DataFrame  # tx_id (index), then the feature columns
    transactions: dict[int, TransactionEvent]  # the events as produced, by tx_id


def simulated(config: SimulatorConfig, settings: Settings, params: FeatureParams) -> Simulated:
    """Simulate, build the events (tokenised with the settings' key, labels the settings' label delay later)
    and the reference."""
    frame = simulate(config)
    key = settings.token_key.get_secret_value().encode()
    events = events_from_table(
        clean_table(frame, "sim"), "sim", key, settings.label_delay_ms, MAX_EVENT_BYTES
    )
    assert not events.dead_letters
    reference = transactions_features(frame, "sim", params, MAX_EVENT_BYTES)
    assert len(reference.features) == len(frame) and not reference.rejected
    transactions = {
        event.tx_id: event for event in map(TransactionEvent.model_validate_json, events.tx_values)
    }
    return Simulated(events, reference.features.set_index(C.TX_ID).sort_index(), transactions)


def prefix_of(topics: Topics) -> str:
    """The prefix of topics made by ``Topics.with_prefix`` (the jobs use it for their Redis keys too)."""
    return topics.features.removesuffix(Topics().features)


def job_config(
    clients: Clients,
    topics: Topics,
    checkpoint: Path,
    max_records: int | None,
    params: FeatureParams | None = None,
) -> FeatureJobConfig:
    """The job over ``topics`` with Redis keys under the topics' prefix."""
    return FeatureJobConfig(
        kafka_config=clients.kafka_config(),
        topics=topics,
        checkpoint=checkpoint,
        redis=RedisTarget(clients.endpoints.redis_url, prefix_of(topics), DEFAULT_RETENTION_S),
        params=params or FeatureParams(),
        max_event_bytes=MAX_EVENT_BYTES,
        max_records_per_trigger=max_records,
    )


def stopped(
    query: StreamingQuery,
    job: str,
    *,
    timeout_s: float = JOB_TIMEOUT_S,
    ended: Callable[[dict[str, Any]], bool] | None = None,
) -> StreamingQuery:
    """``query``, started with the availableNow trigger, once it has stopped by itself within ``timeout_s``
    and without an error (it is stopped in any case); ``job`` names it in the failures. ``ended``: it is also
    done after a micro-batch whose progress report this says is the last (a run of a time range), as
    ``fraud ... run`` stops it."""
    deadline = time.monotonic() + timeout_s
    try:
        while not (finished := query.awaitTermination(1)) and time.monotonic() < deadline:
            if ended is not None and any(ended(progress) for progress in query.recentProgress):
                finished = True
                break
    finally:
        query.stop()
    assert finished, f"the {job} did not finish within {timeout_s} s"
    assert query.exception() is None, f"the {job} failed: {query.exception()}"
    return query


def finished_query(
    spark: SparkSession, config: FeatureJobConfig, start: Start | None = None
) -> StreamingQuery:
    """Run the job with the availableNow trigger until it stops, from ``start`` (``fraud.savepoints.plan_start``
    made its checkpoint ready; None: its checkpoint as it is, bound to its state first, as ``fraud features
    run`` binds it without a savepoint); the stopped query (its plans and progress reports can still be read)."""
    if start is None:
        bind(config.checkpoint, config.state)
        start = Start()
    return stopped(start_feature_job(spark, config, start, ONCE), "feature job", ended=config.ended)


def run_once(spark: SparkSession, config: FeatureJobConfig) -> list[dict[str, Any]]:
    """Run the job with the availableNow trigger until it stops; its micro-batches' progress reports."""
    return [dict(progress) for progress in finished_query(spark, config).recentProgress]


def isolated_clients(stack: StackInfo, home: Path, **settings_given: Any) -> Clients:
    """Clients of settings with topics of their own (created), for fixtures wider than one test; other
    settings as given."""
    settings = Settings(
        home=home,
        bootstrap_servers=stack.bootstrap_servers,
        redis_url=stack.redis_url,
        mlflow_tracking_uri=stack.mlflow_tracking_uri,
        topics=Topics().with_prefix(f"test-{uuid.uuid4().hex[:10]}-"),
        partitions=3,
        **settings_given,
    )
    clients = Clients(
        settings, Endpoints(stack.bootstrap_servers, stack.redis_url, stack.mlflow_tracking_uri)
    )
    ensure_topics(clients.admin(), settings.topics.all(), settings.partitions, settings.replication_factor)
    return clients


@dataclass
class FeatureOutput:
    """The features topic as a read_committed consumer sees it."""

    records: list[Message]

    def counts(self) -> collections.Counter[int]:
        return collections.Counter(orjson.loads(m.value() or b"null")[C.TX_ID] for m in self.records)

    def by_tx(self) -> dict[int, Message]:
        """One record per transaction (the first one seen)."""
        found: dict[int, Message] = {}
        for message in self.records:
            found.setdefault(orjson.loads(message.value() or b"null")[C.TX_ID], message)
        return found


def features_topic(clients: Clients, topic: str) -> FeatureOutput:
    return FeatureOutput(list(read_topic(clients, topic)))


def assert_each_transaction_once(output: FeatureOutput, expected: Iterable[int]) -> None:
    counts = output.counts()
    expected_ids = set(expected)
    missing = sorted(expected_ids - set(counts))
    unexpected = sorted(set(counts) - expected_ids)
    repeated = {tx: n for tx, n in counts.items() if n > 1}
    assert not missing, f"{len(missing)} transactions have no feature record, e.g. {missing[:10]}"
    assert not unexpected, f"feature records of unknown transactions, e.g. {unexpected[:10]}"
    assert not repeated, (
        f"{len(repeated)} transactions have several records, e.g. {list(repeated.items())[:10]}"
    )


def assert_same_as_batch(records: dict[int, Message], sim: Simulated, params: FeatureParams) -> None:
    """Each record is well formed, carries its transaction and has the batch path's features (records of
    transactions missing here are not looked for: see ``assert_each_transaction_once``)."""
    rows = []
    for tx_id, message in records.items():
        record = FeatureRecord.model_validate_json(message.value() or b"")
        event = sim.transactions[tx_id]
        assert record.schema_version == SCHEMA_VERSION
        assert (record.card_id, record.terminal_id, record.amount, record.event_time_ms) == (
            event.card_id,
            event.terminal_id,
            event.amount,
            event.event_time_ms,
        ), f"tx {tx_id}: the record does not carry its transaction"
        assert (record.terminal_x, record.terminal_y) == (event.terminal_x, event.terminal_y)
        assert message.key() == event.card_id.encode()
        assert message.timestamp()[1] == event.event_time_ms
        assert not record.late, f"tx {tx_id} is marked late, but every event arrived within the lateness"
        assert list(record.features) == list(params.feature_columns)
        rows.append({C.TX_ID: tx_id, **record.features})
    streamed = pd.DataFrame(rows).set_index(C.TX_ID).sort_index()
    reference = sim.reference.loc[streamed.index]
    for column in params.feature_columns:
        got = streamed[column].to_numpy(dtype=np.float64)
        want = reference[column].to_numpy(dtype=np.float64)
        wrong = np.flatnonzero(~(np.abs(got - want) <= TOLERANCE))
        examples = [(int(reference.index[i]), got[i], want[i]) for i in wrong[:5]]
        assert not len(wrong), (
            f"{column}: {len(wrong)} of {len(got)} transactions differ from the batch path; "
            f"(tx_id, stream, batch): {examples}"
        )


def latest_per_card(sim: Simulated) -> pd.DataFrame:
    """By card token: tx_id, event time and batch-path features of the card's latest transaction.

    Latest by (event time, tx_id), the order in which Redis keeps the newest record.
    """
    events = pd.DataFrame(
        {
            C.TX_ID: list(sim.transactions),
            C.CARD_ID: [e.card_id for e in sim.transactions.values()],
            EVENT_TIME_MS: [e.event_time_ms for e in sim.transactions.values()],
        }
    ).sort_values([EVENT_TIME_MS, C.TX_ID])
    latest = events.groupby(C.CARD_ID).tail(1)
    return latest.join(sim.reference, on=C.TX_ID).set_index(C.CARD_ID)


def assert_redis_holds_latest(
    client: redis.Redis, prefix: str, sim: Simulated, params: FeatureParams
) -> None:
    """``card:{card}:features`` of every card holds the features of the card's latest transaction."""
    latest = latest_per_card(sim)
    chosen = list(latest.index)
    pipe = client.pipeline(transaction=False)
    for card in chosen:
        pipe.hgetall(card_features_key(card, prefix))
    for card, stored in zip(chosen, pipe.execute(), strict=True):
        assert stored, f"no {card_features_key(card, prefix)} in Redis"
        fields = {k.decode(): v.decode() for k, v in stored.items()}
        want = latest.loc[card]
        assert (int(fields[C.TX_ID]), int(fields[EVENT_TIME_MS])) == (
            int(want[C.TX_ID]),
            int(want[EVENT_TIME_MS]),
        ), f"card {card}: Redis holds tx {fields[C.TX_ID]}, not the card's latest tx {want[C.TX_ID]}"
        event = sim.transactions[int(want[C.TX_ID])]
        assert fields[C.TERMINAL_ID] == event.terminal_id
        assert float(fields[C.AMOUNT]) == event.amount
        assert fields["late"] == "0"
        for column in params.feature_columns:
            assert abs(float(fields[column]) - float(want[column])) <= TOLERANCE, (
                f"card {card}: {column} is {fields[column]} in Redis, {want[column]} in the batch path"
            )


@dataclass(frozen=True)
class Expected:
    """The undisturbed results: batch-path features, and the model's score of each transaction."""

    sim: Simulated
    scores: pd.Series  # by tx_id
    threshold: float
    version: int


def expected_results(sim: Simulated, tracking_uri: str, params: FeatureParams) -> Expected:
    model = load_model(tracking_uri, version=1)
    frame = sim.reference[list(params.feature_columns)].assign(
        **{C.AMOUNT: [sim.transactions[tx].amount for tx in sim.reference.index]}
    )
    scores, failed = score_each(model, frame.reset_index(drop=True))
    assert not failed
    return Expected(sim, pd.Series(scores, index=sim.reference.index), model.threshold, model.version)
