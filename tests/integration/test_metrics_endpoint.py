"""The metrics endpoint of a running job, scraped while it runs: its counts equal what the run wrote, its
lag falls to 0 once the input is drained, its alerts are timed from their transactions' append; Kafka's
consumer-group view and `fraud status` beside it agree."""

from __future__ import annotations

import collections
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import orjson
import pytest
from confluent_kafka import ConsumerGroupTopicPartitions
from prometheus_client.parser import text_string_to_metric_families

from contracts.events import Reason, from_message
from features.definitions import DAY_MS, EVENT_TIME_MS, FeatureParams
from infra.embedded.stack import free_port
from infra.kafka.input_watch import observer_group
from infra.kafka.log import log_bounds, read_topic
from ingest.produce import EventBatch, produce_events
from ingest.simulator import SimulatorConfig, simulate
from tests.support.chaos import kill_tree
from tests.support.cli_stack import cli_stack, register_champion
from tests.support.feature_jobs import simulated

pytestmark = pytest.mark.minutes(3)

BIN = Path(sys.executable).parent
SIMULATION = SimulatorConfig(customers=150, terminals=300, days=35, seed=31)
NAMESPACE = "watched"
TIMEOUT_S = 240


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of the endpoint, by name and labels (the job label left out); none while the job starts
    (nothing listens yet)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
            text = answer.read().decode()
    except OSError:  # URLError included
        return {}
    return {
        (sample.name, tuple(sorted((k, v) for k, v in sample.labels.items() if k != "job"))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_the_pipelines_metrics_count_what_it_wrote_and_its_lag_falls_to_zero(tmp_path: Path) -> None:
    port = free_port()
    params = FeatureParams()
    with cli_stack(tmp_path, FRAUD_METRICS_PORT=str(port)) as (_, clients, env):
        frame = simulate(SIMULATION)
        register_champion(clients, frame, params, tmp_path / "artifacts")
        sim = simulated(SIMULATION, clients.settings, params)
        topics = clients.settings.topics
        subprocess.run([str(BIN / "fraud"), "topics", "create"], env=env, check=True, capture_output=True)
        # The last days' transactions come while the job runs: their alerts' latency is measured from their
        # append. Their labels (stamped a week after them) come last, not to move the frontier past them.
        before, after = sim.events.split_at(max(sim.events.tx_times) - 4 * DAY_MS)
        later_labels = EventBatch(
            label_keys=after.label_keys, label_values=after.label_values, label_times=after.label_times
        )
        after = EventBatch(tx_keys=after.tx_keys, tx_values=after.tx_values, tx_times=after.tx_times)
        assert produce_events(clients.producer(), topics, before).delivery_errors == []
        # Bad records among them: a repeat of a transaction, a record that is not JSON.
        producer = clients.producer()
        # (Stamped as the first part's last transaction: a record stamped now would move the frontier there.)
        stamp = max(before.tx_times)
        producer.produce(topics.transactions, sim.events.tx_values[0], sim.events.tx_keys[0], timestamp=stamp)
        producer.produce(topics.transactions, b"{not json", b"k", timestamp=stamp)
        producer.flush()

        log = tmp_path / "pipeline.log"
        command = [str(BIN / "fraud"), "pipeline", "run", "--namespace", NAMESPACE, "--max-records", "3000"]
        with log.open("wb") as out:
            job = subprocess.Popen(command, env=env, stdout=out, stderr=out, start_new_session=True)
        try:
            out_topics = topics.in_namespace(NAMESPACE)
            expected = len(sim.transactions)

            def metric(name: str, **labels: str) -> float:
                return scrape(port).get((name, tuple(sorted(labels.items()))), 0.0)

            deadline = time.monotonic() + TIMEOUT_S
            while metric("fraud_feature_records_total") < len(before.tx_values):
                assert job.poll() is None, log.read_text(errors="replace")[-3000:]
                assert time.monotonic() < deadline, "the metrics did not reach the first part's records"
                time.sleep(1)
            assert produce_events(clients.producer(), topics, after).delivery_errors == []
            while metric("fraud_feature_records_total") < expected:
                assert job.poll() is None, log.read_text(errors="replace")[-3000:]
                assert time.monotonic() < deadline, f"the metrics did not reach {expected} feature records"
                time.sleep(1)
            assert produce_events(clients.producer(), topics, later_labels).delivery_errors == []
            # A transaction of a card it has seen, dated before its frontier: late.
            late = orjson.loads(sim.events.tx_values[-1])
            late.update(tx_id=10**12, **{EVENT_TIME_MS: late[EVENT_TIME_MS] - 86_400_000})
            producer.produce(topics.transactions, orjson.dumps(late), sim.events.tx_keys[-1])
            producer.flush()
            # (Transactions of the second part may be late too: one partition read to its end while another
            # is still being written moves the frontier past the other's next records.)
            while metric("fraud_feature_records_total") < expected + 1:
                assert time.monotonic() < deadline, "the late transaction's record was not counted"
                time.sleep(1)
            time.sleep(3)  # micro-batches that read nothing: the lag they see is the log's end
            samples = scrape(port)
            status = subprocess.run(
                [str(BIN / "fraud"), "status"], env={**env, "COLUMNS": "250"}, capture_output=True, text=True
            )
        finally:
            kill_tree(job)

        def value(name: str, **labels: str) -> float:
            return samples.get((name, tuple(sorted(labels.items()))), 0.0)

        features = [orjson.loads(m.value() or b"") for m in read_topic(clients, out_topics.features)]
        alerts = list(read_topic(clients, out_topics.alerts))
        letters = collections.Counter(
            from_message(m).reason for m in read_topic(clients, out_topics.dead_letter)
        )
        assert letters == {Reason.DUPLICATE_TX_ID: 1, Reason.MALFORMED_JSON: 1}
        assert value("fraud_feature_records_total") == len(features) == expected + 1
        assert value("fraud_late_events_total") == sum(record["late"] for record in features) >= 1
        assert next(record["late"] for record in features if record["tx_id"] == late["tx_id"]) is True
        scores = [orjson.loads(m.value() or b"") for m in read_topic(clients, out_topics.scores)]
        assert value("fraud_scores_total") == len(scores) == expected + 1
        # Dead rows shared some micro-batches' frames with the scored ones: the ints stay ints.
        assert all(type(score[name]) is int for score in scores for name in ("tx_id", "event_time_ms")), (
            scores[:3]
        )
        assert value("fraud_alerts_total") == len(alerts) > 0
        for reason in Reason:
            assert value("fraud_dead_letters_total", reason=reason.value) == letters.get(reason, 0), reason
        assert value("fraud_model_version", role="model") == 1
        read = sum(v for (name, _), v in samples.items() if name == "fraud_input_records_total")
        assert read == len(sim.events.tx_values) + len(sim.events.label_values) + 3
        lags = {labels: v for (name, labels), v in samples.items() if name == "fraud_lag_records"}
        assert lags and set(lags.values()) == {0.0}, lags
        assert value("fraud_batch_duration_seconds_count") == value("fraud_batches_total") > 1
        # The frontier each micro-batch computed, as the job's checkpoint keeps it, against the wall clock.
        assert ("fraud_frontier_delay_seconds", ()) in samples

        # Alert latency: the alerts of the transactions appended while the job ran, each timed once.
        appended = {orjson.loads(v)["tx_id"] for v in after.tx_values} | {late["tx_id"]}
        timed = sum(orjson.loads(m.value() or b"")["tx_id"] in appended for m in alerts)
        assert value("fraud_alert_latency_seconds_count") == timed > 0
        assert 0 < value("fraud_alert_latency_seconds_sum") / timed < TIMEOUT_S

        # Kafka's view of what the job processed: its observer group's offsets are the logs' ends.
        group = observer_group("pipeline", NAMESPACE)
        admin = clients.admin()
        committed = {
            (tp.topic, tp.partition): tp.offset
            for tp in admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])[group]
            .result()
            .topic_partitions
        }
        ends = log_bounds(admin, sorted(committed))
        assert {(t, p) for t, p in committed} == {
            (t, p) for t in (topics.transactions, topics.labels) for p in range(clients.settings.partitions)
        }
        assert {f"{t}/{p}": offset for (t, p), offset in committed.items()} == {
            name: end for name, (_, end) in ends.items()
        }

        # `fraud status`, beside the running job: its rate, lag and counts from its metrics; its group's lag.
        assert status.returncode == 0, status.stderr
        row = next(line for line in status.stdout.splitlines() if f"{NAMESPACE}.pipeline " in line)
        cells = [cell.strip() for cell in row.split("│")[1:-1]]
        assert cells[1].endswith("/s") and cells[2] == "0", row  # rate, lag
        assert cells[5] == f"{value('fraud_input_records_total'):,.0f}", row
        assert cells[6] == f"{value('fraud_alerts_total'):,.0f}", row
        assert cells[8] == f"http://127.0.0.1:{port}/metrics", row
        groups = [line for line in status.stdout.splitlines() if line.startswith(f"│ {NAMESPACE}.pipeline")]
        assert groups, status.stdout
