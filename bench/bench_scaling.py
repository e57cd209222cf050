"""How the feature job scales: throughput on local[1], local[2] and a standalone master + worker; memory and
state against the number of cards and of events.

Each run is ``fraud features run --once`` over a simulation produced to an embedded stack of its own, as a
user runs it (Spark's start-up included in the wall time, not in the rate):

1. **Masters**: one simulation (``--customers``, ``--days``) on ``local[1]``, ``local[2]`` and a standalone
   cluster (a master and one worker with 2 cores from the pyspark wheel, ``infra.spark.cluster``).
2. **Cards**: ``--cards`` cards (10k, 100k, 1M) over ``--card-days`` days (1) each: the state holds every card's
   transactions of the last 30 days, so it should grow with the cards.
3. **Events**: ``--event-cards`` cards (5,000) over ``--event-days`` (45 and 90 days): twice the events,
   the same 30 days of history per card (full from the 30th day on), so the state should not grow.

Per run: records/s (the command's own report, and over its micro-batches after the first, whose Python
workers and state are up: the masters' runs take 30,000 records per micro-batch to have several), wall
time, the peak memory (PSS) of the job's processes (the command's process tree; on the cluster, the
worker's too), and its state on disk (the checkpoint's state stores). Writes the ``scaling`` section of docs/benchmarks.md.

Run: .venv/bin/python bench/bench_scaling.py [--cards 10000,100000,1000000] [--no-report]
Quick: .venv/bin/python bench/bench_scaling.py --customers 500 --days 10 --cards 1000,5000 --card-days 2 --event-cards 300 --event-days 35,40 --no-report
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import report
from measure import TreeSampler
from project_jobs import fraud_env

from contracts.events import DAY_MS
from infra.clients import Clients
from infra.embedded.stack import temporary_stack
from infra.kafka.admin import create_project_topics
from infra.spark.cluster import SPARK_ENV, standalone_cluster
from ingest.files import clean_table
from ingest.produce import events_from_table, produce_events
from ingest.simulator import SimulatorConfig, simulate

FRAUD = Path(sys.executable).parent / "fraud"
#: The command's last line: ``Done: 1,234 records in 5 micro-batches, 6.7 s (184 records/s).``
DONE = re.compile(r"Done: ([\d,]+) records in ([\d,]+) micro-batches, ([\d,.]+) s \(([\d,]+) records/s\)")
#: Its line per micro-batch: ``  batch 3: 30,000 records in 1.2 s (25,000/s)``.
BATCH = re.compile(r"batch (\d+): ([\d,]+) records in ([\d,.]+) s")
#: Records per micro-batch of the masters' runs: several micro-batches after the first, whose rate is
#: the steady one (the first starts the Python workers and the state).
MASTERS_MAX_RECORDS = 30_000


@dataclass(frozen=True)
class Run:
    """One run of the feature job: what it read, how fast, how much memory and state."""

    transactions: int
    records: int
    rate: float
    #: Records/s over the micro-batches after the first (None with a single micro-batch).
    steady_rate: float | None
    wall_s: float
    peak_memory_bytes: int
    state_bytes: int


def directory_bytes(path: Path) -> int:
    return sum(file.stat().st_size for file in path.rglob("*") if file.is_file())


#: Terminals of every simulation: the handbook's (the density a customer's terminals are drawn from).
TERMINALS = 10_000


def run_job(
    customers: int,
    days: int,
    seed: int,
    master: str,
    work: Path,
    worker_pid: int | None = None,
    max_records: int | None = None,
) -> Run:
    """Simulate, produce to a stack of its own, run the feature job once on ``master`` (``max_records`` per
    micro-batch, else the default); its figures."""
    frame = simulate(SimulatorConfig(customers=customers, terminals=TERMINALS, days=days, seed=seed))
    home = work / "home"
    with temporary_stack(work / "stack") as info:
        clients = Clients.for_stack(info, home, partitions=4)
        settings = clients.settings
        create_project_topics(clients.admin(), settings)
        events = events_from_table(
            clean_table(frame, "bench"), "bench", b"bench-token-key", 7 * DAY_MS, settings.max_event_bytes
        )
        produce_events(clients.producer(), settings.topics, events)
        env = fraud_env(
            info,
            home,
            "bench-token-key",
            **SPARK_ENV,
            FRAUD_PARTITIONS="4",
            FRAUD_SPARK_MASTER=master,
            COLUMNS="200",
        )
        started = time.perf_counter()
        limit = [] if max_records is None else ["--max-records", str(max_records)]
        process = subprocess.Popen(
            [str(FRAUD), "features", "run", "--once", *limit],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        samplers = [TreeSampler(pid).start() for pid in (process.pid, worker_pid) if pid is not None]
        out, err = process.communicate()
        wall_s = time.perf_counter() - started
        for sampler in samplers:
            sampler.stop()
    text = out.decode(errors="replace")
    done = DONE.search(text)
    if process.returncode != 0 or done is None:
        sys.exit(
            f"fraud features run on {master} failed ({process.returncode}):\n{text[-2000:]}{err.decode()[-3000:]}"
        )
    state = home / "checkpoints" / "features" / "query" / "state"
    return Run(
        transactions=len(events.tx_values),
        records=int(done.group(1).replace(",", "")),
        rate=float(done.group(4).replace(",", "")),
        steady_rate=steady_rate(text),
        wall_s=wall_s,
        peak_memory_bytes=sum(sampler.peak_memory_bytes for sampler in samplers),
        state_bytes=directory_bytes(state),
    )


def steady_rate(output: str) -> float | None:
    """Records/s over the command's micro-batches after the first, from its lines per micro-batch."""
    batches = [
        (int(records.replace(",", "")), float(seconds.replace(",", "")))
        for batch, records, seconds in BATCH.findall(output)
        if int(batch) > 0
    ]
    seconds = sum(s for _, s in batches)
    return sum(r for r, _ in batches) / seconds if batches and seconds else None


def in_days(n: int) -> str:
    return f"{n} day" if n == 1 else f"{n} days"


def mib(n: int) -> str:
    return f"{n / 2**20:,.1f} MiB"


def row(name: str, run: Run) -> list[str]:
    return [
        name,
        f"{run.transactions:,}",
        f"{run.rate:,.0f}",
        f"{run.steady_rate:,.0f}" if run.steady_rate else "- (one micro-batch)",
        f"{run.wall_s:,.0f} s",
        mib(run.peak_memory_bytes),
        mib(run.state_bytes),
    ]


HEADERS = [
    "run",
    "transactions",
    "records/s, whole run",
    "records/s after the first micro-batch",
    "wall time",
    "peak memory (PSS)",
    "state on disk",
]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--customers", type=int, default=5000, help="cards of the masters' runs")
    parser.add_argument("--days", type=int, default=15, help="days of the masters' runs")
    parser.add_argument("--cards", default="10000,100000,1000000")
    parser.add_argument("--card-days", type=int, default=1, help="days of the cards' runs")
    parser.add_argument("--event-cards", type=int, default=5_000, help="cards of the events' runs")
    parser.add_argument("--event-days", default="45,90", help="days of the events' runs")
    parser.add_argument("--seed", type=int, default=0)
    report.add_flag(parser)
    args = parser.parse_args()
    print(f"settings: {vars(args)}")

    masters, cards, events = [], [], []
    with tempfile.TemporaryDirectory() as directory:
        work = Path(directory)
        for master in ("local[1]", "local[2]"):
            run = run_job(
                args.customers, args.days, args.seed, master, work / master, None, MASTERS_MAX_RECORDS
            )
            masters.append(row(master, run))
            print(masters[-1])
        with standalone_cluster(work / "cluster", cores=2, memory="4g") as cluster:
            run = run_job(
                args.customers,
                args.days,
                args.seed,
                cluster.master_url,
                work / "standalone",
                cluster.worker_pid,
                MASTERS_MAX_RECORDS,
            )
            masters.append(row("standalone: 1 master, 1 worker of 2 cores", run))
            print(masters[-1])
        for n in (int(value) for value in args.cards.split(",")):
            run = run_job(n, args.card_days, args.seed, "local[2]", work / f"cards-{n}")
            cards.append(row(f"{n:,} cards, {in_days(args.card_days)}", run))
            print(cards[-1])
        for n_days in (int(value) for value in args.event_days.split(",")):
            run = run_job(args.event_cards, n_days, args.seed, "local[2]", work / f"days-{n_days}")
            events.append(row(f"{args.event_cards:,} cards, {in_days(n_days)}", run))
            print(events[-1])

    report.write_unless_skipped(
        args,
        "scaling",
        script=__file__,
        tables=[
            report.Table(
                HEADERS,
                masters,
                caption=f"Throughput by Spark master (the same input, {MASTERS_MAX_RECORDS:,} records per "
                "micro-batch).",
            ),
            report.Table(HEADERS, cards, caption="Memory and state against the number of cards."),
            report.Table(HEADERS, events, caption="Memory and state against the number of events."),
        ],
        settings={**report.args_settings(args), "stack": report.EMBEDDED_STACK},
        title="Scaling: Spark masters, cards and events",
    )


if __name__ == "__main__":
    main()
