"""Spark's value and map state variables as dictionaries: for the unit tests of the stages' state calls
(``features.stateful``, ``features.entry_store``), which use three methods of each."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any


class Value:
    """A bucket's value, as Spark's ``ValueState`` keeps it."""

    def __init__(self) -> None:
        self.value: tuple[Any, ...] | None = None

    def get(self) -> tuple[Any, ...] | None:
        return self.value

    def update(self, newValue: tuple[Any, ...]) -> None:
        self.value = newValue


class Map(dict[tuple[Any, ...], tuple[Any, ...]]):
    """A bucket's map, as Spark's ``MapState`` keeps it (values are tuples), with the batched calls of
    ``infra.spark.internals.PipelinedMap``."""

    def get_many(self, keys: Sequence[tuple[Any, ...]]) -> list[tuple[Any, ...] | None]:
        return [self.get(key) for key in keys]

    def update_many(self, items: Iterable[tuple[tuple[Any, ...], tuple[Any, ...]]]) -> None:
        self.update(items)

    def remove_many(self, keys: Iterable[tuple[Any, ...]]) -> None:
        for key in keys:
            del self[key]

    def getValue(self, key: tuple[Any, ...]) -> tuple[Any, ...] | None:
        return self.get(key)

    def updateValue(self, key: tuple, value: tuple[Any, ...]) -> None:
        self[key] = value

    def removeKey(self, key: tuple[Any, ...]) -> None:
        del self[key]
