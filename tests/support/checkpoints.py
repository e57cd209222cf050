"""A job's checkpoint directory laid out as Spark 4 and the jobs write it, without Spark: for the unit tests
of savepoints. Its files hold placeholders, except those the savepoints read (offsets, operator metadata,
the jobs' JSON files)."""

from __future__ import annotations

import io
import json
import struct
import zipfile
from pathlib import Path

from features.compat import SPECS_FILE, spec_record
from features.definitions import DEFAULT_PARAMS
from features.entries import Layout
from features.state_layout import LAYOUT_FILE
from infra.spark.checkpoint import LZ4_MAGIC, QUERY_DIR
from infra.spark.offset_log import Frontier, FrontierPlan, Position, record_frontier

#: The layout of this version's checkpoints by default.
LAYOUT = Layout().as_record()
TOPICS = ("transactions", "labels")
SCHEMA = "0_432b40a5-b4d6-4dfc-b357-231239527084"
IN_FLIGHT_SCHEMA = "5_9f1e7c52-5cf7-4e1c-9d38-6a1b2c3d4e5f"


#: An LZ4 block stored raw (not compressed).
RAW = 0x10


def lz4_stream(*blocks: bytes) -> bytes:
    """Spark's LZ4 block stream of raw blocks, ended by the empty block ``finish()`` writes (the shape of a
    state store changelog)."""
    out = b"".join(LZ4_MAGIC + struct.pack("<Biii", RAW, len(b), len(b), 0) + b for b in blocks)
    return out + LZ4_MAGIC + struct.pack("<Biii", RAW, 0, 0, 0)


def a_zip(**files: str) -> bytes:
    """A zip archive of ``files`` (the shape of a RocksDB state store snapshot)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, text in files.items():
            archive.writestr(name, text)
    return buffer.getvalue()


CHANGES = lz4_stream(b"changes")


def position(batch: int) -> Position:
    """Where a batch leaves the feature job's input: 100 records a partition a batch, the frontier one
    millisecond further each batch."""
    offsets = {f"{topic}/{p}": 100 * (batch + 1) for topic in TOPICS for p in range(2)}
    frontier = Frontier(dict(offsets), {}, 1_525_000_000_000 + batch, planned=batch + 1, batch=batch)
    return Position(offsets, frontier)


def end_offsets(batch: int) -> list[dict[str, object]]:
    """A batch's end offsets as the offset log holds them, a line each: Spark's Kafka connector's, then the
    frontier source's (what its frontier is computed from: the frontier before it, the partitions' ends)."""
    connector: dict[str, dict[str, int]] = {}
    for name, offset in position(batch).offsets.items():
        topic, _, partition = name.rpartition("/")
        connector.setdefault(topic, {})[partition] = offset
    before = position(batch - 1).frontier if batch > 0 else Frontier()
    plan = FrontierPlan(before or Frontier(), batch, dict(position(batch).offsets))
    return [connector, plan.as_json()]


def _write(path: Path, text: str | bytes, crc: bool = True) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    if crc:
        path.with_name(f".{path.name}.crc").write_bytes(b"crc")


def spark_checkpoint(
    checkpoint: Path, committed: int = 4, in_flight: bool = True, layout: dict[str, int] | None = None
) -> Path:
    """A feature job's checkpoint whose query committed batches 0 to ``committed``; with ``in_flight``, the
    next batch has started (its offsets, operator metadata, schema and some state are written, its commit
    is not). Two stateful operators of two partitions, a RocksDB snapshot at version 1 and changelogs."""
    query = checkpoint / QUERY_DIR
    _write(query / "metadata", '{"id":"cbb19ccf-f66f-47b9-8211-72812a495d02"}')
    last = committed + 1 if in_flight else committed
    for batch in range(last + 1):
        conf = {"spark.sql.shuffle.partitions": "2"}
        meta = json.dumps({"batchWatermarkMs": 0, "batchTimestampMs": 1_795_686_700_821, "conf": conf})
        lines = "\n".join(json.dumps(line) for line in end_offsets(batch))
        _write(query / "offsets" / str(batch), f"v1\n{meta}\n{lines}")
        if batch <= committed:
            _write(query / "commits" / str(batch), 'v1\n{"nextBatchWatermarkMs":0}')
        frontier = position(batch).frontier
        if frontier is not None:  # the frontier source computed it when the batch was planned
            record_frontier(query, batch, frontier)
    for op in (0, 1):
        state = query / "state" / str(op)
        schema = state / "_stateSchema" / "default"
        schemas = [SCHEMA] + ([IN_FLIGHT_SCHEMA] if in_flight else [])
        for name in schemas:
            _write(schema / name, b"\x00v3 schema")
            batch = int(name.split("_")[0])
            metadata = {
                "operatorInfo": {"operatorId": op, "operatorName": "transformWithStateInPandasExec"},
                "stateStoreInfo": [
                    {
                        "storeName": "default",
                        "numColsPrefixKey": 0,
                        "numPartitions": 2,
                        "stateSchemaFilePaths": [f"file:{(schema / name).resolve()}"],
                    }
                ],
                "operatorPropertiesJson": "{}",
            }
            _write(state / "_metadata" / "v2" / str(batch), f"v2\n{json.dumps(metadata)}")
        for partition in (0, 1):
            store = state / str(partition)
            (store / "_metadata").mkdir(parents=True, exist_ok=True)
            _write(store / "1.zip", a_zip(metadata="{}"))
            _write(store / "SSTs" / "000008-7b504904-48d2-4daa-b671-5814d46fb27b.sst", b"sst")
            for version in range(1, last + 2):  # version v is written by batch v - 1
                _write(store / f"{version}.changelog", CHANGES)
            _write(store / f".{last + 2}.changelog.0e7a.tmp", b"being written", crc=False)
    _write(checkpoint / LAYOUT_FILE, json.dumps(layout or LAYOUT), crc=False)
    _write(checkpoint / SPECS_FILE, json.dumps(spec_record(DEFAULT_PARAMS)), crc=False)
    _write(checkpoint / "model-versions.json", json.dumps({str(b): 1 for b in range(last + 1)}), crc=False)
    _write(checkpoint / "pinned.json", json.dumps({"write_tasks": 2}), crc=False)
    _write(checkpoint / "fraud-sink-features.id", "features-eceee0f65654", crc=False)
    _write(checkpoint / "scored-at.tmp", "{}", crc=False)
    return checkpoint
