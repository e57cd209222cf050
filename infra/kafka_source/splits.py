"""The unit of work of the Kafka source: a topic-partition's offset range in one micro-batch."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pyspark.sql.datasource import InputPartition

from contracts.provenance import CopyFilter
from infra.kafka_source.offsets import tp_name


@dataclass(frozen=True)
class Split(InputPartition):
    """One topic-partition's offset range in one micro-batch, plus the batch's frontier.

    ``final``: the last micro-batch of an ``availableNow`` run (see the module docstring). ``copies``: the
    copy filter's marks at ``start`` as (writer, batch, position), in the filter's order
    (``contracts.provenance.CopyFilter``).
    """

    topic: str
    partition: int
    start: int
    end: int
    frontier_ms: int
    heartbeat: bool
    final: bool = False
    copies: tuple[tuple[str, int, int], ...] = ()
    #: The planner's clock when it planned the micro-batch (None: the source keeps no clock).
    clock_ms: int | None = None

    def copy_filter(self) -> CopyFilter:
        """A filter of this split's partition that judges its records as the planner did."""
        marks = {writer: (batch, seq) for writer, batch, seq in self.copies}
        return CopyFilter({tp_name(self.topic, self.partition): marks})


@dataclass(frozen=True)
class SplitGroup(InputPartition):
    """The splits one Spark task reads, one after another (option ``readTasks``)."""

    splits: tuple[Split, ...]


def group_splits(splits: Sequence[Split], tasks: int | None) -> list[SplitGroup]:
    """At most ``tasks`` groups (None: one per split). The i-th split goes to group i mod n: every
    partition of a topic lands in the same group in every micro-batch, and the groups of a topic's
    partitions (similar sizes, usually) are balanced."""
    n = len(splits) if tasks is None else max(1, min(tasks, len(splits)))
    return [SplitGroup(tuple(splits[i::n])) for i in range(n)]
