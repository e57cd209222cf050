"""A soak: ``fraud pipeline run`` at a steady paced load for an hour on the embedded stack, watched window
by window, to see whether it stays flat (latency and memory neither creep up nor leak).

1. Simulates a fixed-seed world (``ingest.simulator``: ``--customers`` cards, ``--terminals`` terminals) long
   enough for the whole run. Its first ``--backlog-days`` are the backlog (the state the pipeline starts
   with, and the champion's training data); the days after them feed the load. Cards churn: each customer's
   card is replaced by a fresh simulated one every ``--card-life-days`` days of event time, each customer on
   a day of its own, so that every simulated day some cards stop appearing and as many new ones start; the
   state's expiry must remove the old ones (a page leaves once its newest transaction is the card history,
   30 days, behind the newest event of its bucket).
2. Starts the embedded stack, registers the champion (``project_jobs.train_champion``), produces the
   backlog, starts ``fraud pipeline run`` (continuous, its metrics endpoint on: ``FRAUD_METRICS_PORT``) as a
   subprocess and waits until the backlog's feature records are readable.
3. Paces ``--rate`` transactions/s for ``--minutes``, with the labels that fall due among them (``fraud
   ingest``'s labels, a week of event time after their transactions), in Kafka-timestamp order. At 1,000 tx/s
   and 5,000 cards a simulated day passes every 10 s or so: an hour is about a year of event time. Each
   ``--window-minutes`` window gives one row, printed once its transactions' feature records are in:

   - transactions sent and feature records read per second;
   - the latency from handing a transaction to the producer to its feature record being readable
     (read_committed), p50 and p99 over the window's transactions, each waited for up to ``DRAIN_S`` after
     the window;
   - the pipeline's process tree (the command, Spark's JVM, its Python workers): its memory (PSS, mean and
     peak of a sample a second) over the window, and at the window's end the RSS of every one of its
     processes, by kind; the RSS of the broker and of Valkey;
   - the CPU cores used over the window by the pipeline, the broker, Valkey and the bench itself (the load
     generator and the output reader), all on the same host;
   - scraped from the pipeline's metrics endpoint at the window's end: state rows and bytes per stateful
     operator (``fraud_state_rows``, ``fraud_state_bytes``) and how many records its last micro-batch left
     behind the logs' ends (``fraud_lag_records``, summed over the partitions).

4. The verdict, printed: flat when the last window's p99 and the pipeline's RSS (its processes' together, at
   the window's end) are each within 15 % of the second window's (the first holds the pipeline's warm-up).
   Writes the ``soak`` section of docs/benchmarks.md (unless ``--no-report``).

Stops the pipeline and the stack on exit, Ctrl-C included. The last script of ``make bench`` (it takes an
hour and some minutes to set up).

Run: .venv/bin/python bench/bench_soak.py [--rate 1000] [--minutes 60] [--window-minutes 5] [--no-report]
Quick: .venv/bin/python bench/bench_soak.py --minutes 4 --window-minutes 1 --rate 300 --no-report
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import FrameType
from typing import TypeVar

import numpy as np
import numpy.typing as npt
import orjson
import pandas as pd
import project_jobs
import report
from measure import (
    Latency,
    OutputReader,
    TreeSampler,
    cpu_seconds,
    pace,
    resident_bytes,
    stop_tree,
    tree_pids,
    wait_for,
)
from project_jobs import TOKEN_KEY, TX_PER_CUSTOMER_DAY, events_of

from contracts.events import TxColumns
from contracts.settings import Topics
from features.definitions import DAY_MS, FeatureParams
from fraud.metrics import Samples, scrape
from infra.clients import Clients
from infra.embedded.stack import HOST, StackInfo, free_port, temporary_stack
from infra.kafka.admin import ensure_topics
from ingest.produce import EventBatch, produce_events
from ingest.simulator import SimulatorConfig, simulate

ROOT = Path(__file__).resolve().parent.parent
LOGS = ROOT / "build" / "bench-soak"
FRAUD = Path(sys.executable).parent / "fraud"
PIPELINE = "fraud pipeline run"
#: Seconds after its window that a window's transactions' feature records are waited for.
DRAIN_S = 60.0
#: Flat: the last window's p99 and pipeline RSS within this share of the second window's.
FLAT_WITHIN = 0.15
MIB = 2**20
Number = TypeVar("Number", int, float)
#: The kinds of the pipeline's processes, as the RSS column names them.
COMMAND, JVM, WORKERS = "command", "JVM", "Python workers"


def reissue_cards(frame: pd.DataFrame, customers: int, life_days: int) -> pd.DataFrame:
    """``frame`` with each customer's card replaced by a fresh one every ``life_days`` days of event time,
    customer ``c`` on the days where ``(day + c) % life_days == 0``. Card ids stay simulated ones: the k-th
    card of customer ``c`` is ``c + k * customers``."""
    days = (frame[TxColumns.EVENT_TIME] - frame[TxColumns.EVENT_TIME].min().normalize()).dt.days.to_numpy()
    customer = frame[TxColumns.CARD_ID].to_numpy()
    issued = (days + customer % life_days) // life_days
    return frame.assign(**{TxColumns.CARD_ID: customer + issued * customers})


@dataclass(frozen=True)
class Load:
    """The records to pace, in sending order: the transactions after the backlog and the labels among them,
    by Kafka timestamp (at equal timestamps, transactions first)."""

    topics: list[str]
    keys: list[bytes]
    values: list[bytes]
    times: list[int]
    #: Each record's tx id; -1 for a label.
    tx_ids: npt.NDArray[np.int64]

    @classmethod
    def of(cls, later: EventBatch, topics: Topics) -> Load:
        labels = len(later.label_values)
        times = np.array([*later.tx_times, *later.label_times], dtype=np.int64)
        order = np.argsort(times, kind="stable")
        names = [topics.transactions] * len(later.tx_values) + [topics.labels] * labels
        keys = [*later.tx_keys, *later.label_keys]
        values = [*later.tx_values, *later.label_values]
        ids = [orjson.loads(value)[TxColumns.TX_ID] for value in later.tx_values] + [-1] * labels
        return cls(
            [names[i] for i in order],
            [keys[i] for i in order],
            [values[i] for i in order],
            times[order].tolist(),
            np.asarray(ids, dtype=np.int64)[order],
        )

    def bounds(self, windows: int, tx_per_window: int) -> list[int]:
        """Where each window's records start, and where the last one's end: ``tx_per_window`` transactions
        each, with the labels between them."""
        tx_at = np.flatnonzero(self.tx_ids >= 0)
        if len(tx_at) < windows * tx_per_window:
            raise SystemExit(
                f"the simulation has {len(tx_at):,} transactions after the backlog, the load needs "
                f"{windows * tx_per_window:,}: simulate more days (TX_PER_CUSTOMER_DAY)"
            )
        end = (
            int(tx_at[windows * tx_per_window]) if len(tx_at) > windows * tx_per_window else len(self.tx_ids)
        )
        return [0, *(int(tx_at[w * tx_per_window]) for w in range(1, windows)), end]


@dataclass(frozen=True)
class Window:
    """One window's figures."""

    label: str
    sent_rate: float
    output_rate: float
    memory_mean_bytes: float
    memory_peak_bytes: int
    #: Cores used over the window by the pipeline, the broker, Valkey and the bench itself.
    cpu_cores: dict[str, float]
    #: RSS of the pipeline's processes at the window's end: by kind, how many and their bytes.
    pipeline_resident: dict[str, tuple[int, int]]
    broker_resident_bytes: int
    redis_resident_bytes: int
    #: From the metrics endpoint at the window's end (empty, None: it did not answer).
    state_rows: dict[str, float]
    state_bytes: dict[str, float]
    lag: float | None
    latency: Latency | None = None
    #: The window's transactions without a feature record ``DRAIN_S`` after the window.
    missing: int = 0

    @property
    def pipeline_resident_bytes(self) -> int:
        """The RSS of the pipeline's processes together at the window's end."""
        return sum(resident for _, resident in self.pipeline_resident.values())

    def cells(self) -> list[str]:
        latency = (
            "no output"
            if self.latency is None
            else f"{self.latency.p50 * 1000:,.0f} / {self.latency.p99 * 1000:,.0f} ms"
        )
        if self.missing:
            latency += f" ({self.missing:,} missing)"
        processes = ", ".join(
            f"{kind}{f' x{count}' if count > 1 else ''} {resident / MIB:,.0f}"
            for kind, (count, resident) in self.pipeline_resident.items()
        )
        return [
            self.label,
            f"{self.sent_rate:,.0f} / {self.output_rate:,.0f}",
            latency,
            f"{self.memory_mean_bytes / MIB:,.0f} / {self.memory_peak_bytes / MIB:,.0f}",
            ", ".join(f"{name} {cores:.2f}" for name, cores in self.cpu_cores.items()),
            processes,
            f"{self.broker_resident_bytes / MIB:,.0f} / {self.redis_resident_bytes / MIB:,.0f}",
            " / ".join(f"{rows:,.0f}" for rows in self.state_rows.values()) or "-",
            " / ".join(f"{size / MIB:,.1f}" for size in self.state_bytes.values()) or "-",
            "-" if self.lag is None else f"{self.lag:,.0f}",
        ]


HEADERS = [
    "window",
    "tx/s sent / feature records/s",
    "latency p50 / p99",
    "pipeline memory MiB (PSS), mean / peak",
    "CPU cores",
    "pipeline RSS MiB by process, at the end",
    "broker / Valkey RSS MiB",
    "state rows, per operator",
    "state MiB, per operator",
    "lag, records",
]


@dataclass
class Soak:
    """What a run measured."""

    windows: list[Window] = field(default_factory=list)
    backlog_transactions: int = 0
    cards: int = 0
    event_days: float = 0.0
    first_output_s: float = 0.0


def pipeline_resident(root: int) -> dict[str, tuple[int, int]]:
    """The RSS of the pipeline's processes (the command ``root`` and its descendants) by kind: how many and
    their bytes."""
    kinds: dict[str, tuple[int, int]] = {}
    for pid in tree_pids(root):
        with contextlib.suppress(OSError, IndexError, ValueError):  # a worker that just ended
            name = Path(f"/proc/{pid}/comm").read_text().strip()
            kind = (
                COMMAND if pid == root else JVM if name == "java" else WORKERS if "python" in name else name
            )
            count, resident = kinds.get(kind, (0, 0))
            kinds[kind] = (count + 1, resident + resident_bytes(pid))
    return kinds


def by_label(samples: Samples | None, name: str, label: str) -> dict[str, float]:
    """The values of metric ``name`` by the value of its label ``label``."""
    return {
        dict(labels).get(label, ""): value
        for (sample, labels), value in (samples or {}).items()
        if sample == name
    }


def with_latency(
    window: Window,
    tx_ids: npt.NDArray[np.int64],
    tx_sent: npt.NDArray[np.float64],
    reader: OutputReader,
    stop: threading.Event,
) -> Window:
    """``window`` with the latency of its transactions (``tx_ids``, handed to the producer at ``tx_sent``),
    once their feature records are in or ``DRAIN_S`` has passed; prints its row. Gives up, as it is, once
    ``stop`` is set."""
    seen = reader.first_seen
    ids = tx_ids.tolist()
    deadline = time.monotonic() + DRAIN_S
    pending = [tx for tx in ids if tx not in seen]
    while pending and time.monotonic() < deadline and not stop.is_set():
        time.sleep(1.0)
        pending = [tx for tx in pending if tx not in seen]
    if stop.is_set():
        return window
    out = np.fromiter((tx in seen for tx in ids), dtype=bool, count=len(ids))
    latencies = np.array([seen[tx] for tx in tx_ids[out].tolist()]) - tx_sent[out]
    done = replace(
        window,
        latency=Latency.of(tx_sent[out], latencies) if len(latencies) else None,
        missing=len(ids) - int(out.sum()),
    )
    print(report.markdown_row(done.cells()), flush=True)
    return done


@dataclass(frozen=True)
class Watched:
    """What the bench watches while the load runs."""

    process: subprocess.Popen[bytes]
    reader: OutputReader
    sampler: TreeSampler
    info: StackInfo
    metrics_url: str

    def cpu_seconds(self) -> dict[str, float]:
        """The CPU seconds used so far by the pipeline, the broker, Valkey and this process."""
        return {
            "pipeline": self.sampler.cpu_s(),
            "broker": cpu_seconds(self.info.broker.pid),
            "Valkey": cpu_seconds(self.info.redis.pid),
            "bench": cpu_seconds(os.getpid()),
        }


def window_at_end(
    label: str,
    watched: Watched,
    started: float,
    outputs_before: int,
    cpu_before: dict[str, float],
    tx_sent: np.ndarray,
) -> Window:
    """A window's figures as they stand at its end (``started``: its start, monotonic seconds;
    ``outputs_before`` and ``cpu_before``: the feature records read and ``Watched.cpu_seconds`` then;
    ``tx_sent``: when its transactions were handed to the producer). Its latency comes later."""
    ended = time.monotonic()
    seconds = ended - started
    samples = scrape(watched.metrics_url)
    memory_mean, memory_peak = watched.sampler.memory_between(started, ended)
    return Window(
        label=label,
        sent_rate=(len(tx_sent) - 1) / float(tx_sent[-1] - tx_sent[0]),
        output_rate=(watched.reader.count - outputs_before) / seconds,
        memory_mean_bytes=memory_mean,
        memory_peak_bytes=memory_peak,
        cpu_cores={name: (used - cpu_before[name]) / seconds for name, used in watched.cpu_seconds().items()},
        pipeline_resident=pipeline_resident(watched.process.pid),
        broker_resident_bytes=resident_bytes(watched.info.broker.pid),
        redis_resident_bytes=resident_bytes(watched.info.redis.pid),
        state_rows=by_label(samples, "fraud_state_rows", "operator"),
        state_bytes=by_label(samples, "fraud_state_bytes", "operator"),
        lag=None
        if samples is None
        else sum(v for (name, _), v in samples.items() if name == "fraud_lag_records"),
    )


def soak(args: argparse.Namespace) -> Soak:
    """Simulate, start the stack and the pipeline, pace the load window by window; stop everything."""
    result = Soak()
    window_s = args.window_minutes * 60
    window_count = round(args.minutes / args.window_minutes)
    tx_per_window = round(args.rate * window_s)
    load_days = math.ceil(window_count * tx_per_window / (args.customers * TX_PER_CUSTOMER_DAY))
    days = args.backlog_days + load_days + 1
    simulated = time.monotonic()
    frame = simulate(
        SimulatorConfig(customers=args.customers, terminals=args.terminals, days=days, seed=args.seed)
    )
    frame = reissue_cards(frame, args.customers, args.card_life_days)
    result.cards = frame[TxColumns.CARD_ID].nunique()
    cut = frame[TxColumns.EVENT_TIME].min().normalize() + pd.Timedelta(days=args.backlog_days)
    first = frame[frame[TxColumns.EVENT_TIME] < cut]
    # Each event at its own time: the backlog's labels known after its end come with the load.
    backlog, later = events_of(frame).split_at(int(cut.timestamp() * 1000))
    del frame
    print(
        f"simulated {days} days of {args.customers:,} customers ({result.cards:,} cards issued) and made "
        f"their events in {time.monotonic() - simulated:.0f} s",
        flush=True,
    )

    LOGS.mkdir(parents=True, exist_ok=True)
    log_path = LOGS / "pipeline.log"
    with contextlib.ExitStack() as cleanup:
        home = Path(cleanup.enter_context(tempfile.TemporaryDirectory()))
        info = cleanup.enter_context(temporary_stack(home))
        clients = Clients.for_stack(info, home, partitions=args.partitions)
        topics = clients.settings.topics
        ensure_topics(clients.admin(), topics.all(), args.partitions, 1)
        load = Load.of(later, topics)
        del later
        bounds = load.bounds(window_count, tx_per_window)
        result.event_days = (load.times[bounds[-1] - 1] - load.times[0]) / DAY_MS
        project_jobs.train_champion(first, info, FeatureParams())
        del first
        produced = produce_events(clients.producer(), topics, backlog)
        result.backlog_transactions = produced.transactions
        print(
            f"backlog of {produced.transactions:,} transactions and {produced.labels:,} labels produced; the "
            f"load: {window_count * tx_per_window:,} transactions over {result.event_days:.0f} days of event time",
            flush=True,
        )

        reader = OutputReader(clients, topics.features, set()).start()
        cleanup.callback(reader.stop)
        port = free_port()
        env = project_jobs.fraud_env(
            info,
            home,
            TOKEN_KEY.decode(),
            FRAUD_PARTITIONS=str(args.partitions),
            FRAUD_METRICS_PORT=str(port),
        )
        command = [str(FRAUD), "pipeline", "run", "--trigger-interval-s", str(args.trigger_interval_s)]
        log = cleanup.enter_context(log_path.open("wb"))
        process = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=home, start_new_session=True
        )
        launched = time.monotonic()
        cleanup.callback(stop_tree, process)
        sampler = TreeSampler(process.pid, interval_s=1.0).start()
        cleanup.callback(sampler.stop)
        watched = Watched(process, reader, sampler, info, f"http://{HOST}:{port}/metrics")
        wait_for(
            lambda: reader.count >= produced.transactions,
            3600,
            "the backlog's feature records",
            process,
            PIPELINE,
        )
        result.first_output_s = min(reader.first_seen.values()) - launched
        print(
            f"first output {result.first_output_s:.1f} s after launch; backlog through at "
            f"{time.monotonic() - launched:.1f} s; pacing {args.rate:,.0f} tx/s for {args.minutes:g} min "
            f"(log: {log_path.relative_to(ROOT)})",
            flush=True,
        )

        # Each window's latency is taken in a thread, once its outputs are in, while the next window runs.
        finishing = ThreadPoolExecutor(1, thread_name_prefix="window")
        cleanup.callback(finishing.shutdown, wait=True, cancel_futures=True)
        stop = threading.Event()
        cleanup.callback(stop.set)  # runs first: a window waiting for its outputs gives up
        producer = clients.producer()
        operators = by_label(scrape(watched.metrics_url), "fraud_state_rows", "operator")
        print(
            f"state per operator, in the state columns' order: {', '.join(operators) or 'none reported yet'}"
        )
        print(report.markdown_header(HEADERS), flush=True)
        futures = []
        for w in range(window_count):
            start, end = bounds[w], bounds[w + 1]
            started, outputs_before, cpu_before = time.monotonic(), reader.count, watched.cpu_seconds()
            sent = pace(
                producer,
                load.topics[start:end],
                load.keys[start:end],
                load.values[start:end],
                load.times[start:end],
                (end - start) / window_s,
            )
            if process.poll() is not None:
                raise SystemExit(
                    f"{PIPELINE} exited ({process.returncode}) in window {w + 1}: see {log_path}"
                )
            if reader.error is not None:
                raise SystemExit(f"the output reader failed in window {w + 1}: {reader.error}")
            is_tx = load.tx_ids[start:end] >= 0
            label = f"{w + 1} ({w * args.window_minutes:g}-{(w + 1) * args.window_minutes:g} min)"
            window = window_at_end(label, watched, started, outputs_before, cpu_before, sent[is_tx])
            futures.append(
                finishing.submit(
                    with_latency, window, load.tx_ids[start:end][is_tx], sent[is_tx], reader, stop
                )
            )
        result.windows = [future.result() for future in futures]
    return result


def verdict(windows: list[Window]) -> report.Table:
    """Whether the soak stayed flat: the last window's p99 and pipeline RSS each within ``FLAT_WITHIN`` of
    the second window's (a window without output is not flat)."""
    second, last = windows[1], windows[-1]

    def p99_ms(window: Window) -> float:
        return math.inf if window.latency is None else window.latency.p99 * 1000

    rows, flat = [], True
    for figure, unit, before, after in (
        ("latency p99", "ms", p99_ms(second), p99_ms(last)),
        (
            "pipeline RSS, at the window's end",
            "MiB",
            second.pipeline_resident_bytes / MIB,
            last.pipeline_resident_bytes / MIB,
        ),
    ):
        change = after / before - 1 if before > 0 else math.inf
        within = abs(change) <= FLAT_WITHIN
        flat = flat and within
        rows.append(
            [
                figure,
                f"{before:,.0f} {unit}",
                f"{after:,.0f} {unit}",
                f"{change:+.1%}",
                "yes" if within else "NO",
            ]
        )
    return report.Table(
        ["figure", f"window {second.label}", f"window {last.label}", "change", f"within {FLAT_WITHIN:.0%}"],
        rows,
        caption=(
            f"Verdict: {'flat' if flat else 'NOT flat'} (the last window's p99 and pipeline RSS against the "
            f"second's, each within {FLAT_WITHIN:.0%} or not)"
        ),
    )


def windows_table(result: Soak, args: argparse.Namespace) -> report.Table:
    operators = [f"`{name}`" for name in result.windows[-1].state_rows]
    return report.Table(
        HEADERS,
        [window.cells() for window in result.windows],
        caption=(
            f"`fraud pipeline run` at {args.rate:,.0f} tx/s for {args.minutes:g} min, window by window: "
            f"{args.customers:,} customers, {result.cards:,} cards issued over the run (a fresh card every "
            f"{args.card_life_days} days of event time), {result.event_days:.0f} days of event time paced after "
            f"a backlog of {result.backlog_transactions:,} transactions"
        ),
        notes=[
            "Latency: from handing a transaction to the producer to its feature record being readable "
            f"(read_committed); a transaction whose record was not in {DRAIN_S:.0f} s after its window counts as "
            "missing. Pipeline: the command's process tree (the command's Python, Spark's JVM, its Python "
            "workers); memory is its PSS (shared pages divided among the processes that map them), sampled "
            "every second; the RSS column is each kind of process at the window's end. CPU: the cores each used "
            "over the window, the bench's own (load generator, output reader) included: they share the host. "
            "The broker keeps its topics on disk (its JVM heap is 512 MiB; its RSS counts the pages of its logs "
            "it maps too). "
            "State rows, bytes and lag: the pipeline's metrics endpoint at the window's end (`fraud_state_rows`, "
            f"`fraud_state_bytes` per operator: {', '.join(operators) or 'none reported'}; `fraud_lag_records`, "
            "what its last micro-batch left behind the logs' ends, summed over the partitions of its inputs). "
            f"First feature record {result.first_output_s:.1f} s after launch.",
        ],
    )


def above_zero(convert: Callable[[str], Number]) -> Callable[[str], Number]:
    """An argument type: a number (``convert``, int or float) more than 0."""

    def parse(text: str) -> Number:
        try:
            value = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not a{' whole' if convert is int else ''} number"
            ) from None
        if not 0 < value < math.inf:
            raise argparse.ArgumentTypeError(f"{text!r}: must be more than 0")
        return value

    return parse


def interrupt_once(signum: int, frame: FrameType | None) -> None:
    """Ctrl-C: stop the soak, and let the stopping of what it started finish (later Ctrl-Cs are ignored)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    raise KeyboardInterrupt


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rate", type=above_zero(float), default=1000.0, help="paced load, transactions/s")
    parser.add_argument("--minutes", type=above_zero(float), default=60.0, help="length of the paced load")
    parser.add_argument(
        "--window-minutes", type=above_zero(float), default=5.0, help="one row of figures per window"
    )
    parser.add_argument(
        "--customers",
        type=above_zero(int),
        default=5000,
        help="of the simulated world, one card each at a time",
    )
    parser.add_argument("--terminals", type=above_zero(int), default=10000, help="of the simulated world")
    parser.add_argument(
        "--backlog-days",
        type=above_zero(int),
        default=31,
        help="days of history produced before the load (the initial state)",
    )
    parser.add_argument(
        "--card-life-days",
        type=above_zero(int),
        default=60,
        help="days of event time before a customer's card is replaced",
    )
    parser.add_argument("--partitions", type=above_zero(int), default=4, help="of every topic")
    parser.add_argument("--trigger-interval-s", type=above_zero(float), default=0.2, help="of the pipeline")
    parser.add_argument("--seed", type=int, default=0)
    report.add_flag(parser)
    args = parser.parse_args()
    windows = args.minutes / args.window_minutes
    if windows != round(windows) or windows < 3:
        parser.error(
            "--minutes must be 3 or more whole --window-minutes (the verdict compares the last with the second)"
        )
    if round(args.rate * args.window_minutes * 60) < 2:
        parser.error("--rate over a --window-minutes window must come to 2 transactions or more")
    print(f"settings: {report.args_settings(args)}; {report.EMBEDDED_STACK}", flush=True)
    signal.signal(signal.SIGINT, interrupt_once)
    started = time.monotonic()
    try:
        result = soak(args)
    except KeyboardInterrupt:
        print("\ninterrupted: the pipeline and the stack are stopped", file=sys.stderr)
        sys.exit(130)
    table = verdict(result.windows)
    print()
    print(report.markdown_table(table))
    print(f"\nbench_soak took {(time.monotonic() - started) / 60:.1f} min")
    report.write_unless_skipped(
        args,
        "soak",
        script=__file__,
        tables=[windows_table(result, args), table],
        settings={
            **report.args_settings(args),
            "backlog_transactions": result.backlog_transactions,
            "cards_issued": result.cards,
            "stack": report.EMBEDDED_STACK,
        },
        title="Soak: an hour at a steady load",
    )


if __name__ == "__main__":
    main()
