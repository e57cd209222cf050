"""Benchmark of the handbook transaction simulator: rows per second and the fraud it generates.

Run: ``.venv/bin/python bench/bench_simulator.py [--customers N] [--terminals N] [--days N]
[--seed N] [--repeats N] [--no-report]``. Simulates the configuration ``--repeats`` times and prints the
median time; the fraud figures are those of the (deterministic) output. Writes them to the ``simulator``
section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

import numpy as np
import report

from contracts.events import TxColumns
from ingest.simulator import SimulatorConfig, simulate


def _parse_args() -> argparse.Namespace:
    defaults = SimulatorConfig()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--customers", type=int, default=defaults.customers, help="number of customers")
    parser.add_argument("--terminals", type=int, default=defaults.terminals, help="number of terminals")
    parser.add_argument("--days", type=int, default=defaults.days, help="number of simulated days")
    parser.add_argument("--seed", type=int, default=defaults.seed, help="seed of the simulation")
    parser.add_argument("--repeats", type=int, default=3, help="number of timed simulations")
    report.add_flag(parser)
    return parser.parse_args()


def main() -> None:
    """Time the simulator and print a one-screen summary."""
    args = _parse_args()
    config = SimulatorConfig(
        customers=args.customers, terminals=args.terminals, days=args.days, seed=args.seed
    )
    seconds: list[float] = []
    for _ in range(max(1, args.repeats)):
        started = time.perf_counter()
        frame = simulate(config)
        seconds.append(time.perf_counter() - started)

    median = statistics.median(seconds)
    rows = len(frame)
    scenarios = np.bincount(frame[TxColumns.FRAUD_SCENARIO].to_numpy(), minlength=4)
    frauds = int(scenarios[1:].sum())
    figures = [
        ["rows", f"{rows:,} ({rows / config.days:,.0f} a day)"],
        ["seconds", f"median {median:.3f} of {len(seconds)}: {', '.join(f'{s:.3f}' for s in seconds)}"],
        ["rows/s", f"{rows / median:,.0f}"],
        ["frauds", f"{frauds:,} ({frauds / rows:.3%})"],
    ]
    figures += [
        [f"fraud scenario {scenario}", f"{int(count):,} ({count / max(frauds, 1):.1%} of frauds)"]
        for scenario, count in zip((1, 2, 3), scenarios[1:], strict=True)
    ]
    print(f"settings          {config.model_dump_json()}")
    print(
        f"machine           python {platform.python_version()}, numpy {np.__version__}, {os.cpu_count()} cpus"
    )
    for name, value in figures:
        print(f"{name:17} {value}")
    report.write_unless_skipped(
        args,
        "simulator",
        script=__file__,
        tables=[report.Table(["figure", "value"], figures)],
        settings={**config.model_dump(mode="json"), "repeats": len(seconds), "numpy": np.__version__},
    )


if __name__ == "__main__":
    main()
