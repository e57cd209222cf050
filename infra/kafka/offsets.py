"""The source's offsets as its checkpoints keep them: topic-partitions named ``topic/partition``, and the
frontier before any event (without Spark: the stages' pure cores read these too)."""

from __future__ import annotations

#: A frontier before any event: nothing is complete yet.
NO_FRONTIER = -(2**62)


def tp_name(topic: str, partition: int) -> str:
    return f"{topic}/{partition}"


def parse_tp(name: str) -> tuple[str, int]:
    topic, _, partition = name.rpartition("/")
    return topic, int(partition)
