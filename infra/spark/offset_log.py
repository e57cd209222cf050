"""What a streaming query's offset log says of its input: the connector's offsets and the frontier.

Spark keeps each micro-batch's end offsets in ``<checkpoint>/offsets/<batch>`` (``infra.spark.checkpoint``
reads it). Spark's Kafka connector writes ``{"topic": {"partition": offset}}``; the frontier source
(``infra.spark.frontier``) writes a :class:`FrontierPlan`, what the frontier of the micro-batch is computed
from once the connector's offsets of the same batch are in the log. The frontier it computes is kept beside
the query, per micro-batch (:data:`FRONTIER_FILE`). Readers here: the frontier source itself, savepoints, the
state inspection, the metrics, and the history check at a job's start.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from contracts.errors import StateError
from infra.kafka.offsets import NO_FRONTIER, parse_tp, tp_name
from infra.spark.checkpoint import (
    OFFSETS,
    batch_ids,
    last_committed,
    newest_batch,
    offset_entry,
    query_location,
    replace_text,
)


@dataclass(frozen=True)
class Frontier:
    """The frontier after a micro-batch and what it was computed from.

    ``kafka``: the connector's next offset of each partition, up to which the progress accounts for the
    records; ``batch``: the micro-batch of the query's offset log those offsets are from (-1: none of this
    query's); ``progress``: the timestamp of the last record read of each partition; ``frontier_ms``: F;
    ``final``: this frontier's micro-batch is the last of an ``availableNow`` run; ``planned``: how many
    frontiers the query has planned (each a move of F or of its final mark).
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


@dataclass(frozen=True)
class FrontierPlan:
    """The frontier source's offset: what the frontier of micro-batch ``batch`` is computed from, together
    with the connector's offsets of the same batch (the offset log's entry ``batch``) and the records they
    end at. Fixed when the offset log's entry is written, so a micro-batch re-run computes the same frontier.

    ``after``: the frontier before the batch (after the last one that planned a frontier); ``batch``: the
    micro-batch planned (-1: a new query's start, which plans none); ``stable``: each partition's last stable
    offset when the batch was planned (a partition the connector's offsets leave short of it holds records
    still to read); ``ending``: a range's end instead (records past it are not read); ``available_now``: an
    ``availableNow`` run planned the batch (it may be the run's final one).
    """

    after: Frontier = field(default_factory=Frontier)
    batch: int = -1
    stable: dict[str, int] = field(default_factory=dict)
    ending: dict[str, int] | None = None
    available_now: bool = False

    def as_json(self) -> dict[str, Any]:
        return {**asdict(self), "after": self.after.as_json()}

    @classmethod
    def of_json(cls, raw: Mapping[str, Any]) -> FrontierPlan:
        ending = raw.get("ending")
        return cls(
            after=Frontier.of_json(raw.get("after", {})),
            batch=int(raw.get("batch", -1)),
            stable={str(k): int(v) for k, v in raw.get("stable", {}).items()},
            ending=None if ending is None else {str(k): int(v) for k, v in ending.items()},
            available_now=bool(raw.get("available_now", False)),
        )


def is_frontier(offset: object) -> bool:
    """Whether a source's offset in an offset log is the frontier source's: a :class:`FrontierPlan`, or a
    :class:`Frontier` itself, as the source wrote it before it computed each micro-batch's frontier from the
    batch's own offsets (a topic's offset is a map of partitions, never a number)."""
    if not isinstance(offset, dict):
        return False
    if is_plan(offset):
        return True
    return isinstance(offset.get("frontier_ms"), int) and isinstance(offset.get("progress"), dict)


def is_plan(offset: object) -> bool:
    """Whether a source's offset is a :class:`FrontierPlan` (not an earlier version's :class:`Frontier`)."""
    return (
        isinstance(offset, dict)
        and isinstance(offset.get("after"), dict)
        and "frontier_ms" in offset["after"]
    )


# --- the frontiers the source computed, per micro-batch ---------------------------------------------------

#: In a job's checkpoint directory, beside its query: the frontier each micro-batch of the newest ones
#: planned (a JSON object, batch id -> :class:`Frontier`), written before the batch reads its records.
FRONTIER_FILE = "frontiers.json"
#: How many micro-batches' frontiers the file keeps (the newest).
FRONTIERS_KEPT = 30


def frontier_file(query_dir: Path) -> Path:
    """Where the frontiers of the query checkpointed at ``query_dir`` are kept."""
    return query_dir.parent / FRONTIER_FILE


def planned_frontiers(query_dir: Path) -> dict[int, Frontier]:
    """The frontiers kept, by micro-batch (empty: none yet)."""
    path = frontier_file(query_dir)
    if not path.is_file():
        return {}
    return {int(batch): Frontier.of_json(raw) for batch, raw in json.loads(path.read_text()).items()}


def record_frontier(query_dir: Path, batch: int, frontier: Frontier) -> None:
    """Keep ``frontier`` as micro-batch ``batch``'s (replacing what an earlier attempt of it kept, and the
    frontiers of later batches: an attempt of ``batch`` is the newest the query planned)."""
    kept = {b: f for b, f in planned_frontiers(query_dir).items() if b < batch}
    kept[batch] = frontier
    newest = sorted(kept)[-FRONTIERS_KEPT:]
    text = json.dumps({str(b): kept[b].as_json() for b in newest}, separators=(",", ":"))
    replace_text(frontier_file(query_dir), text + "\n")


def frontier_after(query_dir: Path, batch: int, offsets: tuple[Any, ...] | list[Any]) -> Frontier | None:
    """The frontier after micro-batch ``batch``, whose offset-log entry holds the sources' ``offsets``: the
    one its frontier source computed (kept beside the query), or, in a checkpoint of an earlier version, the
    one its offset holds (None: a query without a frontier source)."""
    offset = next((o for o in offsets if is_frontier(o)), None)
    if offset is None:
        return None
    if not is_plan(offset):
        return Frontier.of_json(offset)
    kept = planned_frontiers(query_dir)
    # A batch that did not move the frontier source's offset kept none: the frontier is the last batch's.
    newest = max((b for b in kept if b <= batch), default=None)
    if newest is not None:
        return kept[newest]
    # Not kept (gone with a copy's files): the frontier before the batch, behind the one after it, never ahead.
    return FrontierPlan.of_json(offset).after


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
    """The position the query's micro-batch ``batch`` left its input at (its offset log's entry, and the
    frontier its frontier source computed)."""
    sources = logged_offsets(query_dir, batch)
    offsets: dict[str, int] = {}
    for offset in sources:
        offsets |= connector_offsets(offset)
    return Position(offsets, frontier_after(query_dir, batch, sources))


def frontier_ms_at(query_dir: Path, batch: int) -> int | None:
    """The event-time frontier after micro-batch ``batch`` (None: before any event, no frontier kept, or the
    batch's offset-log entry is gone)."""
    try:
        return position_at(query_dir, batch).frontier_ms
    except (OSError, ValueError, StateError):
        return None


def logged_offsets(query_dir: Path, batch: int) -> list[Any]:
    """The sources' offsets in micro-batch ``batch``'s offset-log entry (None for a source without one)."""
    return list(offset_entry(query_dir, batch).sources)


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
