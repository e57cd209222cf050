"""A broker outage of minutes under a running job: the pipeline waits it out in every place it talks to
Kafka, says so in two lines, and loses or repeats nothing.

Starts `fraud pipeline run` (continuous, small micro-batches) on an embedded stack of the test's own, over
input that is all there, and once it works (a micro-batch committed, then a write task holding its Kafka
transaction open: the host's transaction lock of the features topic is held) stops the broker (SIGSTOP)
for 90 s, longer than any Kafka call of the job waits for an answer (60 s), then lets it go on
(SIGCONT). Meanwhile the source plans micro-batches, a write task has its transaction open, and the
observer group's commits and the input watch meet the silent broker too. Expects the job still running
after the pause, one line saying Kafka is away and one that it answers again from each process that
waited (no traceback, no start-up advice), then every transaction's feature record and score exactly
once, the features equal to the batch path's and the scores to the model's. Ctrl-C to the job's process
group then stops it without a traceback.
"""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from confluent_kafka import Message

from contracts.records import ScoreRecord
from features.definitions import FeatureParams
from infra.kafka_log import read_topic
from infra.txn_lock import lock_path
from ingest.produce import produce_events
from ingest.simulator import SimulatorConfig, simulate
from tests.integration.test_chaos import lock_held
from tests.support import feature_jobs
from tests.support.chaos import pause
from tests.support.cli_stack import cli_stack, register_champion

pytestmark = [pytest.mark.chaos, pytest.mark.integration, pytest.mark.minutes(3.5)]

BIN = Path(sys.executable).parent
SIMULATION = SimulatorConfig(customers=120, terminals=400, days=25, seed=35)
TRAINING = SimulatorConfig(customers=60, terminals=150, days=25, seed=35)
#: Records per micro-batch: the job is still at work on its input when the broker stops.
MAX_RECORDS = 600
#: Longer than any Kafka call of a running job waits for an answer (``KAFKA_CALL_TIMEOUT_S``, 60 s).
BROKER_PAUSE_S = 90.0
#: How long the pause waits for a write task to hold its transaction open before it pauses anyway.
LOCK_WAIT_S = 30.0
#: To the first committed micro-batch (Spark's start, the model's load), and to the end of the input.
START_TIMEOUT_S = DONE_TIMEOUT_S = 600.0


def commits(checkpoint: Path) -> int:
    folder = checkpoint / "query" / "commits"
    return sum(1 for p in folder.iterdir() if p.name.isdigit()) if folder.is_dir() else 0


@pytest.mark.timeout(1800)  # about 4 minutes on 2 idle cores, 90 s of them the pause
def test_a_running_pipeline_waits_out_a_broker_pause_of_90_s(tmp_path: Path) -> None:
    params = FeatureParams()
    with cli_stack(tmp_path) as (stack, clients, env):
        settings = clients.settings
        register_champion(clients, simulate(TRAINING), params, tmp_path / "artifacts")
        sim = feature_jobs.simulated(SIMULATION, settings, params)
        expected = feature_jobs.expected_results(sim, clients.endpoints.mlflow_tracking_uri, params)
        subprocess.run([str(BIN / "fraud"), "topics", "create"], env=env, check=True, capture_output=True)
        assert produce_events(clients.producer(), settings.topics, sim.events).delivery_errors == []
        checkpoint = tmp_path / "cp-pipeline"
        log = tmp_path / "pipeline.log"
        argv = ["pipeline", "run", "--max-records", str(MAX_RECORDS), "--checkpoint", str(checkpoint)]
        with log.open("wb") as out:
            job = subprocess.Popen(
                [str(BIN / "fraud"), *argv], env=env, stdout=out, stderr=out, start_new_session=True
            )

        def said() -> str:
            return log.read_text(errors="replace")

        try:
            deadline = time.monotonic() + START_TIMEOUT_S
            while commits(checkpoint) < 1:
                assert job.poll() is None, f"the pipeline exited before the pause: {said()[-3000:]}"
                assert time.monotonic() < deadline, "no micro-batch committed"
                time.sleep(0.2)
            lock = lock_path(stack.bootstrap_servers, settings.topics.features)
            waited = time.monotonic() + LOCK_WAIT_S
            while not (in_transaction := lock_held(lock)) and time.monotonic() < waited:
                time.sleep(0.002)
            before = commits(checkpoint)
            pause(stack.broker.pid, BROKER_PAUSE_S)
            assert job.poll() is None, f"the pipeline did not survive the pause: {said()[-3000:]}"

            features: list[Message] = []
            deadline = time.monotonic() + DONE_TIMEOUT_S
            while len(features) < len(sim.transactions):
                assert job.poll() is None, f"the pipeline exited after the pause: {said()[-3000:]}"
                assert time.monotonic() < deadline, f"{len(features)} of {len(sim.transactions)} features"
                time.sleep(5)
                features = list(read_topic(clients, settings.topics.features))
            assert commits(checkpoint) > before
            os.killpg(job.pid, signal.SIGINT)  # Ctrl-C, as a terminal sends it to the foreground group
            stopped = job.wait(timeout=120)
        finally:
            if job.poll() is None:
                os.killpg(job.pid, signal.SIGKILL)
                job.wait()

        text = said()
        away = [line for line in text.splitlines() if "Kafka unreachable" in line]
        back = [line for line in text.splitlines() if "Kafka answers again" in line]
        print(
            f"pause of {BROKER_PAUSE_S:.0f} s, {'inside' if in_transaction else 'outside'} a transaction; "
            f"{len(away)} outage lines, {len(back)} recovery lines; Ctrl-C exit {stopped}"
        )
        assert away and len(away) == len(back), f"outage lines {away}, recovery lines {back}"
        assert not any("fraud up" in line or "FRAUD_BOOTSTRAP_SERVERS" in line for line in away), away
        assert "Traceback" not in text, text[-3000:]
        assert stopped in (0, 130), f"Ctrl-C: exit {stopped}: {text[-2000:]}"

        output = feature_jobs.FeatureOutput(features)
        feature_jobs.assert_each_transaction_once(output, sim.transactions)
        feature_jobs.assert_same_as_batch(output.by_tx(), sim, params)
        scores = [
            ScoreRecord.model_validate_json(m.value() or b"")
            for m in read_topic(clients, settings.topics.scores)
        ]
        counts = collections.Counter(score.tx_id for score in scores)
        assert set(counts) == set(sim.transactions), "transactions without a score"
        assert max(counts.values()) == 1, "a transaction scored twice"
        for score in scores:
            assert abs(score.score - expected.scores[score.tx_id]) <= 1e-9, f"tx {score.tx_id}: another score"
