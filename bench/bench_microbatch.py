"""One micro-batch of ``fraud pipeline run`` at a paced load, phase by phase, at each size of a sweep of the
cards held (``--sizes``: 5,000 and 50,000 cards with 31 days of history, 200,000 with 7), one after the
other. For each size:

1. Simulates a fixed-seed input (``ingest.simulator``, as bench_peers.py does); the first ``--backlog-days``
   are the backlog (the state the pipeline holds), the rest feed the paced load. Trains the champion on
   the backlog (batch path; a backlog of fewer than 13 days is too short to learn from, and the champion
   learns from a world of its own, ``project_jobs.CHAMPION_WORLD``) and produces the backlog
   (``ingest.produce``).
2. Starts the real command, ``fraud pipeline run``, as a subprocess on an embedded stack of its own, with
   Spark's event log on (``SPARK_CONF_DIR``) and ``--log-level debug`` (the project's timing lines,
   ``infra.spark.timing``); reads its feature records from the beginning (read_committed) and waits until the
   backlog is through: the first output's time after launch is reported.
3. Streams ``--warmup-s`` then ``--paced-s`` of new transactions at ``--rate``/s (longer when the backlog's
   micro-batches took longer: as long as three of them, up to ``--max-paced-s``, so that micro-batches as
   long as those start in it); the latency from handing a transaction to the producer to its feature record
   being readable, p50/p95/p99, over the measured part.
4. Stops the command (SIGINT: Ctrl-C) and takes apart the micro-batches that ran during the measured part:

   - Spark's progress reports (from the event log): ``durationMs`` (latestOffset: the source's planning,
     queryPlanning, walCommit: the offset log, addBatch: the micro-batch's jobs, commitOffsets: the commit
     log), and the stateful operators' commit and update times;
   - the event log's jobs, stages and tasks inside addBatch: each stage's wall time, its tasks' run time,
     JVM GC, shuffle;
   - the project's timing lines from the Python workers (``infra.spark.timing``): the records the connector
     read reaching Python and their decoding, each stateful stage's state reads and writes and its core,
     scoring, and the sink's transaction (begin and marker, produce, commit) and Redis writes.

   Prints the median of each phase over the measured micro-batches (and their 90th percentile).

Then a table of the sweep (micro-batch median, the stateful stages' state reads, core and writes, latency,
backlog rate, peak memory against the cards held), written with each size's phases into the ``microbatch``
section of docs/benchmarks.md (unless ``--no-report``).

Run: .venv/bin/python bench/bench_microbatch.py [--sizes 5000:31,50000:31] [--rate 2000] [--no-report]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pandas as pd
import project_jobs
import report
from measure import Latency, OutputReader, TreeSampler, pace, wait_for
from project_jobs import TX_PER_CUSTOMER_DAY, events_of

from contracts.events import TxColumns
from features.definitions import FeatureParams
from fraud.metrics import ended_at, records_read
from fraud.options import DEFAULT_MAX_RECORDS
from infra.clients import Clients
from infra.embedded.stack import temporary_stack
from infra.kafka.admin import ensure_topics
from infra.spark.timing import PREFIX as TIMING_PREFIX
from ingest.produce import produce_events
from ingest.simulator import SimulatorConfig, simulate

#: The sweep of ``make bench``: cards and the days of history the state holds for them.
DEFAULT_SIZES = "5000:31,50000:31,200000:7"
#: The measured part of the paced load lasts at least this many of the backlog's micro-batches (each of
#: ``--max-records``, at the backlog rate): at 200,000 cards a micro-batch takes longer than ``--paced-s``.
BATCHES_MEASURED = 3
ROOT = Path(__file__).resolve().parent.parent
LOGS = ROOT / "build" / "bench-microbatch"
FRAUD = Path(sys.executable).parent / "fraud"
PIPELINE = "fraud pipeline run"
PROGRESS_EVENT = "org.apache.spark.sql.streaming.StreamingQueryListener$QueryProgressEvent"
#: Progress ``durationMs`` phases, in the order a micro-batch runs them.
DURATIONS = ("latestOffset", "queryPlanning", "walCommit", "getBatch", "addBatch", "commitOffsets")


# --- The event log ----------------------------------------------------------------------------------------


@dataclass
class Stage:
    stage_id: int
    name: str
    tasks: int = 0
    wall_ms: float = 0.0
    run_ms: float = 0.0
    gc_ms: float = 0.0
    deserialize_ms: float = 0.0
    shuffle_write_ms: float = 0.0
    fetch_wait_ms: float = 0.0
    accumulables: dict[str, float] = field(default_factory=dict)


@dataclass
class EventLog:
    """What the bench reads of Spark's event log."""

    progresses: list[dict[str, Any]] = field(default_factory=list)
    stages: dict[int, Stage] = field(default_factory=dict)
    #: Each micro-batch's stage ids and the wall time of its jobs.
    batch_stages: dict[int, list[int]] = field(default_factory=lambda: defaultdict(list))
    batch_jobs_ms: dict[int, float] = field(default_factory=lambda: defaultdict(float))


def read_event_log(path: Path) -> EventLog:
    """Progress reports, stages and jobs, from Spark's event log (a directory of rolled files)."""
    log = EventLog()
    progresses, stages, batch_stages = log.progresses, log.stages, log.batch_stages
    job_batch: dict[int, tuple[int, int]] = {}
    files = sorted(path.glob("events_*"), key=lambda f: int(f.name.split("_")[1]))
    for line in (line for f in files for line in f.read_text().splitlines()):
        event = json.loads(line)
        kind = event.get("Event")
        if kind == PROGRESS_EVENT:
            progresses.append(event["progress"])
        elif kind == "SparkListenerJobStart":
            batch = (event.get("Properties") or {}).get("streaming.sql.batchId")
            if batch is not None:
                batch_stages[int(batch)] += event.get("Stage IDs", [])
                job_batch[event["Job ID"]] = (int(batch), event["Submission Time"])
        elif kind == "SparkListenerJobEnd" and event["Job ID"] in job_batch:
            batch, submitted = job_batch[event["Job ID"]]
            log.batch_jobs_ms[batch] += event["Completion Time"] - submitted
        elif kind == "SparkListenerStageCompleted":
            info = event["Stage Info"]
            stage = stages.setdefault(info["Stage ID"], Stage(info["Stage ID"], info["Stage Name"]))
            stage.tasks = info["Number of Tasks"]
            if "Completion Time" in info and "Submission Time" in info:
                stage.wall_ms = info["Completion Time"] - info["Submission Time"]
            for accumulable in info.get("Accumulables", []):
                with contextlib.suppress(TypeError, ValueError):
                    stage.accumulables[accumulable["Name"]] = float(accumulable["Value"])
        elif kind == "SparkListenerTaskEnd":
            metrics = event.get("Task Metrics") or {}
            stage = stages.setdefault(event["Stage ID"], Stage(event["Stage ID"], ""))
            stage.run_ms += metrics.get("Executor Run Time", 0)
            stage.gc_ms += metrics.get("JVM GC Time", 0)
            stage.deserialize_ms += metrics.get("Executor Deserialize Time", 0)
            stage.shuffle_write_ms += (metrics.get("Shuffle Write Metrics") or {}).get(
                "Shuffle Write Time", 0
            ) / 1e6
            stage.fetch_wait_ms += (metrics.get("Shuffle Read Metrics") or {}).get("Fetch Wait Time", 0)
    return log


def timing_lines(log: Path) -> Iterator[tuple[str, dict[str, int], dict[str, float]]]:
    """(what, context, phases in ms) of each timing line (``infra.spark.timing``) in the command's log."""
    for line in log.read_text(errors="replace").splitlines():
        at = line.find(f"{TIMING_PREFIX} ")
        if at < 0:
            continue
        what, *pairs = line[at + len(TIMING_PREFIX) + 1 :].split()
        context, phases = {}, {}
        for pair in pairs:
            name, _, value = pair.partition("=")
            with contextlib.suppress(ValueError):
                if "." in value:
                    phases[name] = float(value)
                else:
                    context[name] = int(value)
        yield what, context, phases


#: The stages of the pipeline's micro-batch job, by the timing lines their tasks log.
STAGE_OF = {
    "decode-records": "source",
    "card-stage": "card",
    "terminal-stage": "final",
    "sink-write": "final",
}


def breakdown(
    log: EventLog,
    timings: list[tuple[str, dict[str, int], dict[str, float]]],
    measured_from: float,
    measured_to: float,
) -> tuple[list[list[str]], int, dict[str, float]]:
    """The table rows, the number of micro-batches and each phase's median by its name: each phase's median
    and 90th percentile over the micro-batches that started in the measured part of the paced load
    (wall-clock seconds), with where it comes from."""
    chosen = {
        p["batchId"]: p
        for p in log.progresses
        if measured_from <= ended_at(p) - p["durationMs"]["triggerExecution"] / 1000 <= measured_to
        and records_read(p)
    }
    # Per micro-batch: the sum over its tasks' calls of each (line, phase), per task; then the mean per task.
    per_task: dict[tuple[int, str, str], dict[tuple[int, int], float]] = defaultdict(
        lambda: defaultdict(float)
    )
    stage_kind: dict[int, str] = {}
    for what, context, phases in timings:
        batch = context.get("batch")
        if batch is None or batch not in chosen:
            continue
        if "stage" in context and what in STAGE_OF:
            stage_kind[context["stage"]] = STAGE_OF[what]
        task = (context.get("stage", -1), context.get("task", -1))
        for name, ms in phases.items():
            per_task[batch, what, name][task] += ms

    def task_mean(batch: int, what: str, name: str) -> float:
        tasks = per_task.get((batch, what, name))
        return sum(tasks.values()) / len(tasks) if tasks else 0.0

    figures: dict[str, list[float]] = defaultdict(list)
    for batch, progress in chosen.items():
        durations = progress["durationMs"]
        row = {f"progress.{name}": float(durations.get(name, 0)) for name in ("triggerExecution", *DURATIONS)}
        stages = {
            stage_kind.get(s, "other"): log.stages[s]
            for s in log.batch_stages.get(batch, [])
            if s in log.stages
        }
        for kind in ("source", "card", "final"):
            stage = stages.get(kind)
            row[f"stage.{kind}"] = stage.wall_ms if stage else 0.0
            row[f"gc.{kind}"] = stage.gc_ms / max(1, stage.tasks) if stage else 0.0
        row["jobs"] = log.batch_jobs_ms.get(batch, 0.0)
        row["state-commit"] = float(sum(o.get("commitTimeMs", 0) for o in progress.get("stateOperators", [])))
        for b, what, name in per_task:
            if b == batch:
                row[f"{what}.{name}"] = task_mean(batch, what, name)
        for name, value in row.items():
            figures[name].append(value)
    count = len(chosen)

    def cell(name: str) -> tuple[str, str]:
        values = figures.get(name, [])
        values = values + [0.0] * (count - len(values))
        if not values:
            return "-", "-"
        return f"{np.percentile(values, 50):,.0f}", f"{np.percentile(values, 90):,.0f}"

    lines = [
        ("micro-batch, whole", "progress.triggerExecution", "progress durationMs.triggerExecution"),
        ("source planning (driver)", "progress.latestOffset", "durationMs.latestOffset"),
        ("query planning (driver)", "progress.queryPlanning", "durationMs.queryPlanning"),
        ("offset log write", "progress.walCommit", "durationMs.walCommit"),
        ("the micro-batch's work", "progress.addBatch", "durationMs.addBatch"),
        (
            "- model versions, local properties (foreachBatch)",
            "pipeline-batch.versions",
            "timing pipeline-batch",
        ),
        ("- the write: its planning, job and commit", "pipeline-batch.write", "timing pipeline-batch"),
        ("-- its Spark job", "jobs", "event log: job submitted to completed"),
        ("--- stage 1: read Kafka (Spark's connector), decode", "stage.source", "event log: stage wall"),
        (
            "---- records in (the connector's reads, to Python)",
            "decode-records.input",
            "timing decode-records, per task",
        ),
        ("---- decoding", "decode-records.decode", "timing decode-records, per task"),
        ("--- stage 2: card stage", "stage.card", "event log: stage wall"),
        ("---- rows in (from the JVM)", "card-stage.input", "timing card-stage, per task"),
        ("---- state read and decode", "card-stage.state-get", "timing card-stage, per task"),
        ("---- card features (the core)", "card-stage.core", "timing card-stage, per task"),
        ("---- state encode and write", "card-stage.state-put", "timing card-stage, per task"),
        ("---- rows out", "card-stage.output", "timing card-stage, per task"),
        ("--- stage 3: terminal stage, scoring, sink", "stage.final", "event log: stage wall"),
        ("---- state read and decode", "terminal-stage.state-get", "timing terminal-stage, per task"),
        ("---- terminal features (the core)", "terminal-stage.core", "timing terminal-stage, per task"),
        ("---- state encode and write", "terminal-stage.state-put", "timing terminal-stage, per task"),
        ("---- records and scoring", "terminal-stage.records", "timing terminal-stage, per task"),
        ("----- of which scoring", "scoring.score", "timing scoring, per task"),
        ("---- sink: wait for the stage's rows", "sink-write.input", "timing sink-write, per task"),
        ("---- sink: marker read, transaction begin", "sink-write.begin", "timing sink-write, per task"),
        ("---- sink: produce", "sink-write.produce", "timing sink-write, per task"),
        ("---- sink: commit", "sink-write.commit", "timing sink-write, per task"),
        ("---- Redis: alerts and scores", "after-commit.ScoresToRedis", "timing after-commit, per task"),
        (
            "---- Redis: latest features",
            "after-commit.LatestFeaturesToRedis",
            "timing after-commit, per task",
        ),
        ("--- state store commits (both operators)", "state-commit", "progress stateOperators commitTimeMs"),
        ("--- JVM GC, stage 3", "gc.final", "event log: task JVM GC time, per task"),
        ("commit log write", "progress.commitOffsets", "durationMs.commitOffsets"),
    ]
    medians = {name: float(np.percentile(values, 50)) for name, values in figures.items() if values}
    return [[label, *cell(name), source] for label, name, source in lines], count, medians


@dataclass(kw_only=True)
class Run:
    """One size of the sweep: its settings, figures and phase table."""

    customers: int
    backlog_days: int
    transactions: int
    batches: int
    rows: list[list[str]]
    medians: dict[str, float]
    latency: Latency
    first_output_s: float
    backlog_rate: float
    peak_memory_bytes: int
    #: The broker's peak memory (PSS) and the cores it used from the pipeline's launch to its stop.
    broker_peak_bytes: int
    broker_cores: float
    load: str
    paced_s: float

    def ms(self, *names: str) -> str:
        """The medians of phases, by their names, as ``a / b / c`` ms."""
        return " / ".join(f"{self.medians.get(name, 0.0):,.0f}" for name in names)


def run(args: argparse.Namespace, customers: int, backlog_days: int) -> Run:
    """Simulate, produce the backlog, run the pipeline through it, pace the load, take the micro-batches
    apart."""
    terminals = args.terminals_per_customer * customers
    paced_tx = args.rate * (max(args.paced_s, args.max_paced_s) + args.warmup_s)
    days = backlog_days + math.ceil(paced_tx / (customers * TX_PER_CUSTOMER_DAY)) + 1
    frame = simulate(SimulatorConfig(customers=customers, terminals=terminals, days=days, seed=args.seed))
    cut = frame[TxColumns.EVENT_TIME].min().normalize() + pd.Timedelta(days=backlog_days)
    first = frame[frame[TxColumns.EVENT_TIME] < cut]
    # Each event at its own time: the backlog's labels known after its end belong to the later load.
    backlog, later_events = events_of(frame).split_at(int(cut.timestamp() * 1000))
    later_ids = [orjson.loads(value)[TxColumns.TX_ID] for value in later_events.tx_values]
    del frame

    logs = LOGS / f"{customers}-cards"
    logs.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp, temporary_stack(Path(tmp)) as info:
        home = Path(tmp)
        clients = Clients.for_stack(info, home, partitions=args.partitions)
        topics = clients.settings.topics
        ensure_topics(clients.admin(), topics.all(), args.partitions, 1)
        project_jobs.train_champion(first, info, FeatureParams())
        del first
        produced = produce_events(clients.producer(), topics, backlog)
        print(
            f"{customers:,} cards: backlog of {produced.transactions:,} transactions, {produced.labels:,} labels"
        )

        events = home / "events"
        events.mkdir()
        conf = home / "spark-conf"
        conf.mkdir()
        (conf / "spark-defaults.conf").write_text(
            f"spark.eventLog.enabled true\nspark.eventLog.compress false\nspark.eventLog.dir file://{events}\n"
        )
        env = {
            **os.environ,
            "SPARK_CONF_DIR": str(conf),
            "FRAUD_HOME": str(home),
            "FRAUD_BOOTSTRAP_SERVERS": info.bootstrap_servers,
            "FRAUD_REDIS_URL": info.redis_url,
            "FRAUD_MLFLOW_TRACKING_URI": info.mlflow_tracking_uri,
            "FRAUD_PARTITIONS": str(args.partitions),
            "FRAUD_LOG_LEVEL": "debug",
        }
        command = [
            str(FRAUD),
            "pipeline",
            "run",
            "--trigger-interval-s",
            str(args.trigger_interval_s),
            "--max-records",
            str(args.max_records),
        ]
        reader = OutputReader(clients, topics.features, set()).start()
        log_path = logs / "pipeline.log"
        with log_path.open("wb") as log:
            process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=home)
            launched = time.monotonic()
            sampler = TreeSampler(process.pid).start()
            broker = TreeSampler(info.broker.pid).start()
            broker.sample()
            broker_cpu_at_launch = broker.cpu_s()
            try:
                wait_for(
                    lambda: reader.count >= produced.transactions, 3600, "backlog output", process, PIPELINE
                )
                first_output_s = min(reader.first_seen.values()) - launched
                backlog_s = max(reader.first_seen.values()) - launched
                backlog_rate = produced.transactions / max(1e-9, backlog_s - first_output_s)
                print(
                    f"first output {first_output_s:.1f} s after launch; backlog through at {backlog_s:.1f} s "
                    f"({backlog_rate:,.0f} tx/s)"
                )
                paced_s = max(
                    args.paced_s, min(args.max_paced_s, BATCHES_MEASURED * args.max_records / backlog_rate)
                )
                if paced_s > args.paced_s:
                    print(
                        f"measuring {paced_s:.0f} s of the paced load: {BATCHES_MEASURED} of the backlog's micro-batches"
                    )
                n = int(args.rate * (args.warmup_s + paced_s))
                warm = int(args.rate * args.warmup_s)
                wanted = reader.count + n
                started_wall = time.time()
                sent = pace(
                    clients.producer(),
                    topics.transactions,
                    later_events.tx_keys[:n],
                    later_events.tx_values[:n],
                    later_events.tx_times[:n],
                    args.rate,
                )
                measured_from = started_wall + float(sent[warm] - sent[0])
                measured_to = started_wall + float(sent[-1] - sent[0])
                wait_for(lambda: reader.count >= wanted, 120, "paced output", process, PIPELINE)
            except SystemExit as stopped:
                raise SystemExit(
                    f"{stopped}; its output: {log_path}, Spark's log: {logs / 'spark.log'}"
                ) from None
            finally:
                process.send_signal(signal.SIGINT)
                try:
                    process.wait(60)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
                broker.sample()
                broker_cores = (broker.cpu_s() - broker_cpu_at_launch) / (time.monotonic() - launched)
                sampler.stop()
                broker.stop()
                reader.stop()
                with contextlib.suppress(FileNotFoundError):
                    shutil.copy(home / "logs" / "spark.log", logs / "spark.log")
        seen = reader.first_seen
        latencies = np.array([seen[tx] for tx in later_ids[warm:n]]) - sent[warm:]
        latency = Latency.of(sent[warm:], latencies)
        print(f"paced {args.rate:,.0f}/s: p50/p95/p99 {latency.cell()}, max {latency.max:.2f} s")
        (written,) = events.iterdir()  # Spark 4's event log: a directory of rolled files
        shutil.rmtree(logs / "events", ignore_errors=True)
        shutil.copytree(written, logs / "events")
    rows, batches, medians = breakdown(
        read_event_log(logs / "events"), list(timing_lines(log_path)), measured_from, measured_to
    )
    if not batches:
        raise SystemExit(
            f"{customers:,} cards: no micro-batch started in the {paced_s:.0f} s measured (each took longer): "
            "give a longer --paced-s (or --max-paced-s)"
        )
    return Run(
        customers=customers,
        backlog_days=backlog_days,
        transactions=produced.transactions,
        batches=batches,
        rows=rows,
        medians=medians,
        latency=latency,
        first_output_s=first_output_s,
        backlog_rate=backlog_rate,
        peak_memory_bytes=sampler.peak_memory_bytes,
        broker_peak_bytes=broker.peak_memory_bytes,
        broker_cores=broker_cores,
        load=f"{load_before[0]:.1f} before, {os.getloadavg()[0]:.1f} after",
        paced_s=paced_s,
    )


def sizes(text: str) -> list[tuple[int, int]]:
    """``CARDS:DAYS,...`` as (cards, days of history) pairs."""
    try:
        return [(int(cards), int(days)) for cards, days in (size.split(":") for size in text.split(","))]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected CARDS:DAYS[,CARDS:DAYS...]") from None


def summary(runs: list[Run], rate: float) -> report.Table:
    """The sweep: how each figure grows with the cards held."""
    base = runs[0].medians["progress.triggerExecution"]
    rows = []
    for r in runs:
        batch = r.medians["progress.triggerExecution"]
        rows.append(
            [
                f"{r.customers:,} ({r.backlog_days} days)",
                f"{r.transactions / 1e6:.2f} M",
                f"{batch:,.0f} ms ({batch / base:.2f}x)",
                r.ms("card-stage.state-get", "card-stage.core", "card-stage.state-put"),
                r.ms("terminal-stage.state-get", "terminal-stage.core", "terminal-stage.state-put"),
                f"{r.latency.p50:.2f} / {r.latency.p99:.2f} s",
                f"{r.backlog_rate:,.0f} tx/s",
                f"{r.peak_memory_bytes / 2**30:.2f} GiB",
                f"{r.broker_peak_bytes / 2**30:.2f} GiB / {r.broker_cores:.2f}",
            ]
        )
    return report.Table(
        [
            "cards (days of history)",
            "transactions in state",
            f"micro-batch median at {rate:,.0f} tx/s (to the first size)",
            "card stage: state read / core / state write, ms per task",
            "terminal stage: read / core / write",
            "event -> feature record p50 / p99",
            "backlog rate",
            "peak memory (PSS)",
            "broker: peak memory (PSS) / cores",
        ],
        rows,
        caption="The cards sweep: one `fraud pipeline run` per size, each on a stack of its own, one after the other",
        notes=[
            "The backlog rate is the backlog's transactions over the time from the first feature record to the "
            "last one of the backlog. Memory: the command's process tree (driver JVM, Python workers). The broker's "
            "peak memory, and the cores it used from the pipeline's launch to its stop, beside it.",
            "In the phase tables below, phases nest (a leading dash per level). Stages run their 2 tasks side "
            "by side: a stage's wall time is the event log's; the phases under it are the project's timing "
            "lines (`infra.spark.timing`) summed over a task's calls, averaged over its tasks. The sink's wait for "
            "the stage's rows is the terminal stage's work seen from the writer, which runs in the same task.",
        ],
    )


def phases(r: Run, args: argparse.Namespace) -> report.Table:
    """One size's micro-batch, phase by phase."""
    return report.Table(
        ["phase", "median ms", "p90 ms", "measured by"],
        r.rows,
        caption=(
            f"{r.customers:,} cards: the {r.batches} micro-batches that started in the {r.paced_s:.0f} s "
            f"measured at {args.rate:,.0f} tx/s (after {args.warmup_s:.0f} s of warm-up), on a state of "
            f"{r.transactions:,} transactions"
        ),
        notes=[
            f"Produce -> feature record readable (read_committed), p50 / p95 / p99: {r.latency.cell()}, max "
            f"{r.latency.max * 1000:,.0f} ms. First output {r.first_output_s:.1f} s after launch. Load average "
            f"(1 min): {r.load}.",
        ],
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--sizes",
        type=sizes,
        default=sizes(DEFAULT_SIZES),
        help=f"cards and days of history of each run, CARDS:DAYS,... (default {DEFAULT_SIZES})",
    )
    parser.add_argument("--terminals-per-customer", type=int, default=2)
    parser.add_argument("--rate", type=float, default=2000.0, help="paced load, transactions/s")
    parser.add_argument(
        "--paced-s",
        type=float,
        default=15.0,
        help=f"measured seconds of the paced load, or {BATCHES_MEASURED} of the backlog's micro-batches if longer",
    )
    parser.add_argument(
        "--max-paced-s",
        type=float,
        default=120.0,
        help="the longest the measured part is made for slow micro-batches",
    )
    parser.add_argument("--warmup-s", type=float, default=10.0, help="paced seconds before it, not measured")
    parser.add_argument("--partitions", type=int, default=4, help="of every topic")
    parser.add_argument("--max-records", type=int, default=DEFAULT_MAX_RECORDS)
    parser.add_argument("--trigger-interval-s", type=float, default=0.2)
    parser.add_argument("--seed", type=int, default=0)
    report.add_flag(parser)
    args = parser.parse_args()
    print(f"settings: {report.args_settings(args)}; {report.EMBEDDED_STACK}")
    runs = [run(args, customers, days) for customers, days in args.sizes]
    tables = [summary(runs, args.rate), *(phases(r, args) for r in runs)]
    for table in tables:
        print(report.markdown_table(table))
    report.write_unless_skipped(
        args,
        "microbatch",
        script=__file__,
        tables=tables,
        settings={
            **report.args_settings(args),
            "stack": report.EMBEDDED_STACK,
        },
        title="The cards sweep, and one micro-batch phase by phase",
    )


if __name__ == "__main__":
    main()
