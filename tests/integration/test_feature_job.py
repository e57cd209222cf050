"""The streaming feature job (``features.job``) on a real Apache Kafka broker, Valkey and Spark (local mode).

The reference for every feature is the batch path (``features.batch.transactions_features``) over the
same simulated table: the streaming job must give the same value for every feature of every transaction
(within 1e-9), whatever the micro-batch sizes, disorder within the allowed lateness, restarts, bad records
or kills, and write each transaction's record once.

Records read back from Kafka are read_committed. The chaos tests run the job in a subprocess
(``tests/support/feature_job_runner.py``), SIGKILL the whole application (driver, JVM, Python workers) at
a point of the sink's protocol or at a random moment, and restart the job from its checkpoint
(``tests/support/chaos.py``).
"""

from __future__ import annotations

import collections
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
import redis
from confluent_kafka import KafkaError, Message, Producer
from pyspark.sql import SparkSession

from contracts.events import (
    DLQ_OFFSET_HEADER,
    DLQ_PARTITION_HEADER,
    DLQ_REASON_HEADER,
    DLQ_SOURCE_HEADER,
    Reason,
    TxColumns,
    from_message,
)
from contracts.settings import Settings, Topics
from features.definitions import HOUR_MS, FeatureParams
from features.job import FeatureJobConfig
from fraud.progress import records_read
from infra.clients import Clients
from infra.embedded.stack import StackInfo
from infra.kafka.admin import ensure_topics
from infra.kafka.log import read_topic
from infra.spark.checkpoint import query_location
from infra.spark.offset_log import position_at
from ingest.produce import EventBatch, produce_events
from ingest.simulator import SimulatorConfig
from tests.support.chaos import (
    Pause,
    kill_tree,
    logged_tasks,
    pause_args,
    pause_reports,
)
from tests.support.feature_jobs import (
    JOB_TIMEOUT_S,
    FeatureOutput,
    Simulated,
    assert_each_transaction_once,
    assert_redis_holds_latest,
    assert_same_as_batch,
    features_topic,
    isolated_clients,
    job_config,
    latest_per_card,
    prefix_of,
    run_once,
    simulated,
)

pytestmark = pytest.mark.minutes(4)

C = TxColumns
ROOT = Path(__file__).resolve().parents[2]
RUNNER = "tests.support.feature_job_runner"

#: Five weeks (every 30-day window fills up) of ~2,000 cards: the parity runs' input.
PARITY_SIMULATION = SimulatorConfig(customers=2000, terminals=4000, days=35, seed=11)
#: Two admission limits (records per micro-batch): several micro-batches per run, and one per run.
PARITY_MAX_RECORDS = (25_000, 80_000)


# --- helpers -----------------------------------------------------------------------------------------


Record = tuple[str, bytes | None, bytes | None, int]  # topic, key, value, Kafka timestamp (ms)


def records_in_time_order(events: EventBatch, topics: Topics) -> list[Record]:
    """Transactions and labels merged by Kafka timestamp, transactions first at equal times (as ingest)."""
    records = [
        (topics.transactions, key, value, ts)
        for key, value, ts in zip(events.tx_keys, events.tx_values, events.tx_times, strict=True)
    ] + [
        (topics.labels, key, value, ts)
        for key, value, ts in zip(events.label_keys, events.label_values, events.label_times, strict=True)
    ]
    order = np.argsort(np.asarray([ts for *_, ts in records], dtype=np.int64), kind="stable")
    return [records[i] for i in order]


def produce_records(producer: Producer, records: list[Record]) -> list[tuple[int, int]]:
    """Produce the records in this order (idempotent producer: the order holds per partition).

    Returns the (partition, offset) each record got.
    """
    placed: list[tuple[int, int] | None] = [None] * len(records)
    errors: list[str] = []

    def delivered(index: int) -> Any:
        def report(error: KafkaError | None, message: Message) -> None:
            if error is not None:
                errors.append(str(error))
            else:
                placed[index] = (message.partition() or 0, message.offset() or 0)

        return report

    for index, (topic, key, value, ts) in enumerate(records):
        while True:
            try:
                producer.produce(topic, value=value, key=key, timestamp=ts, on_delivery=delivered(index))
                break
            except BufferError:
                producer.poll(0.05)
        if index % 10_000 == 0:
            producer.poll(0)
    assert producer.flush(60) == 0 and not errors, errors[:5]
    assert all(where is not None for where in placed)
    return [where for where in placed if where is not None]


def records_per_batch(progress: list[dict[str, Any]]) -> list[int]:
    """Kafka records read by each micro-batch that read any."""
    return [read for read in map(records_read, progress) if read]


def outputs_of(clients: Clients, input_topics: Topics, prefix: str) -> Topics:
    """Topics reading ``input_topics``' transactions and labels, writing features and dead letters of their own."""
    own = Topics().with_prefix(prefix)
    ensure_topics(clients.admin(), [own.features, own.dead_letter], clients.settings.partitions, 1)
    return own.model_copy(update={"transactions": input_topics.transactions, "labels": input_topics.labels})


# --- parity with the batch path: two admission limits, a stop and a restart in the middle -------------


@dataclass
class ParityRun:
    """One job over the shared input: run once after each half, the second time from the same checkpoint."""

    config: FeatureJobConfig
    first: list[dict[str, Any]]
    second: list[dict[str, Any]]
    output: FeatureOutput


@dataclass
class Parity:
    """The shared input of the parity runs and what each job made of it."""

    sim: Simulated
    clients: Clients
    halves: tuple[int, int]  # records (transactions and labels) produced before and after the stop
    runs: dict[int, ParityRun]  # by max_records_per_trigger


@pytest.fixture(scope="module")
def parity(
    stack: StackInfo, stack_home: Path, spark: SparkSession, tmp_path_factory: pytest.TempPathFactory
) -> Parity:
    """Five simulated weeks of ~2,000 cards, produced in two halves split at the median transaction time.

    Two jobs read the same input topics, each with its own checkpoint, output topics, Redis prefix and
    admission limit; each runs once (availableNow) after the first half is produced and once again, from
    its checkpoint, after the rest is produced.
    """
    params = FeatureParams()
    clients = isolated_clients(stack, stack_home)
    topics = clients.settings.topics
    sim = simulated(PARITY_SIMULATION, clients.settings, params)
    cut_ms = int(np.median(np.asarray(sim.events.tx_times)))
    first, rest = sim.events.split_at(cut_ms)
    checkpoints = tmp_path_factory.mktemp("parity")
    configs = {
        limit: job_config(
            clients,
            outputs_of(clients, topics, f"{prefix_of(topics)}{limit}-"),
            checkpoints / f"cp-{limit}",
            limit,
            params,
        )
        for limit in PARITY_MAX_RECORDS
    }
    halves = []
    progress: dict[int, list[list[dict[str, Any]]]] = {limit: [] for limit in configs}
    for part in (first, rest):
        produced = produce_events(clients.producer(), topics, part)
        assert produced.delivery_errors == []
        halves.append(produced.transactions + produced.labels)
        for limit, config in configs.items():
            progress[limit].append(run_once(spark, config))
    runs = {
        limit: ParityRun(config, *progress[limit], features_topic(clients, config.topics.features))
        for limit, config in configs.items()
    }
    return Parity(sim, clients, (halves[0], halves[1]), runs)


@pytest.mark.parametrize("max_records", PARITY_MAX_RECORDS)
def test_features_equal_the_batch_path_across_micro_batches_and_a_restart(
    parity: Parity, max_records: int
) -> None:
    """Every feature of every transaction equals the batch path's, each transaction written once, for two
    different admission limits and with a stop and restart from the checkpoint half way."""
    run = parity.runs[max_records]
    for progress, produced in zip((run.first, run.second), parity.halves, strict=True):
        read = records_per_batch(progress)
        assert sum(read) == produced, "the run did not read exactly the records produced since the last one"
        assert max(read) <= max_records, f"a micro-batch read {max(read)} records, over the limit"
        assert len(read) >= -(-produced // max_records)
    assert min(p["batchId"] for p in run.second) > max(p["batchId"] for p in run.first), (
        "the second run did not continue from the first run's checkpoint"
    )
    assert_each_transaction_once(run.output, parity.sim.transactions)
    assert_same_as_batch(run.output.by_tx(), parity.sim, run.config.params)
    dead = read_topic(parity.clients, run.config.topics.dead_letter)
    assert sum(1 for _ in dead) == 0


def test_redis_holds_each_cards_latest_features(parity: Parity) -> None:
    """``card:{card}:features`` under each job's prefix holds the features of the card's latest transaction
    (by event time, then tx_id), for every card, after both runs."""
    client = redis.Redis.from_url(parity.clients.endpoints.redis_url)
    for run in parity.runs.values():
        assert_redis_holds_latest(client, run.config.redis.prefix, parity.sim, run.config.params)
    assert len(latest_per_card(parity.sim)) > 1_500


# --- disorder within the allowed lateness ------------------------------------------------------------

#: Five weeks of ~100 cards, read in three micro-batches: the shuffled-arrival run's input.
SHUFFLED_SIMULATION = SimulatorConfig(customers=100, terminals=200, days=35, seed=5)
SHUFFLED_MAX_RECORDS = 2_000
LATENESS_MS = 6 * HOUR_MS


def live_records(sim: Simulated, topics: Topics) -> list[Record]:
    """The records in time order, ending as a live stream does at its last transaction.

    Labels known later are left out (they change no feature): they would be the newest records, carry the
    frontier past every transaction, and leave the end of a run untested.
    """
    last_tx_ms = max(sim.events.tx_times)
    return [
        record
        for record in records_in_time_order(sim.events, topics)
        if record[0] == topics.transactions or record[3] <= last_tx_ms
    ]


def shuffled(records: list[Record], allowed_lateness_ms: int, seed: int) -> list[Record]:
    """The records in a random arrival order in which each is less than ``allowed_lateness_ms`` older than any
    record before it: ordered by timestamp plus a random delay below the lateness."""
    stamps = np.asarray([ts for *_, ts in records], dtype=np.int64)
    delays = np.random.default_rng(seed).integers(0, allowed_lateness_ms, len(records))
    return [records[i] for i in np.lexsort((np.arange(len(records)), stamps + delays))]


def assert_disorder_within(
    records: list[Record], placed: list[tuple[int, int]], allowed_lateness_ms: int
) -> None:
    """In each partition every record is at most ``allowed_lateness_ms`` behind the newest one before it, and many
    are behind one."""
    newest: dict[tuple[str, int], int] = {}
    behind = 0
    for (topic, _, _, ts), (partition, _) in zip(records, placed, strict=True):
        top = newest.get((topic, partition), ts)
        assert top - ts <= allowed_lateness_ms, f"{topic}/{partition}: a record {top - ts} ms behind"
        behind += ts < top
        newest[(topic, partition)] = max(top, ts)
    assert behind > len(records) // 4, "the input is hardly out of order"


def test_shuffled_arrival_within_the_allowed_lateness_gives_the_batch_result(
    spark: SparkSession, settings: Settings, clients: Clients, tmp_path: Path
) -> None:
    """Transactions and labels produced out of event-time order, each at most the allowed lateness behind
    the newest record before it in its partition, and read with availableNow in several micro-batches.
    The job holds events until its frontier passes them; the last micro-batch is final and releases the
    rest, including the newest events, which are not the last records read. Every transaction gets exactly
    one feature record, with the batch path's features, none marked late.
    """
    params = FeatureParams(allowed_lateness_ms=LATENESS_MS)
    sim = simulated(SHUFFLED_SIMULATION, settings, params)
    records = shuffled(live_records(sim, settings.topics), LATENESS_MS, seed=7)
    placed = produce_records(clients.producer(), records)
    assert_disorder_within(records, placed, LATENESS_MS)

    config = job_config(clients, settings.topics, tmp_path / "cp", SHUFFLED_MAX_RECORDS, params)
    progress = run_once(spark, config)

    read = records_per_batch(progress)
    assert sum(read) == len(records) and len(read) >= 3, read
    last = position_at(query_location(config.checkpoint), progress[-1]["batchId"]).frontier
    assert last is not None, "the last micro-batch keeps no frontier"
    assert last.final, "the last micro-batch of the availableNow run is not final"
    assert last.frontier_ms <= max(ts for *_, ts in records), (
        "the final frontier passes the newest record by itself: the input does not test the final release"
    )
    output = features_topic(clients, settings.topics.features)
    assert_each_transaction_once(output, sim.transactions)
    assert_same_as_batch(output.by_tx(), sim, params)


# --- bad records --------------------------------------------------------------------------------------


#: An event time far ahead of any clock, and the reason of the dead letters it makes.
IN_2099 = 4_070_908_800_000
#: A Kafka timestamp half an hour ahead of now: further than the job's clock skew allows (5 minutes), within
#: what the broker accepts.
AHEAD_MS = int(time.time() * 1000) + 30 * 60_000
FUTURE = Reason.FUTURE_EVENT_TIME


def test_bad_records_are_dead_lettered_once_and_the_job_keeps_going(
    spark: SparkSession, settings: Settings, clients: Clients, tmp_path: Path
) -> None:
    """Malformed records among good ones on the transactions and labels topics, spread over several
    micro-batches: each lands on the dead-letter topic once, with its original bytes and the reason, topic,
    partition and offset; every good transaction still gets its features, on time. Among them, as another
    producer than ``fraud ingest`` might write them: transactions dated in 2099 (one with its Kafka
    timestamp half an hour ahead of now, as far ahead as the broker lets a record be stamped (Kafka 4's
    ``log.message.timestamp.after.max.ms``: an hour), which would move the event-time frontier there and
    make every later event
    late), and a transaction produced again."""
    params = FeatureParams()
    sim = simulated(SimulatorConfig(customers=120, terminals=240, days=21, seed=9), settings, params)
    topics = settings.topics
    good = records_in_time_order(sim.events, topics)
    tx_at = [i for i, (topic, *_) in enumerate(good) if topic == topics.transactions]
    label_at = [i for i, (topic, *_) in enumerate(good) if topic == topics.labels]
    tx_base = orjson.loads(good[tx_at[0]][2] or b"")
    label_base = orjson.loads(good[label_at[0]][2] or b"")
    bad_values: list[tuple[str, bytes, Reason]] = [
        (
            topics.transactions,
            b'{"schema_version": 1, "tx_id": 900000001, "card_id": ',
            Reason.MALFORMED_JSON,
        ),
        (
            topics.transactions,
            orjson.dumps({**tx_base, "tx_id": 900000002, "amount": "12.50"}),
            Reason.WRONG_TYPE,
        ),
        (
            topics.transactions,
            orjson.dumps({**tx_base, "tx_id": 900000003, "schema_version": 2}),
            Reason.UNKNOWN_SCHEMA_VERSION,
        ),
        (topics.transactions, b"[1, 2, 3]", Reason.NOT_AN_OBJECT),
        (
            topics.transactions,
            orjson.dumps({**tx_base, "tx_id": 900000005, "event_time_ms": IN_2099}),
            FUTURE,
        ),
        (
            topics.transactions,
            orjson.dumps({**tx_base, "tx_id": 900000006, "event_time_ms": IN_2099}),
            FUTURE,
        ),
        (topics.transactions, good[tx_at[0]][2] or b"", Reason.DUPLICATE_TX_ID),
        (
            topics.labels,
            orjson.dumps({k: v for k, v in label_base.items() if k != "known_at_ms"}),
            Reason.MISSING_FIELD,
        ),
    ]
    # Each bad record goes right after a good one of its topic, with that record's key and timestamp (the
    # second record dated 2099 is stamped half an hour ahead of now).
    after = [tx_at[len(tx_at) * k // 8] for k in range(1, 8)] + [label_at[len(label_at) // 2]]
    records: list[Record] = []
    bad_index: dict[int, tuple[str, bytes, Reason]] = {}
    inserts = dict(zip(after, bad_values, strict=True))
    for i, record in enumerate(good):
        records.append(record)
        if i in inserts:
            topic, value, _ = inserts[i]
            bad_index[len(records)] = inserts[i]
            stamp = AHEAD_MS if b"900000006" in value else record[3]
            records.append((topic, record[1], value, stamp))

    placed = produce_records(clients.producer(), records)
    progress = run_once(spark, job_config(clients, topics, tmp_path / "cp", 1_500, params))

    read = records_per_batch(progress)
    assert sum(read) == len(records) and max(read) <= 1_500 and len(read) >= 3, read
    output = features_topic(clients, topics.features)
    assert_each_transaction_once(output, sim.transactions)
    assert_same_as_batch(output.by_tx(), sim, params)

    expected = {
        (f"kafka:{topic}", *placed[index]): (value, reason)
        for index, (topic, value, reason) in bad_index.items()
    }
    letters = collections.Counter()
    for message in read_topic(clients, topics.dead_letter):
        header_names = {name for name, _ in message.headers() or []}
        assert {DLQ_REASON_HEADER, DLQ_SOURCE_HEADER, DLQ_PARTITION_HEADER, DLQ_OFFSET_HEADER} <= header_names
        letter = from_message(message)
        assert letter.detail, letter
        where = (letter.source, letter.partition, letter.offset)
        assert where in expected, f"unexpected dead letter {letter}"
        value, reason = expected[where]
        if reason == Reason.DUPLICATE_TX_ID:  # the transaction as decoded: the record itself is at the offset
            assert orjson.loads(letter.raw)["tx_id"] == orjson.loads(value)["tx_id"], letter
            assert letter.reason == reason and "processed already" in letter.detail, letter
        else:
            assert (message.value(), letter.raw, letter.reason) == (value, value, reason), letter
        letters[where] += 1
    assert letters == collections.Counter({where: 1 for where in expected})


# --- chaos: SIGKILL the job (a subprocess) mid-stream, restart it from its checkpoint -------------------

#: Five weeks of ~130 cards, read in three micro-batches (a run in a subprocess pays Spark's start-up).
CHAOS_SIMULATION = SimulatorConfig(customers=150, terminals=300, days=35, seed=3)
CHAOS_MAX_RECORDS = 3_500


class JobProcess:
    """``feature_job_runner.py`` running continuously in its own session, SIGKILLed as a whole when asked."""

    def __init__(
        self, tmp_path: Path, clients: Clients, max_records: int, allowed_lateness_ms: int = 0
    ) -> None:
        self.checkpoint = tmp_path / "cp"
        self.control = tmp_path / "control"
        self.log = tmp_path / "job.log"
        self.args = [
            sys.executable,
            "-m",
            RUNNER,
            f"--bootstrap={clients.endpoints.bootstrap_servers}",
            f"--redis={clients.endpoints.redis_url}",
            f"--prefix={prefix_of(clients.settings.topics)}",
            f"--checkpoint={self.checkpoint}",
            f"--home={tmp_path / 'home'}",
            f"--control={self.control}",
            f"--max-records={max_records}",
            f"--allowed-lateness-ms={allowed_lateness_ms}",
        ]
        self.job: subprocess.Popen[bytes] | None = None

    def start(self, *extra: str) -> subprocess.Popen[bytes]:
        with self.log.open("wb") as log:
            self.job = subprocess.Popen(
                [*self.args, *extra], stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=ROOT
            )
        return self.job

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]

    def wait_for(self, condition: Any, what: str) -> None:
        """Poll until ``condition()``; fail (and kill the job) if the job exits or time runs out first."""
        assert self.job is not None
        deadline = time.monotonic() + JOB_TIMEOUT_S
        while not condition():
            if self.job.poll() is not None or time.monotonic() > deadline:
                self.kill()
                raise AssertionError(f"the job never got to {what}:\n{self.tail()}")
            time.sleep(0.05)

    def kill(self) -> None:
        """SIGKILL the driver, the JVM and every Python worker."""
        assert self.job is not None
        kill_tree(self.job)


def produce_in_order(clients: Clients, sim: Simulated) -> None:
    produced = produce_events(clients.producer(), clients.settings.topics, sim.events)
    assert produced.delivery_errors == []


@pytest.mark.chaos
def test_sigkill_between_transactions_and_restart_writes_every_record_once(
    spark: SparkSession, settings: Settings, clients: Clients, tmp_path: Path
) -> None:
    """Runs the job continuously in a subprocess and SIGKILLs it in micro-batch 1 when the sink's write
    task of Spark partition 0 has committed its Kafka transaction and the task of partition 1 has opened
    its own (commit marker sent, no record yet): no Kafka transaction holds records, and Spark has not
    recorded batch 1. Restarted from the checkpoint with availableNow (in this process), the job re-runs
    batch 1, where partition 0 finds its marker and writes nothing and partition 1 writes, then finishes
    the input. Every transaction has exactly one feature record, equal to the batch path's, and Redis holds
    each card's latest features.
    """
    params = FeatureParams()
    sim = simulated(CHAOS_SIMULATION, settings, params)
    produce_in_order(clients, sim)
    pauses: list[Pause] = [(1, 0, "committed"), (1, 1, "opened")]

    job = JobProcess(tmp_path, clients, CHAOS_MAX_RECORDS)
    job.start(*pause_args(pauses))
    reports = pause_reports(job.control, pauses)
    job.wait_for(lambda: all(report.exists() for report in reports), f"the pause points {pauses}")
    job.kill()
    query = job.checkpoint / "query"
    assert (query / "offsets" / "1").exists() and not (query / "commits" / "1").exists()
    returned = {(batch, status) for batch, _, status in logged_tasks(job.control)}
    assert returned <= {(0, "written"), (0, "empty")}

    progress = run_once(spark, job_config(clients, settings.topics, job.checkpoint, CHAOS_MAX_RECORDS))

    assert progress[0]["batchId"] == 1, "the restart did not re-run batch 1"
    output = features_topic(clients, settings.topics.features)
    assert_each_transaction_once(output, sim.transactions)
    assert_same_as_batch(output.by_tx(), sim, params)
    client = redis.Redis.from_url(settings.redis_url)
    assert_redis_holds_latest(client, prefix_of(settings.topics), sim, params)


#: The random kill: the chaos input shuffled within the lateness, read in micro-batches of 1,500 records
#: (about seven). One kill: each more would cost another Spark start-up and first micro-batch (30-90 s here).
