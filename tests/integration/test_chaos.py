"""Exactly-once under faults, counted: the jobs as a user runs them (`fraud features run`, `fraud score run`,
`fraud pipeline run`), SIGKILLed at seeded random moments, a Redis restart, a broker pause of 90 s and the broker
SIGKILLed and started again, on more than 50,000 simulated transactions, on an embedded stack of the test's own.

The feature job and the scoring job run side by side, continuously, and beside them the one-query
pipeline in a namespace of its own (its own output topics and Redis keys, the same input). They are
killed in turns (the whole application: driver, JVM, Python daemon and workers) and each is started
again from its checkpoint at once: three kills of each separate job, four of the pipeline. The first kill
of each job waits until a write task of the job holds a Kafka transaction open with records in it (its
output topic's last stable offset behind the records written): those kills land inside a transaction,
counted when the transaction is still open after the kill; the others at a seeded random moment up to 8 s
after their turn comes (start-ups included). The input is there from the start (arriving while a job waits with
nothing to do, it could be late across partitions: the jobs run without allowed lateness). After the
second kill Redis is shut down until a job waits to write it, then started again; after the fifth, once
every job works, the broker is stopped (SIGSTOP) for 90 s, longer than any Kafka call of the jobs waits
for an answer; after the eighth, once every job works and a write task of the feature job holds a
transaction open (or 30 s passed), the broker is SIGKILLed, left down for 20 s and started again on its port
and log directory, which it recovers. Every job is still running after each outage, and says in one line
that Kafka is away and in one that it answers again, with no start-up advice. Then each job finishes with
``--once`` (a job whose last kill comes after every outage restarts with ``--once`` at that kill).

Compared with an undisturbed run (the batch path's features, the model's scores of them): every
transaction has exactly one committed feature record and one score, equal to the undisturbed ones; the
alerts on the topic are exactly the transactions the model flags, once each, and Redis holds the same
alert records; read_committed readers see no record of an aborted attempt (two records with one
provenance). ``CHAOS_SEED=N`` repeats another schedule.
"""

from __future__ import annotations

import collections
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import redis
from confluent_kafka import Message
from confluent_kafka.admin import AdminClient

from contracts.events import TxColumns
from contracts.provenance import provenance_of
from contracts.records import AlertRecord, ScoreRecord
from contracts.redis_keys import alert_key
from contracts.settings import Topics, redis_prefix
from features.definitions import FeatureParams
from infra.clients import Clients
from infra.kafka.log import read_topic
from infra.redis.reads import get_alert
from ingest.produce import produce_events
from ingest.simulator import SimulatorConfig, simulate
from tests.support.chaos import (
    held_back,
    kill_broker,
    kill_tree,
    pause,
    restart_broker,
    start_redis,
    stop_redis,
    wait_held_back,
)
from tests.support.cli_stack import cli_stack, register_champion
from tests.support.feature_jobs import (
    Expected,
    FeatureOutput,
    assert_each_transaction_once,
    assert_same_as_batch,
    expected_results,
    simulated,
)

pytestmark = [pytest.mark.chaos, pytest.mark.integration, pytest.mark.minutes(14)]

C = TxColumns
BIN = Path(sys.executable).parent
SIMULATION = SimulatorConfig(customers=760, terminals=2500, days=35, seed=23)
MIN_TRANSACTIONS = 50_000
#: A smaller world of the same kind for the model (any model will do, training it is not under test).
TRAINING = SimulatorConfig(customers=150, terminals=300, days=35, seed=23)
#: Records per micro-batch: enough micro-batches between kills for each to land in a running job.
MAX_RECORDS = 2_500
#: SIGKILLs of the feature and the scoring job each, and of the pipeline.
SEPARATE_JOB_KILLS, PIPELINE_KILLS = 3, 4
#: Longer than any Kafka call of the jobs waits for an answer (a transaction's commit: 60 s).
BROKER_PAUSE_S = 90.0
#: How long the SIGKILLed broker stays down before it starts again.
BROKER_DOWN_S = 20.0
#: How long a kill waits for a write task to hold a transaction open before it kills anyway.
TRANSACTION_WAIT_S = 30.0
#: The other kills land within this many seconds of their turn.
RANDOM_KILL_WITHIN_S = 8.0
PROGRESS_TIMEOUT_S = 60.0
#: A job killed just before may still be starting (its JVM, its first micro-batch) when Redis goes down.
REDIS_NOTICED_TIMEOUT_S = 300.0
NAMESPACE = "chaos"
SEED = int(os.environ.get("CHAOS_SEED", "20261126"))
TOLERANCE = 1e-9


@dataclass
class Faults:
    kills: collections.Counter[str] = field(default_factory=collections.Counter)
    in_transaction: int = 0
    redis_restarts: int = 0
    broker_pauses: int = 0
    broker_restarts: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        per_job = ", ".join(f"{job} {n}" for job, n in sorted(self.kills.items()))
        restarts = "; ".join(self.broker_restarts)
        return (
            f"{sum(self.kills.values())} SIGKILLs ({per_job}; {self.in_transaction} inside a Kafka transaction), "
            f"{self.redis_restarts} Redis restart, {self.broker_pauses} broker pause of {BROKER_PAUSE_S:.0f} s, "
            f"{len(self.broker_restarts)} broker SIGKILL and restart {BROKER_DOWN_S:.0f} s later ({restarts})"
        )


class Job:
    """One `fraud` streaming command as a subprocess in a session of its own, started again after each kill."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], logs: Path, output: str) -> None:
        self.name, self.argv, self.env, self.output = name, argv, env, output
        self.checkpoint = Path(argv[argv.index("--checkpoint") + 1])
        self.log = logs / f"{name}.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.commits_at_start = 0
        self.once = False

    def start(self, once: bool = False) -> None:
        """Continuously, or with ``--once``: to the end of the input."""
        self.commits_at_start, self.once = self.commits(), once
        argv = [str(BIN / "fraud"), *self.argv, *(["--once"] if once else [])]
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                argv, env=self.env, stdout=log, stderr=log, start_new_session=True
            )

    def commits(self) -> int:
        commits = self.checkpoint / "query" / "commits"
        return sum(1 for p in commits.iterdir() if p.name.isdigit()) if commits.is_dir() else 0

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def wait_for_progress(self) -> bool:
        """Until a micro-batch commits after the last start (so the next kill finds a job at work), or
        ``PROGRESS_TIMEOUT_S`` (the job may have caught up with its input): whether one did."""
        deadline = time.monotonic() + PROGRESS_TIMEOUT_S
        while self.commits() <= self.commits_at_start:
            assert self.running(), f"{self.name} exited: {self.tail()}"
            if time.monotonic() > deadline:
                return False
            time.sleep(0.2)
        return True

    def kill(self) -> None:
        if self.process is not None:
            kill_tree(self.process)
            self.process = None

    def finish(self) -> subprocess.Popen[bytes]:
        """The run with ``--once``: the one started at the last kill, or else the continuous run killed and
        the same command started with ``--once``."""
        if not (self.once and self.process is not None):
            self.kill()
            self.start(once=True)
        assert self.process is not None
        return self.process

    def finished(self, run: subprocess.Popen[bytes]) -> None:
        assert run.wait(timeout=600) == 0, f"{self.name} --once failed: {self.tail()}"
        self.process = None

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]


def kill_at_random(
    job: Job, admin: AdminClient, rng: random.Random, faults: Faults, inside_transaction: bool, once: bool
) -> None:
    """Kill ``job`` inside a Kafka transaction (once it works, when a write task holds one open with
    records), or at a seeded random moment up to ``RANDOM_KILL_WITHIN_S`` from now; start it again at once
    (with ``--once`` if ``once``)."""
    if inside_transaction and job.wait_for_progress():
        wait_held_back(admin, [job.output], TRANSACTION_WAIT_S)
    else:
        time.sleep(rng.uniform(0.0, RANDOM_KILL_WITHIN_S))
    job.kill()
    faults.in_transaction += bool(held_back(admin, [job.output]))  # the killed writer's transaction is open
    faults.kills[job.name] += 1
    job.start(once)


def run_with_kills(
    kills: dict[Job, int],
    admin: AdminClient,
    rng: random.Random,
    faults: Faults,
    between: dict[int, Callable[[], None]],
    finish: list[list[Job]],
) -> None:
    """Each job killed as often as ``kills`` says, the jobs taking turns (one restarts while the next is
    killed); the first round's kills land inside a transaction. ``between[i]`` runs after the i-th
    kill. Then every job finishes its input with ``--once``: the jobs of each list of ``finish`` side by
    side, the lists one after another (a job after those whose output it reads). A job's last kill after
    the last of ``between`` starts it again with ``--once`` already."""
    rounds = [[job for job, n in kills.items() if n > turn] for turn in range(max(kills.values()))]
    order = [(job, turn == 0, turn == kills[job] - 1) for turn, jobs in enumerate(rounds) for job in jobs]
    for i, (job, inside_transaction, last) in enumerate(order):
        kill_at_random(job, admin, rng, faults, inside_transaction, last and i > max(between))
        if i in between:
            between[i]()
    for side_by_side in finish:
        runs = [(job, job.finish()) for job in side_by_side]
        for job, run in runs:
            job.finished(run)


def read_counting_aborted(clients: Clients, topic: str) -> tuple[list[Message], int]:
    """The records of ``topic`` (read_committed), and how many of them repeat the provenance of an earlier one
    (partition, writer, batch, position): records of an aborted attempt, which a reader must never see."""
    seen: set[tuple[int, str, int, int]] = set()
    aborted, records = 0, []
    for message in read_topic(clients, topic):
        found = provenance_of(message.headers())
        if found is not None:
            key = (message.partition() or 0, found.writer, found.batch, found.seq)
            aborted += key in seen
            seen.add(key)
        records.append(message)
    return records, aborted


def check_run(
    clients: Clients, topics: Topics, prefix: str, expected: Expected, params: FeatureParams
) -> dict[str, int]:
    """Every figure of one run, asserting exactly-once and equality with the undisturbed results."""
    sim = expected.sim
    (records, feature_aborted), (score_records, score_aborted), (alert_records, alert_aborted) = (
        read_counting_aborted(clients, topic) for topic in (topics.features, topics.scores, topics.alerts)
    )
    aborted = feature_aborted + score_aborted + alert_aborted
    assert not aborted, f"{aborted} records of aborted attempts read"
    features = FeatureOutput(records)
    assert_each_transaction_once(features, sim.transactions)
    assert_same_as_batch(features.by_tx(), sim, params)

    scores = [ScoreRecord.model_validate_json(m.value() or b"") for m in score_records]
    counts = collections.Counter(score.tx_id for score in scores)
    lost = sorted(set(sim.transactions) - set(counts))
    duplicated = {tx: n for tx, n in counts.items() if n > 1}
    assert not lost, f"{len(lost)} transactions have no score, e.g. {lost[:10]}"
    assert not duplicated, (
        f"{len(duplicated)} transactions scored more than once, e.g. {list(duplicated.items())[:10]}"
    )
    got = pd.Series({score.tx_id: score.score for score in scores}).sort_index()
    want = expected.scores.loc[got.index]
    wrong = np.flatnonzero(~(np.abs(got.to_numpy() - want.to_numpy()) <= TOLERANCE))
    assert not len(wrong), (
        f"{len(wrong)} scores differ from the undisturbed ones, e.g. {got.index[wrong[:5]].tolist()}"
    )
    assert {score.model_version for score in scores} == {expected.version}

    alerts = [AlertRecord.model_validate_json(m.value() or b"") for m in alert_records]
    alert_counts = collections.Counter(alert.tx_id for alert in alerts)
    flagged = set(expected.scores.index[expected.scores >= expected.threshold])
    assert set(alert_counts) == flagged, "the alerts are not the transactions the model flags"
    assert max(alert_counts.values(), default=1) == 1, "an alert was written twice"
    client = redis.Redis.from_url(clients.endpoints.redis_url)
    for alert in alerts:
        assert get_alert(client, alert.tx_id, prefix) == alert, (
            f"Redis disagrees with the topic on tx {alert.tx_id}"
        )
    stored = sum(1 for _ in client.scan_iter(match=alert_key(0, prefix)[:-1] + "*", count=10_000))
    assert stored == len(alerts), f"Redis holds {stored} alerts, the topic {len(alerts)}"
    dead = list(read_topic(clients, topics.dead_letter))
    assert not dead, f"{len(dead)} dead letters of good input"
    return {
        "feature records": len(features.records),
        "scores": len(scores),
        "alerts": len(alerts),
        "lost": len(lost),
        "duplicated": sum(n - 1 for n in counts.values()),
        "aborted records read": aborted,
    }


@pytest.mark.timeout(2400)  # about 14 minutes on 2 idle cores; a loaded machine starts JVMs slower
def test_kills_a_redis_restart_a_broker_pause_and_restart_lose_and_duplicate_nothing(tmp_path: Path) -> None:
    rng = random.Random(SEED)
    params = FeatureParams()
    faults = Faults()
    with cli_stack(tmp_path, FRAUD_TOKEN_KEY=f"chaos-token-key-{SEED}") as (stack, clients, env):
        settings = clients.settings
        tracking_uri = clients.endpoints.mlflow_tracking_uri
        register_champion(clients, simulate(TRAINING), params, tmp_path / "artifacts")
        sim = simulated(SIMULATION, settings, params)
        assert len(sim.transactions) >= MIN_TRANSACTIONS
        expected = expected_results(sim, tracking_uri, params)
        subprocess.run([str(BIN / "fraud"), "topics", "create"], env=env, check=True, capture_output=True)
        assert produce_events(clients.producer(), settings.topics, sim.events).delivery_errors == []

        logs, home = tmp_path / "logs", tmp_path / "home"
        logs.mkdir()

        def make_job(name: str, command: list[str], output: str) -> Job:
            argv = [*command, "--max-records", str(MAX_RECORDS), "--checkpoint", str(home / f"cp-{name}")]
            return Job(name, argv, env, logs, output)

        every = ["--trigger-interval-s", "0.5"]
        features = make_job("features", ["features", "run", *every], settings.topics.features)
        scoring = make_job("scoring", ["score", "run", *every], settings.topics.scores)
        in_namespace = settings.topics.in_namespace(NAMESPACE)
        pipeline = make_job("pipeline", ["pipeline", "run", "--namespace", NAMESPACE], in_namespace.features)
        restarted: list[subprocess.Popen[bytes]] = []
        brokers: list[int] = []  # the broker's pids after restarts (the stack stops only the one it started)
        redis_said = f"Redis at {settings.redis_url}"

        def said(line: str) -> bool:
            return any(line in job.log.read_text(errors="replace") for job in jobs)

        def restart_redis() -> None:
            """Down until a job has committed to Kafka and waits to write Redis, then up again."""
            stop_redis(stack.redis)
            deadline = time.monotonic() + REDIS_NOTICED_TIMEOUT_S
            while not said(f"{redis_said} unreachable"):
                assert time.monotonic() < deadline, "no job noticed that Redis is down"
                time.sleep(0.2)
            restarted.append(start_redis(stack.redis, tmp_path / "stack" / "redis"))
            faults.redis_restarts += 1

        def pause_broker() -> None:
            """Once the jobs work (past their start: a job starting while Kafka is away fails at once,
            saying so, by design), for longer than any Kafka metadata request waits."""
            for job in jobs:
                job.wait_for_progress()
            pause(stack.broker.pid, BROKER_PAUSE_S)
            faults.broker_pauses += 1
            for job in jobs:  # a running job waits an outage out
                assert job.running(), f"{job.name} did not survive the broker pause: {job.tail()}"

        def kill_and_restart_broker() -> None:
            """Once the jobs work, at a moment a write task holds a transaction open if one comes soon:
            SIGKILLed, down for a while, started again on its port and log directory."""
            for job in jobs:
                job.wait_for_progress()
            inside = wait_held_back(admin, [settings.topics.features], TRANSACTION_WAIT_S)
            kill_broker(stack.broker)
            time.sleep(BROKER_DOWN_S)
            brokers.append(restart_broker(tmp_path / "stack", stack.broker).pid)
            faults.broker_restarts.append(f"{'inside' if inside else 'outside'} a transaction")
            for job in jobs:
                assert job.running(), f"{job.name} did not survive the broker's restart: {job.tail()}"

        jobs = [features, scoring, pipeline]
        started = time.monotonic()
        try:
            for job in jobs:
                job.start()
            # The scoring job first: it has input to hold a transaction for only while the feature job writes.
            kills = {scoring: SEPARATE_JOB_KILLS, features: SEPARATE_JOB_KILLS, pipeline: PIPELINE_KILLS}
            between = {1: restart_redis, 4: pause_broker, 7: kill_and_restart_broker}
            admin = clients.admin()
            run_with_kills(kills, admin, rng, faults, between, [[features, pipeline], [scoring]])
            # One line when an outage starts, one when it ends (a job's input watch asks the broker every few
            # seconds, whatever its micro-batch waits for), and no start-up advice in them.
            assert said(f"{redis_said} unreachable") and said(f"{redis_said} answers again")
            assert said("Kafka unreachable") and said("Kafka answers again")
            away = [
                line
                for job in jobs
                for line in job.log.read_text(errors="replace").splitlines()
                if "Kafka unreachable" in line
            ]
            assert not any("fraud up" in line or "FRAUD_BOOTSTRAP_SERVERS" in line for line in away), away
            separate = check_run(clients, settings.topics, "", expected, params)
            together = check_run(clients, in_namespace, redis_prefix(NAMESPACE), expected, params)
        finally:
            for job in jobs:
                job.kill()
            for process in restarted:
                process.kill()
                process.wait()
            for pid in brokers:
                os.kill(pid, signal.SIGTERM)
        elapsed = time.monotonic() - started

    summary = (
        f"chaos seed {SEED}: {len(sim.transactions):,} transactions, {elapsed:.0f} s; faults: {faults}\n"
        f"  features + scoring jobs: {separate}\n  pipeline:                {together}"
    )
    print(summary)
    assert (
        sum(faults.kills.values()) == 2 * SEPARATE_JOB_KILLS + PIPELINE_KILLS
        and faults.redis_restarts == 1
        and faults.broker_pauses == 1
        and len(faults.broker_restarts) == 1
    ), summary
