"""The stateful stages' state calls alone, in one Python process: what a micro-batch costs as the cards held
grow, with the state kept in pages (``features.stateful``) against one value per bucket (the layout of
earlier versions).

1. Simulates ``--days`` of a fixed-seed input (``ingest.simulator``) for each ``--customers`` count; all but
   the last day is the history the state holds, built in one call per stage and bucket.
2. Cuts the last day's transactions into micro-batches of ``--batch`` (2,000: a second at 2,000 tx/s) and
   runs both stages on each, both ways:

   - **pages**: ``card_call`` and ``terminal_call`` with their state in dictionaries that stand for Spark's
     state variables, counting the requests to the JVM's state server the job would send and the round
     trips they go in (``infra.spark.internals.PipelinedMap``);
   - **one value per bucket**: each bucket's history and waiting events decoded from Arrow IPC blobs,
     ``card_stage`` and ``terminal_stage`` over the whole bucket, the blobs encoded again (what the job did
     before entries: two state calls per bucket and stage).

3. Prints the median process CPU time per micro-batch (the Python work: decoding, the core, encoding; not
   the JVM's side of the state calls, which the counts stand for), the state calls per micro-batch and the
   bytes they move, and writes the ``state`` section of docs/benchmarks.md (unless ``--no-report``).

The end-to-end figures with Spark (the JVM's state server, RocksDB, the changelog) are bench_microbatch.py's.

Pages are measured at each of ``--page-bytes`` (the default, a quarter and four times it), to choose their
size: larger pages, fewer state calls but more cards' history in each.

Run: .venv/bin/python bench/bench_state.py [--customers 5000,50000] [--days 31] [--page-bytes 8192,32768]
[--no-report]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import report

from contracts.settings import DEFAULT_PAGE_BYTES
from features.buckets import card_buckets, terminal_buckets
from features.core import CardState, TerminalState, card_step, terminal_step
from features.definitions import DAY_MS, EVENT_TIME_MS, KNOWN_AT_MS, TX_TIME_MS, FeatureParams
from features.entries import Layout
from features.entry_store import EntryStore
from features.rows import (
    CARD_BUCKET,
    KIND,
    SOURCE_OFFSET,
    TERMINAL_BUCKET,
    RowKind,
    decoded_fields,
    frame_of,
)
from features.stages import CardBucket, card_stage, terminal_stage
from features.stateful import BucketState, card_call, card_start, terminal_call, terminal_start
from features.transport import from_blob, to_blob
from infra.spark.timing import Timings
from ingest.simulator import SimulatorConfig, simulate
from ingest.tokens import tokenise


@dataclass
class Counted:
    """A state variable as a dictionary, counting what the job would send Spark's state server: requests,
    exchanges (round trips: a batched call's requests go in one, ``infra.spark.internals.PipelinedMap``) and bytes."""

    calls: Counter[str] = field(default_factory=Counter)
    data: dict[Any, Any] = field(default_factory=dict)
    value: tuple[Any, ...] | None = None

    def _count(self, requests: int, values: Iterable[tuple[Any, ...] | None]) -> None:
        if requests:
            self.calls["requests"] += requests
            self.calls["exchanges"] += 1
        self.calls["bytes"] += sum(
            len(part) for value in values if value for part in value if isinstance(part, (bytes, str))
        )

    def get_many(self, keys: Sequence[tuple[Any, ...]]) -> list[tuple[Any, ...] | None]:
        found = [self.data.get(key) for key in keys]
        self._count(len(keys), found)
        return found

    def update_many(self, items: Iterable[tuple[tuple[Any, ...], tuple[Any, ...]]]) -> None:
        pairs = list(items)
        self._count(len(pairs), (value for _, value in pairs))
        self.data.update(pairs)

    def remove_many(self, keys: Iterable[tuple[Any, ...]]) -> None:
        removed = list(keys)
        self._count(len(removed), ())
        for key in removed:
            del self.data[key]

    def get(self) -> tuple[Any, ...] | None:
        self._count(1, [self.value])
        return self.value

    def update(self, newValue: tuple[Any, ...]) -> None:
        self._count(1, [newValue])
        self.value = newValue


def events(tx: pd.DataFrame, layout: Layout) -> pd.DataFrame:
    """Decoded transaction rows, as the Kafka source hands them to the card stage."""
    n = len(tx)
    return frame_of(
        decoded_fields(),
        {
            CARD_BUCKET: card_buckets(tx["card_id"], layout.card_buckets),
            KIND: np.full(n, RowKind.TX, dtype=object),
            "tx_id": tx["tx_id"].to_numpy(dtype=np.int64),
            "card_id": tx["card_id"].to_numpy(dtype=object),
            "terminal_id": tx["terminal_id"].to_numpy(dtype=object),
            "amount": tx["amount"].to_numpy(dtype=np.float64),
            EVENT_TIME_MS: tx[EVENT_TIME_MS].to_numpy(dtype=np.int64),
            SOURCE_OFFSET: np.arange(n, dtype=np.int64),
        },
        n,
    )


def tick(frontier: int, buckets: int) -> pd.DataFrame:
    return frame_of(
        decoded_fields(),
        {
            CARD_BUCKET: np.arange(buckets, dtype=np.int32),
            KIND: np.full(buckets, "tick", dtype=object),
            EVENT_TIME_MS: np.full(buckets, frontier, dtype=np.int64),
        },
        buckets,
    )


#: The layout of earlier versions the entries are measured against.
WHOLE = "one value per bucket"


@dataclass
class Run:
    cpu_ms: list[float] = field(default_factory=list)
    calls: Counter[str] = field(default_factory=Counter)


def measure(
    customers: int, days: int, batch: int, batches: int, seed: int, page_bytes: Sequence[int]
) -> dict[str, Run]:
    """Each way of keeping the state on the same micro-batches: pages cut past each of ``page_bytes``, and
    one value per bucket."""
    params = FeatureParams()
    layouts = {f"pages of up to {n // 1024:,} KiB": Layout(page_bytes=n) for n in page_bytes}
    layout = next(iter(layouts.values()))  # the buckets, the same in every layout
    frame = simulate(SimulatorConfig(customers=customers, terminals=2 * customers, days=days, seed=seed))
    tx = pd.DataFrame(
        {
            "tx_id": frame["tx_id"],
            "card_id": tokenise(frame["card_id"], b"bench"),
            "terminal_id": frame["terminal_id"].astype(str),
            "amount": frame["amount"],
            EVENT_TIME_MS: frame["event_time"].astype("datetime64[ms, UTC]").astype("int64"),
        }
    ).sort_values([EVENT_TIME_MS, "tx_id"], ignore_index=True)
    last_day = tx[EVENT_TIME_MS].max() // DAY_MS * DAY_MS
    history, today = tx[tx[EVENT_TIME_MS] < last_day], tx[tx[EVENT_TIME_MS] >= last_day]
    card_of = card_buckets(history["card_id"], layout.card_buckets)
    terminal_of = terminal_buckets(history["terminal_id"], layout.terminal_buckets)
    frontier = int(history[EVENT_TIME_MS].max()) + 1
    no_labels = pd.DataFrame(
        {"tx_id": [], "terminal_id": [], TX_TIME_MS: [], KNOWN_AT_MS: [], "is_fraud": []}
    )

    # The state after the history, both ways.
    whole_cards: dict[int, tuple[bytes, bytes, int]] = {}
    whole_terminals: dict[int, tuple[bytes, bytes]] = {}

    def new_state() -> BucketState:
        return BucketState(Counted(), EntryStore(Counted(), Counted()))

    card_state = {name: {b: new_state() for b in range(layout.card_buckets)} for name in layouts}
    terminal_state = {name: {b: new_state() for b in range(layout.terminal_buckets)} for name in layouts}
    for b in range(layout.card_buckets):
        cards, _ = card_step(CardState.empty(), history[card_of == b], params)
        bucket = CardBucket(cards, events(history.iloc[:0], layout), frontier)
        whole_cards[b] = (to_blob(cards.to_frame(), ("card_id",)), to_blob(bucket.pending), frontier)
        for name, chosen in layouts.items():
            card_start(card_state[name][b], bucket, chosen)
    for b in range(layout.terminal_buckets):
        mine = history[terminal_of == b][["tx_id", "terminal_id", EVENT_TIME_MS]]
        terminals, _ = terminal_step(
            TerminalState.empty(), mine, no_labels.astype({"tx_id": "int64"}), params
        )
        frames = terminals.to_frames()
        whole_terminals[b] = (to_blob(frames[0], ("terminal_id",)), to_blob(frames[1], ("terminal_id",)))
        for name, chosen in layouts.items():
            terminal_start(terminal_state[name][b], terminals, chosen)

    def variables(name: str) -> Iterator[Counted]:
        for state in (*card_state[name].values(), *terminal_state[name].values()):
            yield from (state.value, state.entries.entries, state.entries.index)  # type: ignore[misc]

    for name in layouts:
        for variable in variables(name):
            variable.calls.clear()

    runs = {**{name: Run() for name in layouts}, WHOLE: Run()}
    for index in range(batches):
        chunk = today.iloc[index * batch : (index + 1) * batch]
        if len(chunk) < batch:
            break
        frontier = int(chunk[EVENT_TIME_MS].max()) + 1
        rows = pd.concat([events(chunk, layout), tick(frontier, layout.card_buckets)], ignore_index=True)

        for name, chosen in layouts.items():
            started = time.process_time()
            released = [
                card_call(card_state[name][b], part.reset_index(drop=True), params, chosen, Timings("bench"))
                for b, part in rows.groupby(CARD_BUCKET)
            ]
            for b, part in pd.concat(released, ignore_index=True).groupby(TERMINAL_BUCKET):
                terminal_call(
                    terminal_state[name][b], part.reset_index(drop=True), params, chosen, Timings("bench")
                )
            runs[name].cpu_ms.append((time.process_time() - started) * 1000)

        started = time.process_time()
        released = []
        calls = runs[WHOLE].calls
        for b, part in rows.groupby(CARD_BUCKET):
            history_blob, pending_blob, old_frontier = whole_cards[b]
            stored = CardBucket(
                CardState.from_frame(from_blob(history_blob)), from_blob(pending_blob), old_frontier
            )
            after, out = card_stage(stored, part.reset_index(drop=True), params, layout.terminal_buckets)
            whole_cards[b] = (
                to_blob(after.history.to_frame(), ("card_id",)),
                to_blob(after.pending),
                after.frontier_ms,
            )
            calls["requests"] += 2
            calls["exchanges"] += 2
            calls["bytes"] += (
                len(history_blob) + len(pending_blob) + len(whole_cards[b][0]) + len(whole_cards[b][1])
            )
            released.append(out)
        for b, part in pd.concat(released, ignore_index=True).groupby(TERMINAL_BUCKET):
            transactions, labels = whole_terminals[b]
            state = TerminalState.from_frames(from_blob(transactions), from_blob(labels))
            state, _ = terminal_stage(state, part.reset_index(drop=True), params)
            frames = state.to_frames()
            whole_terminals[b] = (to_blob(frames[0], ("terminal_id",)), to_blob(frames[1], ("terminal_id",)))
            calls["requests"] += 2
            calls["exchanges"] += 2
            calls["bytes"] += len(transactions) + len(labels) + sum(len(blob) for blob in whole_terminals[b])
        runs[WHOLE].cpu_ms.append((time.process_time() - started) * 1000)
    for name in layouts:
        for variable in variables(name):
            runs[name].calls.update(variable.calls)
    runs["held"] = Run(
        calls=Counter({"transactions": len(history), "cards": int(history["card_id"].nunique())})
    )
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--customers", default="5000,50000", help="card counts, comma-separated")
    parser.add_argument(
        "--days", type=int, default=31, help="days simulated: all but the last are the history"
    )
    parser.add_argument("--batch", type=int, default=2000, help="transactions per micro-batch")
    parser.add_argument("--batches", type=int, default=10, help="micro-batches measured")
    parser.add_argument(
        "--page-bytes",
        default=f"{DEFAULT_PAGE_BYTES // 4},{DEFAULT_PAGE_BYTES},{DEFAULT_PAGE_BYTES * 4}",
        help="page sizes of the layouts compared, comma-separated",
    )
    parser.add_argument("--seed", type=int, default=0)
    report.add_flag(parser)
    args = parser.parse_args()

    rows = []
    for customers in (int(c) for c in args.customers.split(",")):
        page_bytes = [int(n) for n in args.page_bytes.split(",")]
        runs = measure(customers, args.days, args.batch, args.batches, args.seed, page_bytes)
        held = runs.pop("held").calls
        measured = len(runs[WHOLE].cpu_ms)
        for name, run in runs.items():
            per = {key: value / measured for key, value in run.calls.items()}
            rows.append(
                [
                    f"{held['cards']:,}",
                    f"{held['transactions'] / 1e6:.2f} M",
                    name,
                    f"{statistics.median(run.cpu_ms):,.0f}",
                    f"{per.get('requests', 0):,.0f}",
                    f"{per.get('exchanges', 0):,.0f}",
                    f"{per.get('bytes', 0) / 2**20:,.2f}",
                ]
            )
            print(" | ".join(rows[-1]), flush=True)
    table = report.Table(
        [
            "cards",
            "transactions held",
            "state kept as",
            "CPU ms per micro-batch (median)",
            "state requests per micro-batch",
            "round trips per micro-batch",
            "MiB moved per micro-batch",
        ],
        rows,
        caption=f"*Both stateful stages on micro-batches of {args.batch:,} transactions of the last simulated day, the state holding the days before*",
        notes=[
            "CPU: this process's CPU time for the two stages' calls of a micro-batch (decoding the state, the core, encoding it), median over the micro-batches measured. State requests: the gets, puts and removes the job sends Spark's state server (whose side is not in the CPU figure); round trips: the exchanges they go in (a batched call's requests go together, `infra/spark/internals.py`); MiB moved: the bytes they carry."
        ],
    )
    report.write_unless_skipped(
        args, "state", script=__file__, tables=[table], settings=report.args_settings(args)
    )


if __name__ == "__main__":
    main()
