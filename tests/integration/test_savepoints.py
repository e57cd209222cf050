"""Savepoints as a user takes them: `fraud features run` runs on the first part of a simulation and a
savepoint is taken with `fraud savepoint create` while it runs. The rest of the input arrives; the job
processes it too, and beside it a new version of the job (one more window: four more features) starts
`--from-savepoint` in a namespace of its own (its own features topic and checkpoint) and processes the input
from the savepoint on with `--once`.

The first job is the uninterrupted run: its features equal the batch path's. Its records of the micro-batches
up to the savepoint's, followed by the new version's records, are its own records exactly, but for the
features added: each transaction once, the same key, timestamp and value. The added features equal the
batch path's of the new version: computed from the state the savepoint holds from the new version's first
micro-batch on. Jobs that do not fit the savepoint are refused before Spark starts.

Rescaling: from the same savepoint (6 buckets), a job in 12 buckets and 3 shuffle partitions, then from a
savepoint of that one a job in 3 buckets, restarted once from its own checkpoint without the savepoint:
the first job's records up to the savepoint followed by theirs are the first job's records exactly.
"""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import orjson
import pytest
from confluent_kafka import Message
from pyspark.sql import SparkSession

from contracts.provenance import provenance_of
from contracts.settings import DEFAULT_PAGE_BYTES, DEFAULT_SLOTS
from features.definitions import FeatureParams
from features.entries import ENTRY_FORMAT
from features.state_layout import LAYOUT_FILE
from fraud import cli, jobs, savepoints
from fraud.savepoints import SAVEPOINT_FILE
from infra.clients import Clients
from infra.kafka.admin import create_project_topics
from infra.kafka.log import read_topic
from infra.spark.checkpoint import last_committed, query_location
from infra.spark.offset_log import position_at
from ingest.produce import produce_events
from ingest.simulator import SimulatorConfig
from tests.support.chaos import kill_tree
from tests.support.cli_stack import cli_stack
from tests.support.feature_jobs import (
    FeatureOutput,
    assert_each_transaction_once,
    assert_same_as_batch,
    finished_query,
    simulated,
)

pytestmark = [pytest.mark.integration, pytest.mark.minutes(4.5)]

BIN = Path(sys.executable).parent
SIMULATION = SimulatorConfig(customers=100, terminals=200, days=40, seed=20)
#: Records per micro-batch of the first job: a few micro-batches in each part of the input.
MAX_RECORDS = "800"
NAMESPACE = "restored"
#: The new version's windows: one more (four more features), within the state's 30 days.
UPGRADED = FeatureParams(window_days=(1, 7, 14, 30))
TIMEOUT_S = 180


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Clients, dict[str, str], Path]]:
    """One embedded stack for the module's tests: clients, the `fraud` command's environment, a directory."""
    home = tmp_path_factory.mktemp("savepoints")
    with cli_stack(home) as (_, clients, env):
        yield clients, env, home


def fraud(env: dict[str, str], *args: str, timeout: float = TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "fraud"), *args], env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


def start(env: dict[str, str], log: Path, *args: str) -> subprocess.Popen[bytes]:
    """``fraud ARGS`` running in a session of its own, its output to ``log``."""
    with log.open("wb") as out:
        return subprocess.Popen(
            [str(BIN / "fraud"), *args], env=env, stdout=out, stderr=out, start_new_session=True
        )


def frontier_committed(query: Path) -> bool:
    """Whether the query has committed a micro-batch that carried a frontier (the first one that reads
    records does: the frontier follows the records in the micro-batch that reads them)."""
    batch = last_committed(query)
    return batch is not None and position_at(query, batch).frontier_ms is not None


def wait_for(
    condition: Callable[[], bool], what: str, job: subprocess.Popen[bytes], log: Path, poll_s: float = 0.2
) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while not condition():
        assert job.poll() is None, log.read_text(errors="replace")[-3000:]
        assert time.monotonic() < deadline, f"{what} within {TIMEOUT_S} s"
        time.sleep(poll_s)


def test_a_job_started_from_a_savepoint_continues_exactly_where_it_was_taken(
    stack: tuple[Clients, dict[str, str], Path], spark: SparkSession
) -> None:
    clients, env, home = stack
    params = FeatureParams()
    sim = simulated(SIMULATION, clients.settings, params)
    topics = clients.settings.topics
    create_project_topics(clients.admin(), clients.settings)
    cut = min(sim.events.tx_times) + (max(sim.events.tx_times) - min(sim.events.tx_times)) * 6 // 10
    first, rest = sim.events.split_at(cut)
    assert produce_events(clients.producer(), topics, first).delivery_errors == []

    checkpoint = home / "home" / "checkpoints" / "features"  # the run command's default
    savepoint = home / "savepoint"
    log, resumed_log = home / "features.log", home / "resumed.log"
    running = [start(env, log, "features", "run", "--max-records", MAX_RECORDS)]
    job = running[0]
    try:
        # While it works through the first part: its state holds events waiting for the frontier.
        wait_for(
            lambda: frontier_committed(query_location(checkpoint)), "a micro-batch with a frontier", job, log
        )
        taken = fraud(env, "savepoint", "create", "features", "--to", str(savepoint))
        assert taken.returncode == 0, taken.stderr
        assert job.poll() is None, "the savepoint was taken while the job ran"
        assert produce_events(clients.producer(), topics, rest).delivery_errors == []
        # The new version starts beside the running job, in a namespace of its own.
        resumed = start(
            env, resumed_log, "features", "run", "--once", "--namespace", NAMESPACE,
            "--from-savepoint", str(savepoint), "--windows", ",".join(map(str, UPGRADED.window_days)),
        )  # fmt: skip
        running.append(resumed)

        def all_written() -> bool:
            return len(list(read_topic(clients, topics.features))) >= len(sim.transactions)

        wait_for(all_written, "every transaction's features", job, log, poll_s=2.0)
        last_batch = last_committed(query_location(checkpoint))
        kill_tree(job)  # idle: it has written everything
        assert resumed.wait(timeout=TIMEOUT_S) == 0, resumed_log.read_text(errors="replace")[-3000:]
    finally:
        for process in running:
            if process.poll() is None:
                kill_tree(process)

    saved = json.loads((savepoint / SAVEPOINT_FILE).read_text())
    assert saved["job"] == "features" and saved["checkpoint"] == str(checkpoint)
    assert last_batch is not None and saved["batch"] < last_batch
    assert set(saved["offsets"]) == {
        f"{t}/{p}" for t in (topics.transactions, topics.labels) for p in range(3)
    }
    assert saved["frontier_ms"] is not None and saved["frontier_ms"] <= cut
    assert saved["layout"] == {
        "card_buckets": 6,
        "terminal_buckets": 6,
        "card_slots": DEFAULT_SLOTS,
        "terminal_slots": DEFAULT_SLOTS,
        "page_bytes": DEFAULT_PAGE_BYTES,
        "entry_format": ENTRY_FORMAT,
    }
    resumed_output = resumed_log.read_text()
    assert f"Starting from savepoint {savepoint} (batch {saved['batch']}" in resumed_output
    added = [name for name in UPGRADED.feature_columns if name not in params.feature_columns]
    assert f"takes over state built for other features (features added: {', '.join(added)})" in resumed_output
    # The new job's checkpoint needs nothing of the one the savepoint was taken from.
    for path in (home / "home" / "checkpoints" / NAMESPACE / "features").rglob("*"):
        if path.is_file() and path.suffix not in (".zip", ".sst", ".changelog"):
            assert str(checkpoint) not in path.read_text(errors="replace"), path

    uninterrupted = FeatureOutput(list(read_topic(clients, topics.features)))
    assert_each_transaction_once(uninterrupted, sim.transactions)
    assert_same_as_batch(uninterrupted.by_tx(), sim, params)
    before = [m for m in uninterrupted.records if batch_of(m) <= saved["batch"]]
    after = FeatureOutput(list(read_topic(clients, topics.in_namespace(NAMESPACE).features)))
    assert before and after.records, "the savepoint lies between the first job's micro-batches"
    assert_each_transaction_once(FeatureOutput(before + after.records), sim.transactions)
    assert_same_as_batch(after.by_tx(), simulated(SIMULATION, clients.settings, UPGRADED), UPGRADED)
    expected = uninterrupted.by_tx()
    for message in [*before, *after.records]:
        value = orjson.loads(message.value() or b"")
        value["features"] = {k: v for k, v in value["features"].items() if k not in added}
        want = expected[value["tx_id"]]
        assert (message.key(), value, message.timestamp()) == (
            want.key(),
            orjson.loads(want.value() or b""),
            want.timestamp(),
        ), f"tx {value['tx_id']}: the record differs from the uninterrupted run's"
    read = sum(saved["offsets"].values())
    print(
        f"\nsavepoint at micro-batch {saved['batch']} of {last_batch}, {read:,} of {len(first.tx_values):,} + "
        f"{len(first.label_values):,} records of the first part read: {len(before):,} feature records before "
        f"it, {len(after.records):,} from the job started from it; {saved['files']} files, {saved['size_bytes']:,} bytes"
    )

    # Jobs that do not fit the savepoint, refused before Spark starts (run in this process: no JVM).
    code, error = run_in_process(
        env, "features", "run", "--windows", "1,7,60", "--namespace", "other",
        "--from-savepoint", str(savepoint),
    )  # fmt: skip
    assert code == 5 and "lacks the history they need (the card features look back 60 d, the state" in error
    code, error = run_in_process(env, "score", "run", "--from-savepoint", str(savepoint))
    assert code == 5 and "is of the features job, not of the scoring job" in error
    code, error = run_in_process(env, "pipeline", "run", "--from", "-1d", "--from-savepoint", str(savepoint))
    assert code == 2 and "--from and --from-savepoint both say where to start" in error
    used = home / "home" / "checkpoints" / "used"
    (used / "query").mkdir(parents=True)
    code, error = run_in_process(
        env, "features", "run", "--checkpoint", str(used), "--from-savepoint", str(savepoint)
    )
    assert code == 5 and f"checkpoint {used} is not empty" in error
    code, error = run_in_process({**env, "FRAUD_CARD_BUCKETS": "12"}, "features", "run", "--once")
    assert (
        code == 5
        and f"'card_buckets': 6, 'card_slots': {DEFAULT_SLOTS}, 'entry_format': {ENTRY_FORMAT}, "
        f"'page_bytes': {DEFAULT_PAGE_BYTES}, "
        "'terminal_buckets': 6, "
        f"'terminal_slots': {DEFAULT_SLOTS}}}, this run asks for"
        in error
    )
    assert "rescale it through a savepoint" in error

    # Rescaled: 6 buckets (the savepoint) to 12 to 3, then a restart, each job on from where the last stopped.
    span = max(sim.events.tx_times) - min(sim.events.tx_times)
    cuts = [min(sim.events.tx_times) + span * share // 100 for share in (75, 90)]
    started = time.monotonic()
    rescaled = rescale_runs(spark, clients, home, savepoint, cuts)
    seconds = time.monotonic() - started
    assert_same_records(FeatureOutput(before + rescaled), uninterrupted, sim.transactions)
    print(f"rescaled 6 -> 12 -> 3 buckets: {len(rescaled):,} feature records in three runs, {seconds:.1f} s")


#: Records per micro-batch of the rescaled jobs: a few micro-batches each.
RESCALED_MAX_RECORDS = 1_500


def rescale_runs(
    spark: SparkSession, clients: Clients, home: Path, savepoint: Path, cuts: list[int]
) -> list[Message]:
    """From ``savepoint`` (6 buckets, 2 shuffle partitions), as `fraud features run` starts the jobs
    (``fraud.jobs``) but in this process's Spark session: a job in 12 buckets and 3 shuffle partitions, in a
    namespace of its own, runs `--once` up to ``cuts[0]`` and a savepoint of it is taken; a job in 3
    buckets and 2 shuffle partitions starts from that one and runs up to ``cuts[1]``; the second savepoint
    is deleted and that job, restarted from its checkpoint, runs to the end. Their feature records."""
    params = FeatureParams()

    def run(namespace: str, buckets: int, shuffle: int, end_ms: int | None, start: Path | None) -> Path:
        settings = clients.settings.model_copy(
            update={"card_buckets": buckets, "terminal_buckets": buckets, "spark_shuffle_partitions": shuffle}
        )
        checkpoint = home / "rescaled" / namespace
        job = jobs.feature_job_config(
            settings,
            clients,
            topics=settings.topics.in_namespace(namespace),
            checkpoint=checkpoint,
            params=params,
            max_records=RESCALED_MAX_RECORDS,
            scope=jobs.Scope(namespace, end_ms=end_ms),
        )
        ready = jobs.prepare_run(settings, clients, job, start)
        assert (ready.rescale is not None) == (start is not None), "a re-keyed first state, only at first"
        spark.conf.set("spark.sql.shuffle.partitions", str(shuffle))  # as the job's session would have it
        try:
            finished_query(spark, job, ready)
        finally:
            spark.conf.set("spark.sql.shuffle.partitions", str(clients.settings.spark_shuffle_partitions))
        return checkpoint

    twelve = run("twelve", 12, 3, cuts[0], savepoint)
    assert json.loads((twelve / LAYOUT_FILE).read_text()) == {
        "card_buckets": 12,
        "terminal_buckets": 12,
        "card_slots": DEFAULT_SLOTS,
        "terminal_slots": DEFAULT_SLOTS,
        "page_bytes": DEFAULT_PAGE_BYTES,
        "entry_format": ENTRY_FORMAT,
    }
    origin = json.loads((twelve / savepoints.RESTORED_FILE).read_text())
    assert origin["rescaled"] == "card_buckets 6 -> 12, terminal_buckets 6 -> 12, shuffle partitions 2 -> 3"
    saved = savepoints.take("features", "twelve", twelve, home / "rescaled" / "savepoint-twelve")
    assert (saved.shuffle_partitions, saved.layout["card_buckets"]) == (3, 12)
    assert saved.batch >= 1, "micro-batches after the first, which alone gets the re-keyed state"
    three = run("three", 3, 2, cuts[1], saved.path)
    shutil.rmtree(saved.path)  # the first micro-batch has committed: the checkpoint needs it no more
    assert last_committed(query_location(three)) is not None  # so a restart needs the savepoint no more
    run("three", 3, 2, None, None)
    topics = clients.settings.topics
    return [
        message
        for namespace in ("twelve", "three")
        for message in read_topic(clients, topics.in_namespace(namespace).features)
    ]


def assert_same_records(
    joined: FeatureOutput, uninterrupted: FeatureOutput, transactions: Iterable[int]
) -> None:
    """Each transaction once, with the uninterrupted run's record: the same key, value and timestamp."""
    assert_each_transaction_once(joined, transactions)
    expected = uninterrupted.by_tx()
    for tx_id, message in joined.by_tx().items():
        want = expected[tx_id]
        assert (message.key(), message.value(), message.timestamp()) == (
            want.key(),
            want.value(),
            want.timestamp(),
        ), f"tx {tx_id}: the record differs from the uninterrupted run's"


def batch_of(message: Message) -> int:
    """The micro-batch that wrote a record (its provenance header)."""
    provenance = provenance_of(message.headers())
    assert provenance is not None, "a feature record without its provenance"
    return provenance.batch


def run_in_process(env: dict[str, str], *args: str) -> tuple[int, str]:
    """``fraud ARGS`` in this process with the ``FRAUD_*`` settings of ``env``, for a command that stops
    before Spark starts: its exit code and its error output."""
    errors = io.StringIO()
    with pytest.MonkeyPatch.context() as patch:
        for name, value in env.items():
            if name.startswith("FRAUD_"):
                patch.setenv(name, value)
        patch.setattr(sys, "stderr", errors)  # the CLI's error console writes to the current sys.stderr
        with pytest.raises(SystemExit) as exit_:
            cli.run(list(args))
    return int(exit_.value.code or 0), " ".join(errors.getvalue().split())
