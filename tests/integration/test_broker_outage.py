"""A broker outage under a running job: the pipeline waits it out in every place it talks to Kafka, says so
in two lines, and loses or repeats nothing.

Starts `fraud pipeline run` (continuous, small micro-batches) on an embedded stack of the test's own, over
input that is all there, and once it works (a micro-batch committed, then a write task holding a Kafka
transaction open with records: the features topic's last stable offset behind its records) stops the
broker (SIGSTOP) for 90 s, longer than any Kafka call of the job waits for an answer (60 s), then lets it go
on (SIGCONT); once it works again, SIGKILLs the broker, leaves it down for 20 s and starts it again on its
port and log directory (which it recovers). Meanwhile the connector and the frontier source plan micro-batches, a
write task has its transaction open, and the observer group's commits and the input watch meet the
absent broker too. Expects the job still running after each outage, one line saying Kafka is away and one
that it answers again from each process that waited (after the pause at least one; the 20 s of the kill
may pass within the calls' own retries), no traceback and no start-up advice, then every
transaction's feature record and score exactly once (lost 0, duplicated 0), the features equal to the
batch path's and the scores to the model's. Ctrl-C to the job's process group then stops it without a
traceback.
"""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
from confluent_kafka import Message

from contracts.records import ScoreRecord
from features.definitions import FeatureParams
from infra.clients import Clients
from infra.embedded import StackInfo
from infra.kafka_log import read_topic
from ingest.produce import produce_events
from ingest.simulator import SimulatorConfig, simulate
from tests.support import feature_jobs
from tests.support.chaos import kill_broker, pause, restart_broker, wait_held_back
from tests.support.cli_stack import cli_stack, register_champion

pytestmark = [pytest.mark.chaos, pytest.mark.integration, pytest.mark.minutes(6)]

BIN = Path(sys.executable).parent
SIMULATION = SimulatorConfig(customers=120, terminals=400, days=25, seed=35)
TRAINING = SimulatorConfig(customers=60, terminals=150, days=25, seed=35)
#: Records per micro-batch: the job is still at work on its input when the broker stops.
MAX_RECORDS = 600
#: Longer than any Kafka call of a running job waits for an answer (``KAFKA_CALL_TIMEOUT_S``, 60 s).
BROKER_PAUSE_S = 90.0
#: How long a killed broker stays down before it starts again.
BROKER_DOWN_S = 20.0
#: How long the fault waits for a write task to hold a transaction open before it strikes anyway.
TRANSACTION_WAIT_S = 30.0
#: To the first committed micro-batch (Spark's start, the model's load), and to the end of the input.
START_TIMEOUT_S = DONE_TIMEOUT_S = 600.0


def commits(checkpoint: Path) -> int:
    folder = checkpoint / "query" / "commits"
    return sum(1 for p in folder.iterdir() if p.name.isdigit()) if folder.is_dir() else 0


def pause_90_s(stack: StackInfo) -> None:
    """SIGSTOP the broker for 90 s, then SIGCONT it."""
    pause(stack.broker.pid, BROKER_PAUSE_S)


def kill_and_restart(stack: StackInfo, home: Path) -> StackInfo:
    """SIGKILL the broker, leave it down for a while, start it again on its port and log directory."""
    kill_broker(stack.broker)
    time.sleep(BROKER_DOWN_S)
    return replace(stack, broker=restart_broker(home, stack.broker))


@pytest.mark.timeout(1800)  # about 6 minutes on 2 idle cores, 110 s of them the outages
def test_a_running_pipeline_waits_out_a_broker_pause_and_a_broker_restart(tmp_path: Path) -> None:
    params = FeatureParams()
    with cli_stack(tmp_path) as (stack, clients, env):
        restarted: list[int] = []
        try:
            outcome = run_through_faults(tmp_path, stack, clients, env, params, restarted)
        finally:
            for pid in restarted:  # the stack stops the broker it recorded: this one is another process
                os.kill(pid, signal.SIGTERM)
    print(outcome)


def run_through_faults(
    tmp_path: Path,
    stack: StackInfo,
    clients: Clients,
    env: dict[str, str],
    params: FeatureParams,
    restarted: list[int],
) -> str:
    """The pipeline through a broker pause and then a broker restart, its output checked; what happened."""
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

    def lines(words: str) -> int:
        return sum(words in line for line in said().splitlines())

    admin = clients.admin()
    faults: list[str] = []
    try:
        for name, killed in (
            (f"a broker pause of {BROKER_PAUSE_S:.0f} s", False),
            (f"the broker SIGKILLed, started again {BROKER_DOWN_S:.0f} s later", True),
        ):
            before = commits(checkpoint)
            deadline = time.monotonic() + START_TIMEOUT_S
            while (
                commits(checkpoint) <= before
            ):  # a job at work: a micro-batch committed since the last fault
                assert job.poll() is None, f"the pipeline exited before {name}: {said()[-3000:]}"
                assert time.monotonic() < deadline, f"no micro-batch committed before {name}"
                time.sleep(0.2)
            inside = wait_held_back(admin, [settings.topics.features], TRANSACTION_WAIT_S)
            if killed:
                stack = kill_and_restart(stack, tmp_path / "stack")
                restarted.append(stack.broker.pid)
                admin = clients.admin()
            else:
                pause_90_s(stack)
            assert job.poll() is None, f"the pipeline did not survive {name}: {said()[-3000:]}"
            faults.append(f"{name} ({'inside' if inside else 'outside'} a transaction)")
            if not killed:  # longer than any call of the job waits: it says so
                assert lines("Kafka unreachable"), f"no line said Kafka was away: {said()[-3000:]}"

        features: list[Message] = []
        deadline = time.monotonic() + DONE_TIMEOUT_S
        while len(features) < len(sim.transactions):
            assert job.poll() is None, f"the pipeline exited after the outages: {said()[-3000:]}"
            assert time.monotonic() < deadline, f"{len(features)} of {len(sim.transactions)} features"
            time.sleep(5)
            features = list(read_topic(clients, settings.topics.features))
        os.killpg(job.pid, signal.SIGINT)  # Ctrl-C, as a terminal sends it to the foreground group
        stopped = job.wait(timeout=120)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()

    text = said()
    away = [line for line in text.splitlines() if "Kafka unreachable" in line]
    back = [line for line in text.splitlines() if "Kafka answers again" in line]
    scores = [
        ScoreRecord.model_validate_json(m.value() or b"") for m in read_topic(clients, settings.topics.scores)
    ]
    counts = collections.Counter(score.tx_id for score in scores)
    lost = len(set(sim.transactions) - set(counts))
    duplicated = sum(n - 1 for n in counts.values())
    outcome = (
        f"{'; '.join(faults)}: {len(away)} outage lines, {len(back)} recovery lines; "
        f"{len(sim.transactions):,} transactions: lost {lost}, duplicated {duplicated}; Ctrl-C exit {stopped}"
    )
    assert len(away) == len(back), f"outage lines {away}, recovery lines {back}: {outcome}"
    assert not any("fraud up" in line or "FRAUD_BOOTSTRAP_SERVERS" in line for line in away), away
    assert "Traceback" not in text, text[-3000:]
    assert stopped in (0, 130), f"Ctrl-C: exit {stopped}: {text[-2000:]}"

    output = feature_jobs.FeatureOutput(features)
    feature_jobs.assert_each_transaction_once(output, sim.transactions)
    feature_jobs.assert_same_as_batch(output.by_tx(), sim, params)
    assert not lost, f"transactions without a score: {outcome}"
    assert not duplicated, f"a transaction scored twice: {outcome}"
    for score in scores:
        assert abs(score.score - expected.scores[score.tx_id]) <= 1e-9, f"tx {score.tx_id}: another score"
    return outcome
