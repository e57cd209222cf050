"""The metrics endpoint of a running job, scraped while it runs: its counts equal what the run wrote, and
its lag falls to 0 once the input is drained."""

from __future__ import annotations

import collections
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import orjson
from prometheus_client.parser import text_string_to_metric_families

from contracts.events import Reason, from_message
from features.definitions import EVENT_TIME_MS, FeatureParams
from infra.clients import read_topic
from infra.embedded import free_port
from ingest.produce import produce_events
from ingest.simulator import SimulatorConfig, simulate
from tests.support.chaos import kill_tree
from tests.support.cli_stack import cli_stack, register_champion
from tests.support.feature_jobs import simulated

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
        assert produce_events(clients.producer(), topics, sim.events).delivery_errors == []
        # Bad records among them: a repeat of a transaction, a record that is not JSON.
        producer = clients.producer()
        producer.produce(topics.transactions, sim.events.tx_values[0], sim.events.tx_keys[0])
        producer.produce(topics.transactions, b"{not json", b"k")
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
            while metric("fraud_feature_records_total") < expected:
                assert job.poll() is None, log.read_text(errors="replace")[-3000:]
                assert time.monotonic() < deadline, f"the metrics did not reach {expected} feature records"
                time.sleep(1)
            # A transaction of a card it has seen, dated before its frontier: late.
            late = orjson.loads(sim.events.tx_values[-1])
            late.update(tx_id=10**12, **{EVENT_TIME_MS: late[EVENT_TIME_MS] - 86_400_000})
            producer.produce(topics.transactions, orjson.dumps(late), sim.events.tx_keys[-1])
            producer.flush()
            while metric("fraud_late_events_total") < 1:
                assert time.monotonic() < deadline, "the late transaction was not counted"
                time.sleep(1)
            time.sleep(3)  # micro-batches that read nothing: the lag they see is the log's end
            samples = scrape(port)
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
        assert value("fraud_late_events_total") == sum(record["late"] for record in features) == 1
        assert (
            value("fraud_scores_total") == len(list(read_topic(clients, out_topics.scores))) == expected + 1
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
