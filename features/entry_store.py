"""One bucket's state entries in a stateful stage: the entries a call touches, read and written one by one,
and the removal of entries whose history has ended.

A stage keeps, per bucket (its Spark grouping key), a map of entries (slot -> packed value,
``features.entries``) and an expiry index (hour -> the slots whose newest event time falls in it). A call
reads the entries of the slots it has events for, writes them back, and appends a slot to the index of its
newest hour when that hour changes. Once the bucket's clock (the newest event time it has processed) is
more than the stage's history past an hour, every entry listed under it whose newest time is still that
old holds nothing a future event can see: it is removed, with the hour's index. So idle cards and
terminals leave the state by event time, as a replay of the same events removes them.

The store is Spark's ``MapState`` behind a protocol of batched gets, puts and removes: a call's requests to
the JVM's state server go in a few exchanges, not a round trip per entry (``infra.spark.internals.PipelinedMap``).

Entries are stored as ASCII text. The state server sends each value it reads to Python pickled by Pyrolite,
which turns a binary value into a string one byte at a time: a 32 KiB page cost the JVM 450-700 µs to send,
an ASCII string of the same bytes 40-90 µs, and a micro-batch reads thousands of pages
(``docs/architecture.md``, state layout). The text holds seven bits a character (:func:`entry_text`), which
NumPy turns to and from bytes in a few operations on whole words: 30-35 µs each way for a 32 KiB page,
where base64 took 70-100 µs to encode and 150-200 µs to decode. That is this version's entry format
(:data:`ENTRY_FORMAT`), the one it reads: an entry stored otherwise, by an earlier version, is refused
(:class:`EarlierLayoutError`), as a checkpoint of an earlier layout is (``features.state_layout``).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from contracts.errors import StateError
from features.definitions import HOUR_MS

#: How this version stores an entry, as a layout records it (``features.entries.Layout.entry_format``):
#: seven-bit text (:func:`entry_text`).
ENTRY_FORMAT = 2
#: The last version of kappa-fraud that reads the earlier layouts (a value per bucket, an entry per slot,
#: pages stored as bytes or as base64) as well as this one: a commit of its repository.
LAST_READER_OF_EARLIER_LAYOUTS = "b398346"
#: How state kept in an earlier layout moves into this version's: the end of each refusal of it.
MOVE_EARLIER_STATE = (
    f"take a savepoint with kappa-fraud at commit {LAST_READER_OF_EARLIER_LAYOUTS} (the last version that "
    "reads both layouts: `fraud savepoint create features`, then `fraud features run --from-savepoint PATH "
    "--checkpoint NEW` there), or replay into a new checkpoint with `--from TIME`"
)


class EarlierLayoutError(StateError):
    """State kept in a layout of an earlier version (a checkpoint's, a savepoint's, an entry's): this version
    reads its own layout only."""


#: Schemas of the two maps (Spark DDL): slot -> packed entry (as text: :func:`entry_text`), hour -> the slots
#: listed under it.
ENTRY_KEY, ENTRY_VALUE = "slot bigint", "value string"
INDEX_KEY, INDEX_VALUE = "hour bigint", "slots binary"
_SLOTS = np.dtype("<i8")


class MapLike(Protocol):
    """What the store uses of a map state: gets, puts and removes of many keys at once
    (``infra.spark.internals.PipelinedMap`` for Spark's ``MapState``)."""

    def get_many(self, keys: Sequence[tuple[Any, ...]]) -> list[tuple[Any, ...] | None]: ...

    def update_many(self, items: Iterable[tuple[tuple[Any, ...], tuple[Any, ...]]]) -> None: ...

    def remove_many(self, keys: Iterable[tuple[Any, ...]]) -> None: ...


@dataclass(frozen=True)
class Clock:
    """A bucket's event-time clock: the newest event time it has processed (None: none yet) and the hours
    its expiry index lists entries under."""

    newest_ms: int | None
    hours: npt.NDArray[np.int64]

    @classmethod
    def start(cls) -> Clock:
        return cls(None, np.empty(0, dtype=np.int64))

    def advanced(self, times: npt.NDArray[np.int64]) -> Clock:
        """The clock after processing events at ``times``."""
        if len(times) == 0:
            return self
        newest = int(times.max())
        return Clock(newest if self.newest_ms is None else max(self.newest_ms, newest), self.hours)

    def horizon(self, history_ms: int) -> int | None:
        """Event times at or below this are behind every window a future event can have (None: no clock)."""
        return None if self.newest_ms is None else self.newest_ms - history_ms

    def hours_bytes(self) -> bytes:
        return self.hours.astype(_SLOTS).tobytes()

    @classmethod
    def of(cls, newest_ms: int | None, hours: bytes | None) -> Clock:
        return cls(newest_ms, np.frombuffer(hours or b"", dtype=_SLOTS).astype(np.int64))


@dataclass
class Written:
    """What a call wrote: each slot's packed value (None: removed) and its newest event time."""

    values: dict[int, bytes | None]
    newest: dict[int, int]


class EntryStore:
    """A bucket's entries and expiry index (see the module docstring)."""

    def __init__(self, entries: MapLike, index: MapLike) -> None:
        self.entries = entries
        self.index = index

    def read(self, slots: Iterable[int]) -> dict[int, bytes]:
        """The stored values of ``slots`` (slots without an entry are left out)."""
        keys = [int(slot) for slot in slots]
        values = self.entries.get_many([(slot,) for slot in keys])
        return {
            slot: entry_bytes(value[0]) for slot, value in zip(keys, values, strict=True) if value is not None
        }

    def write(self, clock: Clock, written: Written, newest_before: Mapping[int, int]) -> Clock:
        """Store ``written`` (``newest_before``: the newest time of each slot's value as it was read; a slot
        not there had no entry) and list each slot whose newest hour changed under its new hour."""
        listed: dict[int, list[int]] = defaultdict(list)
        updates, removed = [], []
        for slot, value in written.values.items():
            if value is None:
                if slot in newest_before:
                    removed.append((slot,))
                continue
            updates.append(((slot,), (entry_text(value),)))
            hour = written.newest[slot] // HOUR_MS
            before = newest_before.get(slot)
            if before is None or before // HOUR_MS != hour:
                listed[hour].append(slot)
        self.entries.update_many(updates)
        self.entries.remove_many(removed)
        hours = sorted(listed)
        stored = self.index.get_many([(hour,) for hour in hours])
        self.index.update_many(
            ((hour,), (np.concatenate([_slots_of(old), np.asarray(listed[hour], dtype=_SLOTS)]).tobytes(),))
            for hour, old in zip(hours, stored, strict=True)
        )
        merged = np.union1d(clock.hours, np.asarray(hours, dtype=np.int64))
        return Clock(clock.newest_ms, merged.astype(np.int64))

    def expire(
        self,
        clock: Clock,
        horizon: int | None,
        newest_of: Callable[[bytes], int],
        written: Iterable[int] = (),
    ) -> tuple[Clock, int]:
        """Remove the entries whose newest event time is at or below ``horizon``, found through the index
        hours wholly at or below it (``written``: slots this call wrote, which hold newer events).

        Returns:
            The clock without those hours, and how many entries were removed.
        """
        if horizon is None:
            return clock, 0
        due = clock.hours[(clock.hours + 1) * HOUR_MS - 1 <= horizon].tolist()
        if not due:
            return clock, 0
        fresh = set(written)
        listed = self.index.get_many([(hour,) for hour in due])
        candidates = sorted({slot for value in listed for slot in _slots_of(value).tolist()} - fresh)
        values = self.entries.get_many([(slot,) for slot in candidates])
        expired = [
            (slot,)
            for slot, value in zip(candidates, values, strict=True)
            if value is not None and newest_of(entry_bytes(value[0])) <= horizon
        ]
        self.entries.remove_many(expired)
        self.index.remove_many([(hour,) for hour in due])
        return Clock(clock.newest_ms, np.setdiff1d(clock.hours, due).astype(np.int64)), len(expired)


# An entry's text: its bytes padded with zeros to whole groups of 56 (seven little-endian words), each group
# 64 characters: the low seven bits of its 56 bytes, one character each, then 8 characters holding their
# high bits (character k's bit j: the high bit of byte k of word j). A first character gives the padding.
# So a text is 1 + 64n characters long (base64, which an earlier version wrote, is a multiple of 4).

_WORD = np.dtype("<u8")
_GROUP_BYTES = 56
_LOW_BITS = np.uint64(0x7F7F7F7F7F7F7F7F)
_HIGH_BIT = np.uint64(0x0101010101010101)  # of each byte, once shifted down by 7
_SEVEN = np.uint64(7)
_WORD_OF_GROUP = np.arange(7, dtype=np.uint64)
_BIT_OF_WORD = np.uint64(1) << _WORD_OF_GROUP


def entry_text(value: bytes) -> str:
    """An entry's packed bytes as the text the store keeps: ASCII, seven bits a character (above)."""
    fill = -len(value) % _GROUP_BYTES
    words = np.frombuffer(value + bytes(fill) if fill else value, _WORD).reshape(-1, 7)
    groups = np.empty((len(words), 8), dtype=_WORD)
    np.bitwise_and(words, _LOW_BITS, out=groups[:, :7])
    groups[:, 7] = ((words >> _SEVEN) & _HIGH_BIT) @ _BIT_OF_WORD
    return chr(fill) + groups.tobytes().decode("ascii")


def entry_bytes(stored: str | bytes) -> bytes:
    """An entry's packed bytes from the text the store keeps (:func:`entry_text`).

    Raises:
        EarlierLayoutError: the entry is stored otherwise (bytes, or base64 text), as earlier versions did.
    """
    if not isinstance(stored, str) or len(stored) % 64 != 1:
        raise EarlierLayoutError(
            f"a state entry is not stored as seven-bit text: the state was kept by an earlier version; "
            f"{MOVE_EARLIER_STATE}"
        )
    groups = np.frombuffer(stored[1:].encode("ascii"), _WORD).reshape(-1, 8)
    words = ((groups[:, 7:] >> _WORD_OF_GROUP) & _HIGH_BIT) << _SEVEN
    words |= groups[:, :7]
    value = words.astype(_WORD, copy=False).tobytes()
    return value[: len(value) - ord(stored[0])]


def _slots_of(value: tuple[Any, ...] | None) -> npt.NDArray[np.int64]:
    """The slots an index value lists."""
    return np.frombuffer(value[0], dtype=_SLOTS) if value is not None else np.empty(0, dtype=_SLOTS)
