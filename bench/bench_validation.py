"""Validation throughput: ``validate_many`` (columnar fast path) against ``parse_event`` record by record.

Simulates transactions (seed 0), builds their wire JSON as ingest does (``events_from_table``), takes the
first ``--records`` of them and times, best of ``--repeats`` rounds:

- ``parse_event`` on each record (what the stream jobs do today);
- ``validate_many`` on a Python list of the values, and on a ``pa.BinaryArray`` (as a Spark worker gets
  them), plus ``parse_event`` on whatever it leaves slow, which is the whole cost for a caller;
- the same with ``--dirty`` of the records damaged (a wrong type, an extra field, a bad token), to show
  the cost of records that go slow.

It prints records per CPU-second and the speed-up, and writes them to the ``validation`` section of
docs/benchmarks.md; nothing is asserted. CPU time of this process is measured, and the variants take
turns, because a shared machine's load moves wall-clock times a lot.

Run: .venv/bin/python bench/bench_validation.py [--records 100000] [--repeats 3] [--dirty 0.01] [--no-report]
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Callable, Sequence

import pyarrow as pa
import report

from contracts.events import DAY_MS, DeadLetter, TransactionEvent
from ingest.files import clean_table
from ingest.produce import events_from_table
from ingest.simulator import SimulatorConfig, simulate
from validation.columnar import validate_many
from validation.parse import parse_event

MAX_BYTES = 16_384
#: The simulation the records come from.
SIMULATION = SimulatorConfig(customers=2000, terminals=4000, days=60, seed=0)


def _best(runs: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """The least CPU time of each run over ``repeats`` rounds (interleaved, so that they share the load)."""
    best = dict.fromkeys(runs, float("inf"))
    for _ in range(repeats):
        for name, run in runs.items():
            started = time.process_time()
            run()
            best[name] = min(best[name], time.process_time() - started)
    return best


def _per_record(values: Sequence[bytes]) -> list[TransactionEvent | DeadLetter]:
    """What the stream jobs do today; the results are kept, as they keep them (which costs GC time)."""
    return [parse_event(TransactionEvent, raw, "kafka:bench", MAX_BYTES, 0, 0) for raw in values]


def _columnar(
    values: Sequence[bytes] | pa.BinaryArray, raws: Sequence[bytes]
) -> tuple[pa.Table, list[TransactionEvent | DeadLetter]]:
    """The fast path and ``parse_event`` on what it leaves slow, as a caller would use them."""
    result = validate_many(TransactionEvent, values, MAX_BYTES)
    slow = [
        parse_event(TransactionEvent, raws[i], "kafka:bench", MAX_BYTES, 0, 0) for i in result.slow.tolist()
    ]
    return result.table, slow


def _damage(values: list[bytes], fraction: float, seed: int) -> list[bytes]:
    rng = random.Random(seed)
    damaged = list(values)
    edits = [
        (b'"tx_id":', b'"tx_id":"'),  # malformed
        (b'"amount":', b'"amount":"1",  "x":'),  # wrong type, extra field
        (b'"schema_version":1', b'"schema_version":2'),
        (b'"card_id":', b'"card_id":1,"y":'),
    ]
    for i in rng.sample(range(len(values)), int(len(values) * fraction)):
        old, new = rng.choice(edits)
        damaged[i] = values[i].replace(old, new, 1)
    return damaged


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--records", type=int, default=100_000, help="transactions to validate")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs of each variant (best is shown)")
    parser.add_argument("--dirty", type=float, default=0.01, help="fraction damaged in the dirty run")
    report.add_flag(parser)
    args = parser.parse_args()

    frame = simulate(SIMULATION)
    batch = events_from_table(clean_table(frame, "bench"), "bench", b"bench", 7 * DAY_MS, MAX_BYTES)
    values = batch.tx_values[: args.records]
    if len(values) < args.records:
        raise SystemExit(f"the simulation gave only {len(values):,} transactions")
    size = sum(map(len, values))
    print(f"{len(values):,} simulated transactions, {size / len(values):.0f} bytes each on average")

    array = pa.array(values, pa.binary())
    dirty = _damage(values, args.dirty, seed=1)
    dirty_array = pa.array(dirty, pa.binary())
    slow = len(_columnar(values, values)[1])
    dirty_slow = len(_columnar(dirty_array, dirty)[1])
    results = _best(
        {
            "parse_event per record": lambda: _per_record(values),
            "validate_many, list input": lambda: _columnar(values, values),
            "validate_many, BinaryArray": lambda: _columnar(array, values),
            f"parse_event, {args.dirty:.2%} dirty": lambda: _per_record(dirty),
            f"validate_many, {args.dirty:.2%} dirty": lambda: _columnar(dirty_array, dirty),
        },
        args.repeats,
    )
    print(f"left slow by validate_many: {slow:,} clean, {dirty_slow:,} of the dirty run")
    baseline = {
        "clean": results["parse_event per record"],
        "dirty": results[f"parse_event, {args.dirty:.2%} dirty"],
    }
    rows = [
        (name, seconds, len(values) / seconds, baseline["dirty" if "dirty" in name else "clean"] / seconds)
        for name, seconds in results.items()
    ]
    print(f"{'variant (CPU time, best of the rounds)':40} {'seconds':>8} {'records/s':>12} {'speed-up':>9}")
    for name, seconds, rate, speedup in rows:
        print(f"{name:40} {seconds:8.3f} {rate:12,.0f} {speedup:8.1f}x")
    table = report.Table(
        ["variant (CPU time, best of the rounds)", "seconds", "records/s", "speed-up"],
        [[n, f"{s:.3f}", f"{r:,.0f}", f"{x:.1f}x"] for n, s, r, x in rows],
        notes=[
            f"{len(values):,} transactions, {size / len(values):.0f} bytes each on average; "
            f"left slow by validate_many: {slow:,} clean, {dirty_slow:,} of the dirty run."
        ],
    )
    settings = {
        "records": len(values),
        "repeats": args.repeats,
        "dirty": args.dirty,
        **{f"simulation.{k}": v for k, v in SIMULATION.model_dump(mode="json").items()},
        "pyarrow": pa.__version__,
    }
    report.write_unless_skipped(args, "validation", script=__file__, tables=[table], settings=settings)


if __name__ == "__main__":
    main()
