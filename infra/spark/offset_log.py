"""What a streaming query's offset log says of its input: the connector's offsets and the frontier.

Spark keeps each micro-batch's end offsets in ``<checkpoint>/offsets/<batch>`` (``infra.spark.checkpoint``
reads it). Spark's Kafka connector writes ``{"topic": {"partition": offset}}``; the frontier source
(``infra.spark.frontier``) writes a :class:`Frontier`. Readers here: the frontier source itself,
savepoints, the state inspection, and the history check at a job's start.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from infra.kafka.offsets import NO_FRONTIER, parse_tp, tp_name
from infra.spark.checkpoint import (
    OFFSETS,
    batch_ids,
    last_committed,
    newest_batch,
    offset_entry,
    query_location,
)


@dataclass(frozen=True)
class Frontier:
    """The source's offset: the frontier and what it was computed from.

    ``kafka``: the connector's next offset of each partition, up to which the progress accounts for the
    records; ``batch``: the micro-batch of the query's offset log those offsets are from (-1: none of this
    query's); ``progress``: the timestamp of the last record read of each partition; ``frontier_ms``: F;
    ``final``: this frontier's micro-batch is the last of an ``availableNow`` run; ``planned``: how many
    frontiers the query has planned (each a new offset).
    """

    kafka: dict[str, int] = field(default_factory=dict)
    progress: dict[str, int] = field(default_factory=dict)
    frontier_ms: int = NO_FRONTIER
    final: bool = False
    planned: int = 0
    batch: int = -1

    def as_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def of_json(cls, raw: Mapping[str, Any]) -> Frontier:
        return cls(
            kafka={str(k): int(v) for k, v in raw.get("kafka", {}).items()},
            progress={str(k): int(v) for k, v in raw.get("progress", {}).items()},
            frontier_ms=int(raw.get("frontier_ms", NO_FRONTIER)),
            final=bool(raw.get("final", False)),
            planned=int(raw.get("planned", 0)),
            batch=int(raw.get("batch", -1)),
        )


def is_frontier(offset: object) -> bool:
    """Whether a source's offset in an offset log is this source's."""
    return isinstance(offset, dict) and "frontier_ms" in offset and "progress" in offset


@dataclass(frozen=True)
class LoggedBatch:
    """What the query's offset log says of one micro-batch: the connector's next offset of each partition
    and the batch's timestamp (Spark's clock when it planned it)."""

    batch: int
    kafka: dict[str, int]
    timestamp_ms: int


def first_logged_from(query_dir: Path, batch: int) -> int | None:
    """The first micro-batch of the offset log at or after ``batch`` (Spark removes the oldest entries)."""
    return min((found for found in batch_ids(query_dir, OFFSETS) if found >= batch), default=None)


def logged_batch(query_dir: Path, batch: int, topics: tuple[str, ...]) -> LoggedBatch:
    """Micro-batch ``batch`` of the offset log: the connector's offsets (``{"topic": {"partition":
    offset}}``) and the batch's timestamp."""
    entry = offset_entry(query_dir, batch)
    kafka: dict[str, int] = {}
    for offset in entry.sources:
        if isinstance(offset, dict) and offset and set(offset) <= set(topics):
            kafka = connector_offsets(offset)
    return LoggedBatch(batch, kafka, int(entry.metadata.get("batchTimestampMs", 0)))


@dataclass(frozen=True)
class Position:
    """Where a query's input stood at the end of a micro-batch: the connector's next offset of each partition
    (``topic/partition``) and the frontier (None for a query without a frontier source)."""

    offsets: dict[str, int]
    frontier: Frontier | None = None

    @property
    def frontier_ms(self) -> int | None:
        """The event-time frontier (None: before any event, or no frontier kept)."""
        if self.frontier is None or self.frontier.frontier_ms <= NO_FRONTIER:
            return None
        return self.frontier.frontier_ms

    @property
    def final(self) -> bool:
        """The micro-batch was the final one of an ``availableNow`` run: it released every event held."""
        return self.frontier is not None and self.frontier.final

    @property
    def topics(self) -> set[str]:
        return {parse_tp(name)[0] for name in self.offsets}


def position_at(query_dir: Path, batch: int) -> Position:
    """The position the query's micro-batch ``batch`` left its input at (its offset log's entry)."""
    offsets: dict[str, int] = {}
    frontier = None
    for offset in offset_entry(query_dir, batch).sources:
        if isinstance(offset, dict) and is_frontier(offset):
            frontier = Frontier.of_json(offset)
        elif isinstance(offset, dict):
            offsets |= connector_offsets(offset)
    return Position(offsets, frontier)


def connector_offsets(offset: object) -> dict[str, int]:
    """``topic/partition`` -> offset of the connector's ``{"topic": {"partition": offset}}`` (empty for any
    other source's offset)."""
    if not isinstance(offset, Mapping) or is_frontier(offset):
        return {}
    return {
        tp_name(topic, int(partition)): int(position)
        for topic, partitions in offset.items()
        if isinstance(partitions, dict)
        for partition, position in partitions.items()
    }


# --- a run that ends: what its connector read past the end was dropped, never consumed -------------------

#: In a job's checkpoint directory, beside its query: where the run of a time range that planned the query's
#: newest micro-batches ends, per partition (``topic/partition``).
ENDING_FILE = "input-end.json"


def record_ending(checkpoint: Path, ending: Mapping[str, int] | None) -> None:
    """Before a run starts: settle what an earlier run of a range left (:func:`settle_ending`), then record
    this run's end (None: a run without end records nothing)."""
    settle_ending(checkpoint)
    if ending is not None:
        checkpoint.mkdir(parents=True, exist_ok=True)
        written = checkpoint / f".{ENDING_FILE}.tmp"
        written.write_text(json.dumps(dict(sorted(ending.items()))) + "\n")
        written.replace(checkpoint / ENDING_FILE)


def settle_ending(checkpoint: Path) -> None:
    """After a run of a time range: its micro-batches read past the range's end and dropped those records
    (Spark's connector reads streams without end), so the query's newest offsets (its last committed
    micro-batch's, and any after it not committed) are cut back to the end: the next run reads those
    records, and a re-run micro-batch reads exactly the records its first run kept."""
    path = checkpoint / ENDING_FILE
    if not path.is_file():
        return
    ending = {str(name): int(offset) for name, offset in json.loads(path.read_text()).items()}
    query = query_location(checkpoint)
    newest = newest_batch(query)
    first = last_committed(query) or 0
    for batch in range(first, (newest if newest is not None else -1) + 1):
        _cut_to(query / OFFSETS / str(batch), ending)
    path.unlink()


def _cut_to(entry: Path, ending: Mapping[str, int]) -> None:
    """Cut the connector's offsets in an offset-log entry back to ``ending`` (its checksum file, which no
    longer matches, removed)."""
    if not entry.is_file():
        return
    lines = entry.read_text().splitlines()
    changed = False
    for index, line in enumerate(lines[2:], start=2):
        offset = json.loads(line) if line.strip() not in ("", "-") else None
        if not connector_offsets(offset) or not isinstance(offset, dict):
            continue
        cut = {
            topic: {
                partition: min(int(position), ending.get(tp_name(topic, int(partition)), int(position)))
                for partition, position in partitions.items()
            }
            for topic, partitions in offset.items()
        }
        if cut != offset:
            lines[index], changed = json.dumps(cut, separators=(",", ":")), True
    if changed:
        written = entry.with_name(f".{entry.name}.cut.tmp")
        written.write_text("\n".join(lines))
        written.replace(entry)
        entry.with_name(f".{entry.name}.crc").unlink(missing_ok=True)
