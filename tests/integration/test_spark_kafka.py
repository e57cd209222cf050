"""The jobs' Kafka input against the real broker and real Spark: Spark's connector as the jobs configure it
(exact ranges, admission control, time bounds, credentials kept out of plans) and the frontier source beside
it (ticks in the micro-batch that reads the records, the final micro-batch of a run, a range's end)."""

import json
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
from pyspark.sql import SparkSession

from contracts.settings import Settings
from fraud.metrics import records_read
from infra.clients import Clients
from infra.kafka.log import offsets_for_time, read_topic
from infra.spark.frontier import FrontierConfig, final_in, read_frontier
from infra.spark.kafka_source import KafkaInput, connector_options, read_batch, read_stream
from infra.spark.offset_log import Frontier, connector_offsets, planned_frontiers

T0 = 1_522_540_800_000


def produce(clients: Clients, topic: str, n: int, first: int = 0) -> None:
    producer = clients.producer()
    for i in range(first, first + n):
        producer.produce(topic, key=str(i % 7).encode(), value=f"v{i}".encode(), timestamp=T0 + i * 1000)
    assert producer.flush(30) == 0


def test_a_bounded_read_is_exact_repeatable_and_cut_by_time(
    spark: SparkSession, settings: Settings, clients: Clients
) -> None:
    topic = settings.topics.transactions
    produce(clients, topic, 500)

    def rows(source: KafkaInput) -> list[tuple[int, int, bytes]]:
        return sorted((r.partition, r.offset, bytes(r.value)) for r in read_batch(spark, source).collect())

    whole = KafkaInput(clients.kafka_config(), (topic,))
    first, second = rows(whole), rows(whole)
    assert (
        first == second == sorted((m.partition(), m.offset(), m.value()) for m in read_topic(clients, topic))
    )
    admin = clients.admin()
    ranged = KafkaInput(
        clients.kafka_config(),
        (topic,),
        starting_offsets=offsets_for_time(admin, (topic,), T0 + 100_000),
        ending_offsets=offsets_for_time(admin, (topic,), T0 + 200_000),
    )
    assert sorted(int(value[1:]) for _, _, value in rows(ranged)) == list(range(100, 200))


def test_admission_control_and_available_now(
    spark: SparkSession, settings: Settings, clients: Clients, tmp_path: Path
) -> None:
    topic = settings.topics.transactions
    produce(clients, topic, 1_000)
    stream = read_stream(spark, KafkaInput(clients.kafka_config(), (topic,), max_records_per_trigger=300))
    query = (
        stream.writeStream.format("memory")
        .queryName("admission_test")
        .option("checkpointLocation", str(tmp_path / "cp"))
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(180)
    sizes = [records_read(p) for p in query.recentProgress if records_read(p)]
    assert sum(sizes) == 1_000
    assert max(sizes) <= 303 and len(sizes) >= 4  # shares of 300 rounded up per partition
    values = [r.value for r in spark.sql("select value from admission_test").collect()]
    assert sorted(int(bytes(v)[1:]) for v in values) == list(range(1_000))


@dataclass(frozen=True)
class FrontierTicks:
    """A ticker whose one row says the frontier and the final mark."""

    schema: str = "frontier_ms long, final boolean"

    def ticks(self, frontier_ms: int, final: bool) -> pa.RecordBatch:
        return pa.record_batch({"frontier_ms": [frontier_ms], "final": [final]})


def test_the_frontier_follows_what_the_connector_read_and_marks_a_runs_last_micro_batch(
    spark: SparkSession, settings: Settings, clients: Clients, tmp_path: Path
) -> None:
    """Records stamped one second apart in three partitions, read 300 at a time: each micro-batch carries the
    frontier of what it read itself and the ones before it (Spark writes the connector's offsets of a
    micro-batch to the offset log before it asks the frontier source for its partitions: checked here on
    the Spark version ``infra.spark.internals`` names), the slowest partition with records left, then past
    the newest record, never ahead of it; the run ends with a final micro-batch, and a second run of a range
    ends there too, once the connector has reached the range's end."""
    topic = settings.topics.transactions
    produce(clients, topic, 1_000)
    query_dir = tmp_path / "query"

    def run(ending: dict[str, int] | None = None) -> list[dict]:
        kafka = read_stream(
            spark,
            KafkaInput(clients.kafka_config(), (topic,), max_records_per_trigger=300, ending_offsets=ending),
        )
        frontier = read_frontier(
            spark,
            FrontierConfig(
                clients.kafka_config(), (topic,), str(query_dir), FrontierTicks(), ending_offsets=ending
            ),
        )
        both = kafka.selectExpr("timestamp AS frontier_ms", "false AS final").union(frontier)
        query = (
            both.writeStream.format("noop")
            .option("checkpointLocation", str(query_dir))
            .trigger(availableNow=True)
            .start()
        )
        done = False
        while not query.awaitTermination(1) and not done:
            done = ending is not None and any(final_in(query_dir, p) for p in query.recentProgress)
        query.stop()
        assert query.exception() is None, query.exception()
        return [dict(p) for p in query.recentProgress]

    def frontiers(progress: list[dict], ending: dict[str, int] | None = None) -> list[Frontier]:
        """The frontiers the micro-batches of the reports planned (those that moved it), each checked to be
        computed from its own micro-batch's connector offsets (cut at a range's end)."""
        kept = planned_frontiers(query_dir)
        found = []
        for report in progress:
            frontier = kept.get(report["batchId"])
            if frontier is not None and frontier.batch == report["batchId"]:
                read = connector_offsets(json.loads(report["sources"][0]["endOffset"] or "{}"))
                cut = {name: min(end, (ending or {}).get(name, end)) for name, end in read.items()}
                assert frontier.kafka == cut, "the frontier of the micro-batch's own records"
                found.append(frontier)
        return found

    progress = run()
    read = sum(records_read(p) for p in progress)
    planned = frontiers(progress)
    assert read == 1_000 and planned[-1].final and not any(f.final for f in planned[:-1])
    first = next(p for p in progress if records_read(p))
    assert planned[0].batch == first["batchId"], "the first micro-batch that reads records carries a frontier"
    stamps = sorted(T0 + i * 1000 for i in range(1_000))
    assert planned[-1].frontier_ms == stamps[-1] + 1, "the frontier passes every record once all are read"
    for frontier in planned[:-2]:  # while records are left, it is behind the last record read
        assert frontier.frontier_ms <= max(frontier.progress.values())
    assert [f.frontier_ms for f in planned] == sorted(f.frontier_ms for f in planned)

    produce(clients, topic, 500, first=1_000)
    end = offsets_for_time(clients.admin(), (topic,), T0 + 1_200_000)
    more = run(end)
    assert sum(records_read(p) for p in more) >= 200 and frontiers(more, end)[-1].final


def test_the_connectors_credentials_are_redacted_in_query_plans(spark: SparkSession, tmp_path: Path) -> None:
    """The SASL password (in the JAAS line) and a client key (PEM) never show in a plan."""
    password = "hunter2-plan-secret"  # noqa: S105 - the secret the test looks for
    key = tmp_path / "client.key"
    key.write_text("-----BEGIN PRIVATE KEY-----\nhunter3-plan-key\n-----END PRIVATE KEY-----\n")
    cert = tmp_path / "client.pem"
    cert.write_text("-----BEGIN CERTIFICATE-----\ncert\n-----END CERTIFICATE-----\n")
    kafka = {
        "bootstrap.servers": "127.0.0.1:9",
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "PLAIN",
        "sasl.username": "fraud",
        "sasl.password": password,
        "ssl.certificate.location": str(cert),
        "ssl.key.location": str(key),
    }
    source = KafkaInput(kafka, ("transactions",))
    assert password in connector_options(source)["kafka.sasl.jaas.config"]
    frame = read_stream(spark, source)
    execution = frame._jdf.queryExecution()
    plans = execution.toString() + execution.logical().toString() + execution.analyzed().toString()
    assert password not in plans and "hunter3-plan-key" not in plans
