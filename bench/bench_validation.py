"""Validation in the stream jobs, end to end: the feature job's first stage (``features.decode.decode``:
transactions topic records -> event rows and dead rows) and the scoring job's check of feature records
(``scoring.core.Scorer.valid``), each on Arrow batches of 10,000 records as a Spark task gets them, on
clean records and with ``--dirty`` of them damaged (a wrong type, an extra field, an unknown schema
version, malformed JSON); and ``parse_event`` alone, the pydantic validation both stages run per record,
beside pydantic's batch validation (``TypeAdapter(list[TransactionEvent]).validate_json`` over a batch's
records joined into one array, ``parse_event`` per record when the batch holds a bad one). The jobs do not
use the batch form: a record that is not one JSON value (``{..},{..}``) would shift every record after it.

Simulates transactions (seed 0), builds their wire JSON as ingest does and their feature records as the
feature job writes them, takes the first ``--records`` and times each variant, best of ``--repeats``
rounds (the variants take turns, and CPU time of this process is measured: a shared machine's load moves
wall-clock times a lot). Prints CPU microseconds per record and writes them to the ``validation`` section
of docs/benchmarks.md; nothing is asserted.

Run: .venv/bin/python bench/bench_validation.py [--records 100000] [--repeats 3] [--dirty 0.01] [--no-report]
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Callable, Sequence
from functools import partial

import pyarrow as pa
import report
from pydantic import TypeAdapter, ValidationError

from contracts.events import DeadLetter, TransactionEvent, TxColumns
from contracts.settings import Topics
from features.batch import transactions_features
from features.decode import DecodeOptions, decode
from features.definitions import FeatureParams
from features.records import feature_record_values
from features.rows import LATE
from infra.spark.kafka_sink.records import SinkRows
from ingest.files import clean_table
from ingest.produce import events_from_table
from ingest.simulator import SimulatorConfig, simulate
from ingest.tokens import card_token
from scoring.core import Scorer
from validation.parse import parse_event

MAX_BYTES = 16_384
#: Records in one Arrow batch, as a Spark task hands them to Python.
BATCH_ROWS = 10_000
#: The simulation the records come from.
SIMULATION = SimulatorConfig(customers=2000, terminals=4000, days=60, seed=0)
TOPICS = Topics()
#: Damage done to a record: (what, replaced by), one picked at random per damaged record.
EDITS = [
    (b'"tx_id":', b'"tx_id":"'),  # malformed
    (b'"amount":', b'"amount":"1",  "x":'),  # wrong type, extra field
    (b'"schema_version":1', b'"schema_version":2'),
    (b'"card_id":', b'"card_id":1,"y":'),
]


def _best(runs: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """The least CPU time of each run over ``repeats`` rounds (interleaved, so that they share the load)."""
    best = dict.fromkeys(runs, float("inf"))
    for _ in range(repeats):
        for name, run in runs.items():
            started = time.process_time()
            run()
            best[name] = min(best[name], time.process_time() - started)
    return best


def _damage(values: list[bytes], fraction: float, seed: int) -> list[bytes]:
    rng = random.Random(seed)
    damaged = list(values)
    for i in rng.sample(range(len(values)), int(len(values) * fraction)):
        old, new = rng.choice(EDITS)
        damaged[i] = values[i].replace(old, new, 1)
    return damaged


def _batch_json(adapter: TypeAdapter[list[TransactionEvent]], values: Sequence[bytes]) -> object:
    """pydantic's validation of ``values`` as one JSON array; each record alone when one is not valid."""
    try:
        return adapter.validate_json(b"[" + b",".join(values) + b"]")
    except ValidationError:
        return [parse_event(TransactionEvent, raw, "kafka:bench", MAX_BYTES, 0, 0) for raw in values]


def _parse_each(values: Sequence[bytes]) -> list[TransactionEvent | DeadLetter]:
    return [parse_event(TransactionEvent, raw, "kafka:bench", MAX_BYTES, 0, 0) for raw in values]


def _batch_json_each(adapter: TypeAdapter[list[TransactionEvent]], values: Sequence[bytes]) -> list[object]:
    return [
        _batch_json(adapter, values[start : start + BATCH_ROWS])
        for start in range(0, len(values), BATCH_ROWS)
    ]


def _decode_each(batches: list[pa.RecordBatch], options: DecodeOptions) -> list[pa.RecordBatch]:
    return [decode(batch, options) for batch in batches]


def _check_each(scorer: Scorer, batches: list[pa.RecordBatch]) -> list[object]:
    return [list(scorer.valid(batch, SinkRows())) for batch in batches]


def _batches(values: Sequence[bytes], topic: str) -> list[pa.RecordBatch]:
    """``values`` as the records of ``topic``, in Arrow batches of ``BATCH_ROWS`` (the connector's columns)."""
    batches = []
    for start in range(0, len(values), BATCH_ROWS):
        chunk = values[start : start + BATCH_ROWS]
        batches.append(
            pa.RecordBatch.from_pydict(
                {
                    "topic": pa.array([topic] * len(chunk)),
                    "partition": pa.array([0] * len(chunk), pa.int32()),
                    "offset": pa.array(range(start, start + len(chunk)), pa.int64()),
                    "value": pa.array(chunk, pa.binary()),
                }
            )
        )
    return batches


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--records", type=int, default=100_000, help="records of each kind to validate")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs of each variant (best is shown)")
    parser.add_argument("--dirty", type=float, default=0.01, help="fraction damaged in the dirty runs")
    report.add_flag(parser)
    args = parser.parse_args()

    params = FeatureParams()
    frame = simulate(SIMULATION)
    wire = events_from_table(clean_table(frame, "bench"), "bench", b"bench", params.label_delay_ms, MAX_BYTES)
    transactions = wire.tx_values[: args.records]
    computed = transactions_features(frame, "bench", params, MAX_BYTES)
    rows = computed.transactions.merge(computed.features, on=TxColumns.TX_ID).iloc[: args.records]
    rows[TxColumns.CARD_ID] = [
        card_token(card, b"bench") for card in rows[TxColumns.CARD_ID]
    ]  # as ingest does
    records = feature_record_values(rows.assign(**{LATE: False}).reset_index(drop=True), params)
    feature_records = records.to_pylist()
    if min(len(transactions), len(feature_records)) < args.records:
        raise SystemExit(f"the simulation gave only {len(transactions):,} transactions")
    sizes = {
        "transactions": sum(map(len, transactions)) / len(transactions),
        "feature records": sum(map(len, feature_records)) / len(feature_records),
    }
    print(", ".join(f"{kind}: {size:.0f} bytes each on average" for kind, size in sizes.items()))

    options = DecodeOptions(TOPICS.transactions, TOPICS.labels, 8, MAX_BYTES)
    scorer = Scorer(tracking_uri="unused", version=1, topics=TOPICS, max_event_bytes=MAX_BYTES)
    adapter = TypeAdapter(list[TransactionEvent])
    runs: dict[str, Callable[[], object]] = {}
    for kind, damage in (("clean", 0.0), (f"{args.dirty:.0%} dirty", args.dirty)):
        tx = _damage(transactions, damage, seed=1)
        tx_batches = _batches(tx, TOPICS.transactions)
        feature_batches = _batches(_damage(feature_records, damage, seed=2), TOPICS.features)
        runs[f"parse_event, transactions, {kind}"] = partial(_parse_each, tx)
        runs[f"TypeAdapter(list), transactions, {kind}"] = partial(_batch_json_each, adapter, tx)
        runs[f"feature job decode, {kind}"] = partial(_decode_each, tx_batches, options)
        runs[f"scoring job check, {kind}"] = partial(_check_each, scorer, feature_batches)
    results = _best(runs, args.repeats)

    header = ["variant (CPU time, best of the rounds)", "seconds", "records/s", "µs a record"]
    rows = [
        [name, seconds, args.records / seconds, seconds / args.records * 1e6]
        for name, seconds in results.items()
    ]
    print(f"{header[0]:44} {header[1]:>8} {header[2]:>12} {header[3]:>12}")
    for name, seconds, rate, micros in rows:
        print(f"{name:44} {seconds:8.3f} {rate:12,.0f} {micros:12.2f}")
    table = report.Table(
        header,
        [[name, f"{seconds:.3f}", f"{rate:,.0f}", f"{micros:.2f}"] for name, seconds, rate, micros in rows],
        notes=[
            f"{args.records:,} records of each kind, in batches of {BATCH_ROWS:,}; "
            + ", ".join(f"{kind} {size:.0f} bytes each on average" for kind, size in sizes.items())
            + "."
        ],
    )
    settings = {
        "records": args.records,
        "batch_rows": BATCH_ROWS,
        "repeats": args.repeats,
        "dirty": args.dirty,
        **{f"simulation.{k}": v for k, v in SIMULATION.model_dump(mode="json").items()},
        "pyarrow": pa.__version__,
    }
    report.write_unless_skipped(args, "validation", script=__file__, tables=[table], settings=settings)


if __name__ == "__main__":
    main()
