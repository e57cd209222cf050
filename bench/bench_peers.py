"""The project beside its peers, in one run, on one generated input, each system on an embedded stack of its
own.

Systems, one after another, each as a subprocess measured from outside:

- a bare confluent-kafka loop with its state in a dict, no fault tolerance (``peers/bare_loop.py``);
- Bytewax 0.21, one worker, in-memory state, no recovery store (``peers/bytewax_flow.py``);
- Quix Streams 3, RocksDB state with its changelog topic, at-least-once, and again in its exactly-once mode
  (Kafka transactions, a commit every ``QUIX_EOS_COMMIT_S``) for a like-for-like guarantee (``peers/quix_app.py``);
- the project's feature job, ``fraud features run`` (all features, exactly-once Kafka transactions, the
  latest features per card in Redis), and the project's ``fraud pipeline run`` (features and scoring in one
  Spark query, exactly-once Kafka transactions, Redis), configured as bench/bench_scoring.py configures
  them (``peers/pipeline.py``).

The peers compute the project's card features (count and mean amount per card over 1, 7 and 30 days of
event time ending at the transaction, ``peers/card_windows.py``) and write one JSON record per transaction
to an output topic of their own: the feature job is the like-for-like comparison (it computes the terminal
and time features too). The pipeline also scores each transaction and writes scores and alerts (the bench
reads its feature records, committed in the same Kafka transactions as the scores).

1. Sets up a virtualenv each for Bytewax and Quix Streams (build/bench-venvs/<peer>, pinned versions,
   reused while the pins are the same): Quix Streams pins an older confluent-kafka than the project's, and
   neither belongs in the project's environment.
2. Simulates a fixed-seed input (``ingest.simulator``); the first ``--backlog-days`` are the backlog, the
   rest feed the paced loads.
3. For each system: starts an embedded stack of its own (a fresh broker each); for the pipeline, trains the
   project's champion on the backlog (batch path) as bench_scoring does; creates the topics, produces the backlog
   to them as ``fraud ingest`` does (``ingest.produce``: transactions and labels), starts the system and
   reads its output topic from the beginning. Unpaced: the steady rate is the outputs after the first
   second of output over the time from then to the last output (start-up, and a first micro-batch written
   at once, left out); the whole backlog from launch is reported too. Paced: then, at each of ``--rates``
   transactions/s, ``--warmup-s`` then ``--paced-s`` of new transactions (reported: the latter), and the
   latency from handing a transaction to the producer to its output being readable (read_committed),
   p50/p95/p99. A rate is sustained when every output arrived within ``--drain-s`` after the load and
   latency grew by at most 0.1 s per second of the load (least-squares slope: the system kept at least
   90 % of the pace); the higher rates are skipped after one that is not. Peak memory (PSS) and CPU of the
   system's process tree (the broker not counted), and the broker's peak memory and cores beside it.
4. Checks, for ``--check-cards`` cards drawn with the seed, that each system's 1/7/30-day counts and means
   equal the project's batch path (``features.batch``) on every one of their transactions; a system that
   differs is reported as not comparable, loudly. Differences on transactions the project marked late
   (behind its source's event-time frontier) are reported apart.
5. Writes the ``peers`` section of docs/benchmarks.md (unless ``--no-report``): one row per system,
   the ratios of each of the project's two jobs to each peer, and the settings.

Run: .venv/bin/python bench/bench_peers.py [--backlog-days 31] [--rates 2000,5000,10000] [--paced-s 10] [--no-report]
Quick: .venv/bin/python bench/bench_peers.py --customers 1000 --backlog-days 20 --rates 1000,2000 --paced-s 5 --no-report
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import orjson
import pandas as pd
import project_jobs
import report
from measure import Latency, OutputReader, TreeSampler, pace, steady_rate, stop_tree
from project_jobs import MAX_EVENT_BYTES, TX_PER_CUSTOMER_DAY, events_of

from contracts.events import TxColumns
from contracts.settings import Topics
from features.batch import transactions_features
from features.definitions import FeatureParams, card_avg_amount_column, card_nb_tx_column
from features.job import FeatureJobConfig
from fraud.options import DEFAULT_MAX_RECORDS
from infra.clients import Clients
from infra.embedded.stack import StackInfo, temporary_stack
from infra.kafka.admin import ensure_topics
from ingest.produce import EventBatch, produce_events
from ingest.simulator import SimulatorConfig, simulate

ROOT = Path(__file__).resolve().parent.parent
PEERS = ROOT / "bench" / "peers"
VENVS = ROOT / "build" / "bench-venvs"
LOGS = ROOT / "build" / "bench-peers"
WINDOW_DAYS = (1, 7, 30)
COUNTS = tuple(card_nb_tx_column(days) for days in WINDOW_DAYS)
MEANS = tuple(card_avg_amount_column(days) for days in WINDOW_DAYS)

#: Peers whose pins conflict with the project's (Quix Streams pins an older confluent-kafka), or that the
#: project's environment has no reason to hold (Bytewax): a virtualenv each, with these exact versions.
VENV_REQUIREMENTS = {
    "bytewax": ("bytewax==0.21.1", "confluent-kafka==2.16.1", "orjson==3.13.0"),
    "quixstreams": ("quixstreams==3.28.1", "confluent-kafka==2.12.2", "orjson==3.13.0"),
}


#: Quix Streams' commit interval in its exactly-once mode: each commit ends a Kafka transaction, so it bounds
#: the latency (outputs are read read_committed); half a second, as the project's trigger is a fraction of one.
QUIX_EOS_COMMIT_S = 0.5


@dataclass(frozen=True)
class System:
    key: str
    #: As the table names it; ``{version}`` is the version of the first of ``packages``.
    name: str
    #: State and delivery guarantee, as the table says them.
    how: str
    script: str
    venv: str | None = None
    #: Packages whose versions the report gives.
    packages: tuple[str, ...] = ("confluent-kafka", "orjson")
    #: Options of its script beyond the ones every peer gets.
    options: tuple[str, ...] = ()

    @property
    def is_project(self) -> bool:
        return self.script == "pipeline.py"


SYSTEMS = (
    System(
        "bare",
        "bare confluent-kafka loop",
        "dict state, no fault tolerance",
        "bare_loop.py",
    ),
    System(
        "bytewax",
        "Bytewax {version} (1 worker)",
        "in-memory state, no recovery store; at-least-once sink",
        "bytewax_flow.py",
        "bytewax",
        ("bytewax", "confluent-kafka", "orjson"),
    ),
    System(
        "quix",
        "Quix Streams {version}",
        "RocksDB state + changelog topic; at-least-once, commits every 5 s",
        "quix_app.py",
        "quixstreams",
        ("quixstreams", "confluent-kafka", "rocksdict", "orjson"),
    ),
    System(
        "quix-eos",
        "Quix Streams {version}, exactly-once",
        f"RocksDB state + changelog topic; exactly-once (Kafka transactions), commits every {QUIX_EOS_COMMIT_S} s",
        "quix_app.py",
        "quixstreams",
        ("quixstreams", "confluent-kafka", "rocksdict", "orjson"),
        ("--exactly-once", "--commit-interval-s", str(QUIX_EOS_COMMIT_S)),
    ),
    System(
        "features",
        "`fraud features run` (the project's feature job)",
        "all features, Redis; RocksDB state; exactly-once (Kafka transactions)",
        "pipeline.py",
        packages=("pyspark", "confluent-kafka"),
    ),
    System(
        "pipeline",
        "`fraud pipeline run` (the project)",
        "all features + scoring, Redis; RocksDB state; exactly-once (Kafka transactions)",
        "pipeline.py",
        packages=("pyspark", "confluent-kafka", "scikit-learn"),
    ),
)


# --- Virtualenvs of the peers -------------------------------------------------------------------------


def venv_python(name: str) -> Path:
    """The Python of peer virtualenv ``name``, created with its pinned requirements if it is missing or
    was made with other pins."""
    venv = VENVS / name
    python = venv / "bin" / "python"
    marker = venv / "bench-requirements.txt"
    wanted = "\n".join(VENV_REQUIREMENTS[name]) + "\n"
    if python.exists() and marker.exists() and marker.read_text() == wanted:
        print(f"{name}: using {venv.relative_to(ROOT)}")
        return python
    print(
        f"{name}: creating {venv.relative_to(ROOT)} with {' '.join(VENV_REQUIREMENTS[name])} "
        "(once: later runs reuse it)",
        flush=True,
    )
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
    subprocess.run(
        [str(python), "-m", "pip", "install", "--disable-pip-version-check", *VENV_REQUIREMENTS[name]],
        check=True,
    )
    marker.write_text(wanted)
    print(f"{name}: ready", flush=True)
    return python


def versions(python: Path, packages: tuple[str, ...]) -> dict[str, str]:
    """Installed versions of ``packages`` in the environment of ``python``."""
    code = "import json, sys\nfrom importlib.metadata import version\nprint(json.dumps({p: version(p) for p in sys.argv[1:]}))"
    found = subprocess.run([str(python), "-c", code, *packages], capture_output=True, text=True, check=True)
    return dict(json.loads(found.stdout))


# --- One system's run ---------------------------------------------------------------------------------


@dataclass
class Paced:
    rate: float
    sent: int
    #: The rate the producer achieved over the measured part.
    achieved: float
    latency: Latency | None
    missing: int
    sustained: bool


@dataclass
class Result:
    system: System
    label: str
    backlog: int = 0
    first_output_s: float | None = None
    steady: float | None = None
    steady_counted: int = 0
    whole: float | None = None
    cpu_per_100k: float | None = None
    paced: list[Paced] = field(default_factory=list)
    peak_memory_mib: float = 0.0
    #: The broker's peak memory (PSS) and the cores it used over the system's run (launch to stop).
    broker_peak_mib: float = 0.0
    broker_cores: float = 0.0
    duplicates: int = 0
    #: Outputs marked late (the project's: behind the source's event-time frontier, see features.stages).
    late: int = 0
    checked: int = 0
    mismatches: list[str] = field(default_factory=list)
    #: Mismatches of transactions the system itself marked late (a documented difference, reported apart).
    late_mismatches: list[str] = field(default_factory=list)
    failure: str | None = None

    @property
    def comparable(self) -> bool:
        return self.failure is None and not self.mismatches and self.checked > 0

    def at(self, rate: float) -> Paced | None:
        return next((p for p in self.paced if p.rate == rate), None)


@dataclass(frozen=True)
class Run:
    """What every system gets alike."""

    clients: Clients
    home: Path
    stack_file: Path
    backlog: EventBatch
    later: EventBatch
    later_ids: list[int]
    reference: dict[int, dict[str, float]]
    pythons: dict[str, Path]
    args: argparse.Namespace


def command(system: System, run: Run, topics: Topics) -> list[str]:
    script = str(PEERS / system.script)
    python = str(run.pythons.get(system.venv or "", sys.executable))
    if system.is_project:
        return [
            python,
            script,
            "--stack",
            str(run.stack_file),
            "--home",
            str(run.home),
            "--prefix",
            f"{system.key}-",
            "--job",
            system.key,
            "--max-records",
            str(run.args.max_records),
            "--card-buckets",
            str(run.args.card_buckets),
            "--terminal-buckets",
            str(run.args.terminal_buckets),
            "--trigger-interval-s",
            str(run.args.trigger_interval_s),
        ]
    peer = [
        python,
        script,
        "--bootstrap",
        run.clients.endpoints.bootstrap_servers,
        "--input",
        topics.transactions,
        "--output",
        topics.features,
    ]
    if system.script == "quix_app.py":
        peer += ["--state-dir", str(run.home / f"{system.key}-state")]
    return [*peer, *system.options]


def wait_outputs(
    reader: OutputReader,
    wanted: int,
    process: subprocess.Popen[bytes],
    label: str,
    stall_s: float,
    first_stall_s: float,
    on_settled: Callable[[], None] = lambda: None,
) -> str | None:
    """Wait until ``reader`` has ``wanted`` outputs; the reason when it will not (the system exited, or
    gave no new output for ``stall_s``, or none at all for ``first_stall_s``). ``on_settled`` is called
    once, a second after the first new output (where the steady rate starts: ``measure.steady_rate``)."""
    start_count = last_count = reader.count
    last_change = time.monotonic()
    next_print = last_change + 10
    settle_at: float | None = None
    while reader.count < wanted:
        now = time.monotonic()
        if reader.error is not None:
            return f"output reader failed: {reader.error}"
        if process.poll() is not None:
            return f"exited with code {process.returncode}"
        if settle_at is not None and now >= settle_at:
            on_settled()
            settle_at = math.inf
        if reader.count != last_count:
            if last_count == start_count:
                settle_at = now + 1.0
            last_count, last_change = reader.count, now
        limit = first_stall_s if last_count == start_count else stall_s
        if now - last_change > limit:
            return f"no new output for {limit:.0f} s ({reader.count - start_count:,} of {wanted - start_count:,})"
        if now >= next_print:
            print(f"  {label}: {reader.count - start_count:,} of {wanted - start_count:,} outputs")
            next_print = now + 10
        time.sleep(0.02)
    return None


def run_system(system: System, label: str, run: Run) -> Result:
    args, clients = run.args, run.clients
    started = time.monotonic()
    result = Result(system, label)
    admin = clients.admin()
    topics = Topics().with_prefix(f"{system.key}-")
    ensure_topics(admin, topics.all(), args.partitions, 1)
    produced = produce_events(clients.producer(), topics, run.backlog)
    result.backlog = produced.transactions
    print(
        f"\n== {label}: backlog of {produced.transactions:,} transactions, {produced.labels:,} labels produced"
    )
    reader = OutputReader(clients, topics.features, set(run.reference)).start()
    LOGS.mkdir(parents=True, exist_ok=True)
    log_path = LOGS / f"{system.key}.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            command(system, run, topics),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=ROOT,
        )
        launched = time.monotonic()
        sampler = TreeSampler(process.pid).start()
        broker = TreeSampler(StackInfo.from_json(run.stack_file.read_text()).broker.pid).start()
        broker.sample()
        broker_cpu_at_launch = broker.cpu_s()
        try:
            measure_system(result, run, topics, reader, process, sampler, launched)
        finally:
            broker.sample()
            result.broker_cores = (broker.cpu_s() - broker_cpu_at_launch) / (time.monotonic() - launched)
            stopping = time.monotonic()
            stop_tree(process)
            sampler.stop()
            broker.stop()
            reader.stop()
            print(f"  stopped in {time.monotonic() - stopping:.1f} s")
    result.peak_memory_mib = sampler.peak_memory_bytes / 2**20
    result.broker_peak_mib = broker.peak_memory_bytes / 2**20
    print(
        f"  broker: peak {result.broker_peak_mib:,.0f} MiB (PSS), {result.broker_cores:.2f} cores over the run"
    )
    result.duplicates = reader.duplicates
    result.late = reader.late_count
    if result.failure is not None:
        tail = log_path.read_text(errors="replace").splitlines()[-15:]
        print(f"  {label} FAILED: {result.failure}; the end of {log_path.relative_to(ROOT)}:")
        print("\n".join(f"    {line}" for line in tail))
    check_features(result, reader, run.reference)
    print(f"  {label}: {time.monotonic() - started:.0f} s in all")
    return result


def measure_system(
    result: Result,
    run: Run,
    topics: Topics,
    reader: OutputReader,
    process: subprocess.Popen[bytes],
    sampler: TreeSampler,
    launched: float,
) -> None:
    args, label = run.args, result.label
    settled: list[tuple[float, int]] = []

    def settle() -> None:
        sampler.sample()
        settled.append((sampler.cpu_s(), reader.count))

    result.failure = wait_outputs(
        reader, result.backlog, process, label, args.stall_s, args.start_timeout_s, on_settled=settle
    )
    if result.failure is not None:
        return
    arrivals = np.fromiter(reader.first_seen.values(), dtype=float, count=reader.count)
    sampler.sample()
    if not settled:  # the whole backlog came out within a second
        settled.append((0.0, 0))
    cpu_settled, outputs_settled = settled[0]
    if outputs_settled < result.backlog:
        result.cpu_per_100k = (sampler.cpu_s() - cpu_settled) / (result.backlog - outputs_settled) * 100_000
    result.first_output_s = float(arrivals.min() - launched)
    result.steady, result.steady_counted = steady_rate(arrivals)
    result.whole = result.backlog / float(arrivals.max() - launched)
    steady = (
        f"steady {result.steady:,.0f} tx/s ({result.steady_counted:,} outputs after the first second of output)"
        if result.steady
        else "no steady rate (the backlog came out within a second: make it bigger)"
    )
    print(
        f"  unpaced: first output {result.first_output_s:.1f} s after launch; {steady}; whole backlog from "
        f"launch {result.whole:,.0f} tx/s"
    )

    producer = run.clients.producer()
    offset = 0
    later = run.later
    for rate in args.rate_list:
        n = int(rate * (args.warmup_s + args.paced_s))
        warm = int(rate * args.warmup_s)
        keys = later.tx_keys[offset : offset + n]
        values = later.tx_values[offset : offset + n]
        stamps = later.tx_times[offset : offset + n]
        ids = run.later_ids[offset : offset + n]
        offset += n
        if len(values) < n:
            print(f"  paced {rate:,.0f}/s: only {len(values):,} transactions left (simulate more days)")
            if len(values) < warm + 2:
                return
        wanted = reader.count + len(values)
        sent = pace(producer, topics.transactions, keys, values, stamps, rate)
        deadline = float(sent[-1]) + args.drain_s
        while reader.count < wanted and time.monotonic() < deadline and process.poll() is None:
            time.sleep(0.05)
        measured_ids, measured_sent = ids[warm:], sent[warm:]
        seen = reader.first_seen
        out = np.array([tx in seen for tx in measured_ids], dtype=bool)
        latencies = np.array([seen[tx] for tx in measured_ids if tx in seen]) - measured_sent[out]
        missing = len(measured_ids) - len(latencies)
        achieved = (len(measured_sent) - 1) / float(measured_sent[-1] - measured_sent[0])
        latency = Latency.of(measured_sent[out], latencies) if len(latencies) else None
        sustained = missing == 0 and latency is not None and latency.kept_up
        result.paced.append(Paced(rate, len(measured_ids), achieved, latency, missing, sustained))
        figures = (
            "no output"
            if latency is None
            else f"p50/p95/p99 {latency.cell()}, max {latency.max:.2f} s, growing {latency.growth:+.3f} s/s"
        )
        print(
            f"  paced {rate:,.0f}/s (achieved {achieved:,.0f}/s) for {args.paced_s:.0f} s after {args.warmup_s:.0f} s: "
            f"{figures}; {missing:,} outputs missing after {args.drain_s:.0f} s"
            + ("" if sustained else " -> NOT SUSTAINED, higher rates skipped")
        )
        if process.poll() is not None:
            result.failure = f"exited with code {process.returncode} during the paced loads"
            return
        if not sustained:
            return


def check_features(result: Result, reader: OutputReader, reference: dict[int, dict[str, float]]) -> None:
    """Compare the system's 1/7/30-day counts and means with the batch path's, for the checked cards."""
    for tx, features in reader.features.items():
        expected = reference[tx]
        result.checked += 1
        wrong = [
            f"{name} {features.get(name)!r} != {expected[name]!r}"
            for name in (*COUNTS, *MEANS)
            if not (
                features.get(name) == expected[name]
                or (
                    name in MEANS
                    and isinstance(features.get(name), float)
                    and math.isclose(features[name], expected[name], rel_tol=1e-9)
                )
            )
        ]
        if wrong and tx in reader.late:
            result.late_mismatches.append(f"tx {tx} (marked late): {', '.join(wrong)}")
        elif wrong:
            result.mismatches.append(f"tx {tx}: {', '.join(wrong)}")
    if result.late:
        print(f"  {result.late:,} outputs marked late")
    if result.late_mismatches:
        print(
            f"  !!! {result.label}: {len(result.late_mismatches):,} transactions it marked late differ from the "
            "batch path (history it no longer held). First ones:"
        )
        for line in result.late_mismatches[:5]:
            print(f"  !!!   {line}")
    if result.mismatches:
        print(
            f"  !!! {result.label}: FEATURES DIFFER from the batch path on {len(result.mismatches):,} of "
            f"{result.checked:,} checked transactions: NOT COMPARABLE. First ones:"
        )
        for line in result.mismatches[:5]:
            print(f"  !!!   {line}")
    elif result.checked:
        print(f"  features check: {result.checked:,} transactions of the checked cards equal the batch path")
    else:
        print(f"  !!! {result.label}: no output of the checked cards was read: features NOT CHECKED")


# --- The report ---------------------------------------------------------------------------------------


def latency_cell(result: Result, rate: float) -> str:
    paced = result.at(rate)
    if paced is None:
        return "not run" if result.failure else "skipped"
    if paced.latency is None:
        return "no output"
    cell = paced.latency.cell()
    if not paced.sustained:
        cell = f"not sustained ({cell}, {paced.missing:,} missing)"
    elif paced.achieved < 0.97 * rate:
        cell += f" (sent at {paced.achieved:,.0f}/s)"
    return cell


def table_rows(results: list[Result], rates: list[float]) -> list[list[str]]:
    rows = []
    for r in results:
        if r.failure is not None and r.steady is None:
            rows.append(
                [r.label, r.system.how, f"failed: {r.failure}", "", "", "", "", "", *("" for _ in rates), ""]
            )
            continue
        check = (
            f"equal on {r.checked - len(r.late_mismatches):,} tx"
            if r.comparable
            else f"DIFFERS on {len(r.mismatches):,} of {r.checked:,} tx"
            if r.mismatches
            else "not checked"
        )
        if r.late_mismatches:
            check += f"; {len(r.late_mismatches):,} marked late differ"
        if r.late:
            check += f" ({r.late:,} outputs marked late)"
        if r.duplicates:
            check += f" ({r.duplicates:,} duplicate outputs)"
        rows.append(
            [
                r.label,
                r.system.how,
                f"{r.steady:,.0f}" if r.steady else "- (backlog out within 1 s)",
                f"{r.whole:,.0f}" if r.whole else "",
                f"{r.first_output_s:.1f} s" if r.first_output_s is not None else "",
                f"{r.peak_memory_mib:,.0f}",
                f"{r.cpu_per_100k:.1f}" if r.cpu_per_100k is not None else "",
                f"{r.broker_peak_mib:,.0f} / {r.broker_cores:.2f}",
                *(latency_cell(r, rate) for rate in rates),
                check,
            ]
        )
    return rows


def ratio(project: float | None, peer: float | None) -> str:
    return f"{project / peer:.2f}x" if project and peer else "-"


def ratio_rows(results: list[Result], rates: list[float]) -> list[list[str]]:
    """One row per project system (the feature job, the pipeline) and peer."""
    rows = []
    for project in results:
        if not project.system.is_project or not project.comparable:
            continue
        for peer in results:
            if peer.system.is_project:
                continue
            name = f"{project.system.key} / {peer.label}"
            if not peer.comparable:
                rows.append([name, "not comparable", *("" for _ in rates), ""])
                continue
            cells = []
            for rate in rates:
                ours, theirs = project.at(rate), peer.at(rate)
                if ours is None or theirs is None or ours.latency is None or theirs.latency is None:
                    cells.append("-")
                elif not (ours.sustained and theirs.sustained):
                    cells.append("not both sustained")
                else:
                    cells.append(
                        f"{ratio(ours.latency.p50, theirs.latency.p50)} / "
                        f"{ratio(ours.latency.p99, theirs.latency.p99)}"
                    )
            rows.append(
                [
                    name,
                    ratio(project.steady, peer.steady),
                    *cells,
                    ratio(project.peak_memory_mib, peer.peak_memory_mib),
                ]
            )
    return rows


# --- main ---------------------------------------------------------------------------------------------


def reference_features(frame: pd.DataFrame, cards: np.ndarray) -> dict[int, dict[str, float]]:
    """The batch path's card counts and means of every transaction of ``cards`` (a card's card features
    depend on its own transactions only), by tx id."""
    rows = frame[frame[TxColumns.CARD_ID].isin(cards)]
    features = transactions_features(rows, "bench", FeatureParams(), MAX_EVENT_BYTES).features
    columns = [TxColumns.TX_ID, *COUNTS, *MEANS]
    return {
        int(row[0]): {name: value for name, value in zip(columns[1:], row[1:], strict=True)}
        for row in features[columns].itertuples(index=False)
    }


def main() -> None:
    parser = report.world_parser(__doc__)
    parser.add_argument(
        "--backlog-days", type=int, default=31, help="31 days of 5,000 customers: about 300k transactions"
    )
    parser.add_argument("--rates", default="2000,5000,10000", help="paced loads, transactions/s")
    parser.add_argument("--paced-s", type=float, default=10.0, help="measured seconds of each paced load")
    parser.add_argument("--warmup-s", type=float, default=3.0, help="paced seconds before each, not measured")
    parser.add_argument("--drain-s", type=float, default=20.0, help="wait for a load's outputs at most this")
    parser.add_argument("--check-cards", type=int, default=200, help="cards whose features are checked")
    parser.add_argument("--systems", default=",".join(s.key for s in SYSTEMS), help="which to run, in order")
    parser.add_argument("--partitions", type=int, default=4, help="of every topic")
    parser.add_argument("--max-records", type=int, default=DEFAULT_MAX_RECORDS, help="pipeline micro-batch")
    parser.add_argument("--card-buckets", type=int, default=FeatureJobConfig.card_buckets)
    parser.add_argument("--terminal-buckets", type=int, default=FeatureJobConfig.terminal_buckets)
    parser.add_argument("--trigger-interval-s", type=float, default=0.2, help="of the pipeline")
    parser.add_argument("--start-timeout-s", type=float, default=180.0, help="to a system's first output")
    parser.add_argument("--stall-s", type=float, default=60.0, help="without new output: the system failed")
    parser.add_argument("--seed", type=int, default=0)
    report.add_flag(parser)
    args = parser.parse_args()
    args.rate_list = [float(r) for r in args.rates.split(",")]
    keys = args.systems.split(",")
    unknown = set(keys) - {s.key for s in SYSTEMS}
    if unknown:
        parser.error(f"unknown systems {sorted(unknown)}: choose from {[s.key for s in SYSTEMS]}")
    if set(keys) != {s.key for s in SYSTEMS} and not args.no_report:
        parser.error("the report needs every system: add --no-report to run some of them")
    systems = [s for key in keys for s in SYSTEMS if s.key == key]
    started = time.monotonic()
    print(f"settings: {report.args_settings(args)}; a stack each: {report.EMBEDDED_STACK}")

    pythons = {s.venv: venv_python(s.venv) for s in systems if s.venv is not None}
    found = {s.key: versions(pythons.get(s.venv or "", Path(sys.executable)), s.packages) for s in systems}
    labels = {s.key: s.name.format(version=found[s.key][s.packages[0]]) for s in systems}

    paced_tx = sum(rate * (args.paced_s + args.warmup_s) for rate in args.rate_list)
    days = args.backlog_days + math.ceil(paced_tx / (args.customers * TX_PER_CUSTOMER_DAY)) + 1
    frame = simulate(
        SimulatorConfig(customers=args.customers, terminals=args.terminals, days=days, seed=args.seed)
    )
    cut = frame[TxColumns.EVENT_TIME].min().normalize() + pd.Timedelta(days=args.backlog_days)
    first, later = frame[frame[TxColumns.EVENT_TIME] < cut], frame[frame[TxColumns.EVENT_TIME] >= cut]
    rng = np.random.default_rng(args.seed)
    cards = rng.choice(frame[TxColumns.CARD_ID].unique(), size=args.check_cards, replace=False)
    reference = reference_features(frame, cards)
    # Each event at its own time: the backlog's labels known after its end belong to the later load.
    backlog, later_events = events_of(frame).split_at(int(cut.timestamp() * 1000))
    later_ids = [orjson.loads(value)[TxColumns.TX_ID] for value in later_events.tx_values]
    print(
        f"input: {len(first):,} transactions in the backlog ({args.backlog_days} days), {len(later):,} after it "
        f"for the paced loads ({paced_tx:,.0f} needed); {len(reference):,} transactions of {args.check_cards} "
        f"cards checked"
    )

    results: list[Result] = []
    with tempfile.TemporaryDirectory() as tmp:
        for system in systems:
            # A stack each: every system meets a fresh broker, and its topics go with the stack.
            home = Path(tmp) / system.key
            home.mkdir()
            with temporary_stack(home) as info:
                clients = Clients.for_stack(info, home, partitions=args.partitions)
                stack_file = home / "stack.json"
                stack_file.write_text(info.to_json())
                if system.key == "pipeline":
                    trained = time.monotonic()
                    project_jobs.train_champion(first, info, FeatureParams())
                    print(f"champion trained and registered in {time.monotonic() - trained:.0f} s")
                run = Run(
                    clients, home, stack_file, backlog, later_events, later_ids, reference, pythons, args
                )
                results.append(run_system(system, labels[system.key], run))

    elapsed = time.monotonic() - started
    rates = args.rate_list
    rate_headers = [f"p50 / p95 / p99 at {rate:,.0f}/s" for rate in rates]
    main_table = report.Table(
        [
            "system",
            "state, guarantee",
            "steady tx/s",
            "backlog from launch, tx/s",
            "first output after launch",
            "peak memory MiB (PSS)",
            "CPU s per 100k tx",
            "broker: peak MiB (PSS) / cores",
            *rate_headers,
            "features check",
        ],
        table_rows(results, rates),
        caption=(
            f"Every system on the same {results[0].backlog if results else 0:,}-transaction backlog, then paced "
            f"loads of {args.paced_s:.0f} s (after {args.warmup_s:.0f} s of warm-up) at each rate"
        ),
        notes=[
            "Steady tx/s: the backlog's outputs after its first second of output, over the time from there to "
            "the last one (start-up, and a first micro-batch written at once, left out). From launch: the "
            "backlog over the time from launch to its last output. CPU: the process tree's core-seconds over "
            "the steady stretch, per 100k transactions. Latency: from handing a transaction to the producer "
            "to its output being readable (read_committed). A rate is not sustained when some output did not "
            "arrive within the drain time or latency grew by more than 0.1 s per second of the load (a backlog "
            "building up); the higher rates are then skipped. Peak memory: the process tree's proportional set size (PSS: pages shared by forked processes counted once), broker excluded; the broker's own peak PSS, and the cores it used from the system's launch to its stop, beside it."
        ],
    )
    ratios = report.Table(
        ["ratio", "steady throughput", *(f"p50 / p99 at {rate:,.0f}/s" for rate in rates), "peak memory"],
        ratio_rows(results, rates),
        caption="The project's jobs / each peer: above 1x, the project is faster (throughput), slower "
        "(latency) or bigger (memory)",
    )
    for table in (main_table, ratios):
        print()
        print(report.markdown_table(table))
    print(f"\nbench_peers took {elapsed / 60:.1f} min")
    if args.no_report:
        return
    settings = {
        **{k: v for k, v in report.args_settings(args).items() if k not in ("rate_list", "systems")},
        "backlog_transactions": results[0].backlog if results else 0,
        **{f"{s.key}_versions": " ".join(f"{p}=={v}" for p, v in found[s.key].items()) for s in systems},
        "stack": f"a stack per system: {report.EMBEDDED_STACK}",
        "duration_min": f"{elapsed / 60:.1f}",
    }
    default_size = args.customers == parser.get_default("customers")
    report.write_section(
        "peers" if default_size else f"peers-{args.customers}",
        script=__file__,
        tables=[main_table, ratios],
        settings=settings,
        title="Peers" if default_size else f"Peers at {args.customers:,} cards",
    )


if __name__ == "__main__":
    main()
