"""The feature job's state as many small entries: which entry holds a card or a terminal, and each entry's
value as bytes.

Each stateful stage keeps its state per bucket (a Spark grouping key: few, so Python is called a few times
per micro-batch) and, inside a bucket, as entries of a map keyed by *page*: a card's or terminal's slot is a
second hash route, and a page is a range of slots whose cards' (terminals') history is kept in one entry. A
micro-batch reads, steps and writes only the pages of the cards and terminals it has events for, so its
cost follows the batch, not the number of cards the job holds (``docs/architecture.md``, state layout).

Pages follow the state's size: a bucket starts as one page, and a page whose packed value would pass the
layout's page size is cut, at slot boundaries, into pages of about half of it (:class:`Pages`). Each entry
read or written is a request to the JVM's state server, which costs about as much as moving 25 KB, so a
page holds as much history as a request costs: with few cards a micro-batch touches a few pages holding
all of them, with many it touches one small page per card it has events for.

Routing: one 32-bit hash ``h`` per card (the first 8 hex digits of its token, which are uniform) or
terminal (CRC-32 of its id); the bucket is ``h % buckets`` and the slot ``(h // buckets) % slots``, so the
slots of one bucket are spread evenly whatever the two counts are.

Values are packed by hand (a short header, then NumPy arrays as raw bytes): a micro-batch decodes
thousands of entries, and one ``frombuffer`` per array costs microseconds where an Arrow IPC stream costs
tens. Entries are written in a canonical order (by key, then time), so equal state gives equal bytes.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt
import pandas as pd

from contracts.arrays import IntArray
from contracts.settings import DEFAULT_BUCKETS, DEFAULT_PAGE_BYTES, DEFAULT_SLOTS
from features.buckets import card_hash, terminal_hash
from features.core import KeyArray
from features.entry_store import ENTRY_FORMAT, Written


def route_hashes(ids: pd.Series | npt.NDArray[Any], hash_of: Callable[[str], int]) -> IntArray:
    """The routing hash of each id, hashing each distinct id once."""
    values = ids.to_numpy() if isinstance(ids, pd.Series) else ids
    if len(values) == 0:
        return np.empty(0, dtype=np.int64)
    codes, uniques = pd.factorize(values, use_na_sentinel=False)
    table = np.fromiter((hash_of(str(key)) for key in uniques), dtype=np.int64, count=len(uniques))
    return table[codes]


@dataclass(frozen=True)
class Layout:
    """What routes events to state: the buckets (Spark keys) of each stage, the slots in each bucket, and the
    size past which a page of slots is cut (:class:`Pages`); and how entries are stored (:data:`ENTRY_FORMAT`).
    The buckets, slots and format are fixed for the life of a checkpoint (``features.state_layout``); a
    savepoint moves state between them (``features.rescale``). The page size may change from one run to the
    next (:attr:`TUNABLE`): it only decides where pages are cut from then on, never where a card's history
    is found, and pages are never merged."""

    #: The fields a checkpoint takes a new value of on a restart.
    TUNABLE: ClassVar[tuple[str, ...]] = ("page_bytes",)

    card_buckets: int = DEFAULT_BUCKETS
    terminal_buckets: int = DEFAULT_BUCKETS
    card_slots: int = DEFAULT_SLOTS
    terminal_slots: int = DEFAULT_SLOTS
    page_bytes: int = DEFAULT_PAGE_BYTES
    entry_format: int = ENTRY_FORMAT

    def as_record(self) -> dict[str, int]:
        """The layout as a checkpoint records it."""
        return asdict(self)

    def card_slots_of(self, card_ids: pd.Series | npt.NDArray[Any]) -> IntArray:
        return (route_hashes(card_ids, card_hash) // self.card_buckets) % self.card_slots

    def terminal_slots_of(self, terminal_ids: pd.Series | npt.NDArray[Any]) -> IntArray:
        return (route_hashes(terminal_ids, terminal_hash) // self.terminal_buckets) % self.terminal_slots


# --- packing ------------------------------------------------------------------------------------------

_HEADER = struct.Struct("<IIIq")
_COUNT = np.dtype("<u4")
_LENGTH = np.dtype("<u2")
#: A card history row: time, tx id, amount in cents.
CARD_ROW = np.dtype([("time", "<i8"), ("tx_id", "<i8"), ("cents", "<i8")])
#: A terminal transaction row: its time.
TERMINAL_TX_ROW = np.dtype([("time", "<i8")])
#: A terminal label row: tx id, tx time, known at, is fraud.
LABEL_ROW = np.dtype([("tx_id", "<i8"), ("tx_time", "<i8"), ("known_at", "<i8"), ("is_fraud", "u1")])
NO_ROW = np.dtype([("time", "<i8")])
_STARTS = np.dtype("<i8")


SlotsOf = Callable[[npt.NDArray[Any]], IntArray]


@dataclass(frozen=True)
class Rows:
    """Rows to pack, already in a structured dtype: each row's entry key (``slots``: a slot, a page once
    :meth:`in_pages`), its key (card or terminal) as a code into ``keys``, the distinct keys, so that what is
    done per key (routing, encoding, sorting) is done once per key, not per row; and the field that dates a
    row (for an entry's newest time)."""

    slots: IntArray
    codes: IntArray
    keys: npt.NDArray[Any]
    rows: npt.NDArray[np.void]
    time_field: str

    @classmethod
    def none(cls) -> Rows:
        empty = np.empty(0, dtype=np.int64)
        return cls(empty, empty, np.empty(0, dtype=object), np.empty(0, dtype=NO_ROW), "time")

    @classmethod
    def keyed(cls, keys: KeyArray, rows: npt.NDArray[np.void], time_field: str, slots_of: SlotsOf) -> Rows:
        """Rows whose key is given per row (``keys``), routed by ``slots_of`` (distinct keys -> slots)."""
        return cls(*coded(keys, slots_of), rows, time_field)

    def where(self, mine: npt.NDArray[np.bool_]) -> Rows:
        return Rows(self.slots[mine], self.codes[mine], self.keys, _rows_at(self.rows, mine), self.time_field)

    def newer_than(self, horizon: int | None) -> Rows:
        """The rows dated after ``horizon`` (None: all)."""
        if horizon is None:
            return self
        newer = self.rows[self.time_field] > horizon
        return self if newer.all() else self.where(newer)

    def plus(self, other: Rows) -> Rows:
        """These rows and ``other``'s (of the same dtype)."""
        if not len(other.rows):
            return self
        if not len(self.rows):
            return other
        return Rows(
            np.concatenate([self.slots, other.slots]),
            np.concatenate([self.codes, other.codes + len(self.keys)]),
            np.concatenate([self.keys, other.keys]),
            np.concatenate([self.rows, other.rows]),
            self.time_field,
        )

    def of_pages(self, pages: Pages, chosen: IntArray) -> Rows:
        """The rows in the pages ``chosen`` (their first slots)."""
        return self.where(np.isin(pages.page_of(self.slots), chosen))

    def in_pages(self, pages: Pages) -> Rows:
        """The rows keyed by the page of their slot (what :func:`pack_entries` packs them by)."""
        return replace(self, slots=pages.page_of(self.slots))


def _rows_at(rows: npt.NDArray[np.void], at: npt.NDArray[Any]) -> npt.NDArray[np.void]:
    """``rows[at]`` (``at``: a mask or positions), copied as rows of bytes: NumPy indexes a structured array
    field by field, item by item, several times slower."""
    positions = np.flatnonzero(at) if at.dtype == np.bool_ else at
    as_bytes = np.ascontiguousarray(rows).view(np.uint8).reshape(len(rows), rows.dtype.itemsize)
    return np.take(as_bytes, positions, axis=0).reshape(-1).view(rows.dtype)


def coded(keys: KeyArray, slots_of: SlotsOf) -> tuple[IntArray, IntArray, npt.NDArray[Any]]:
    """Per key of ``keys``: its slot and its code in the distinct keys; and the distinct keys, each routed
    once by ``slots_of`` (of a categorical's keys, those that occur)."""
    if isinstance(keys, pd.Categorical) and not (keys.codes < 0).any():  # the keys' table is there
        codes, distinct = keys.codes.astype(np.int64), keys.categories.to_numpy(dtype=object)
        used = np.bincount(codes, minlength=len(distinct)) > 0
        table = np.zeros(len(distinct), dtype=np.int64)
        if used.any():
            table[used] = slots_of(distinct[used])
        return table[codes], codes, distinct
    codes, distinct = pd.factorize(np.asarray(keys, dtype=object), use_na_sentinel=False)
    distinct = np.asarray(distinct, dtype=object)
    slots = slots_of(distinct)[codes] if len(distinct) else np.empty(0, dtype=np.int64)
    return slots.astype(np.int64), codes.astype(np.int64), distinct


def _joint_codes(first: Rows, second: Rows) -> tuple[IntArray, IntArray, npt.NDArray[Any]]:
    """The codes of both rows' keys in one table of their distinct keys, sorted (so that codes order as
    keys do): per distinct key, not per row."""
    table_codes, keys = _sorted_factorize(np.concatenate([first.keys, second.keys]).astype(object))
    code_a = table_codes[: len(first.keys)][first.codes]
    code_b = table_codes[len(first.keys) :][second.codes]
    return code_a, code_b, keys


def _sorted_factorize(values: npt.NDArray[Any]) -> tuple[IntArray, npt.NDArray[Any]]:
    """``pd.factorize(values, sort=True)``: the values factorized once, then their distinct values ranked.
    Keys that are all strings are ranked as a NumPy string array, as Python orders them (no key holds a NUL:
    ``contracts.events.TERMINAL_ID_PATTERN``), in a third of the time pandas takes to sort objects (40,000
    terminal ids: 12 ms against 35); other keys as pandas ranks them."""
    codes, distinct = pd.factorize(values, use_na_sentinel=False)
    if pd.api.types.infer_dtype(distinct, skipna=False) == "string":
        rank = np.empty(len(distinct), dtype=np.int64)
        rank[np.argsort(distinct.astype(str))] = np.arange(len(distinct))
    else:
        rank = pd.factorize(distinct, sort=True, use_na_sentinel=False)[0].astype(np.int64)
    ordered = np.empty(len(distinct), dtype=object)
    ordered[rank] = distinct
    return rank[codes], ordered


def pack_entries(first: Rows, second: Rows) -> tuple[dict[int, bytes], dict[int, int]]:
    """Each entry of the rows (by their ``slots``: the entry keys, pages in the job): its keys, then per key
    its first and second rows (sorted by key, then by their fields), as bytes; and each entry's newest time.
    All entries at once: one sort, then a slice per entry.

    Layout of an entry: a header (keys, first rows, second rows: three uint32; the newest time: int64),
    the keys (uint16 lengths, then their UTF-8 bytes), per key the count of first rows and of second rows
    (uint32), the first rows, the second rows (raw structured arrays, little-endian)."""
    code_a, code_b, keys = _joint_codes(first, second)
    sorted_a = _sorted_rows(first, code_a)
    sorted_b = _sorted_rows(second, code_b)
    n_keys = len(keys)
    pairs_a = first.slots[sorted_a] * n_keys + code_a[sorted_a]
    pairs_b = second.slots[sorted_b] * n_keys + code_b[sorted_b]
    # Both are sorted: their distinct pairs are runs, joined per pair, not per row.
    (runs_a, rows_per_a), (runs_b, rows_per_b) = _runs(pairs_a), _runs(pairs_b)
    pairs = np.union1d(runs_a, runs_b)
    count_a = np.zeros(len(pairs), dtype=_COUNT)
    count_a[np.searchsorted(pairs, runs_a)] = rows_per_a
    count_b = np.zeros(len(pairs), dtype=_COUNT)
    count_b[np.searchsorted(pairs, runs_b)] = rows_per_b
    pair_slot, pair_code = pairs // max(n_keys, 1), pairs % max(n_keys, 1)
    encoded = [str(key).encode() for key in keys]
    lengths = np.fromiter((len(e) for e in encoded), dtype=_LENGTH, count=len(encoded))
    rows_a, rows_b = _rows_at(first.rows, sorted_a), _rows_at(second.rows, sorted_b)
    slot_a, slot_b = first.slots[sorted_a], second.slots[sorted_b]
    time_a, time_b = rows_a[first.time_field], rows_b[second.time_field]

    # Each entry's pairs, first rows and second rows are contiguous runs: their bounds found at once.
    new_slot = np.ones(len(pairs), dtype=bool)
    new_slot[1:] = pair_slot[1:] != pair_slot[:-1]
    starts = np.flatnonzero(new_slot)
    slots = pair_slot[starts]
    a_from, a_to = np.searchsorted(slot_a, slots), np.searchsorted(slot_a, slots + 1)
    b_from, b_to = np.searchsorted(slot_b, slots), np.searchsorted(slot_b, slots + 1)
    newest_times = np.maximum(_run_max(time_a, a_from, a_to), _run_max(time_b, b_from, b_to))
    pair_lengths = lengths[pair_code]
    pair_keys = [encoded[code] for code in pair_code.tolist()]
    values = {}
    bounds = zip(
        slots.tolist(),
        starts.tolist(),
        [*starts[1:].tolist(), len(pairs)][: len(starts)],
        a_from.tolist(),
        a_to.tolist(),
        b_from.tolist(),
        b_to.tolist(),
        newest_times.tolist(),
        strict=True,
    )
    for slot, start, end, a0, a1, b0, b1, newest_time in bounds:
        values[slot] = b"".join(
            [
                _HEADER.pack(end - start, a1 - a0, b1 - b0, newest_time),
                pair_lengths[start:end].tobytes(),
                *pair_keys[start:end],
                count_a[start:end].tobytes(),
                count_b[start:end].tobytes(),
                rows_a[a0:a1].tobytes(),
                rows_b[b0:b1].tobytes(),
            ]
        )
    return values, dict(zip(slots.tolist(), newest_times.tolist(), strict=True))


def _runs(ordered: IntArray) -> tuple[IntArray, IntArray]:
    """The distinct values of a sorted array, and how many times each occurs."""
    if not len(ordered):
        return ordered, np.empty(0, dtype=np.int64)
    new = np.ones(len(ordered), dtype=bool)
    new[1:] = ordered[1:] != ordered[:-1]
    starts = np.flatnonzero(new)
    return ordered[starts], np.diff(np.append(starts, len(ordered)))


def _run_max(times: npt.NDArray[Any], froms: IntArray, tos: IntArray) -> IntArray:
    """The newest of ``times`` in each run ``[froms[i], tos[i])`` (0 for an empty run); the runs are
    contiguous and ascending, covering ``times``."""
    newest_times = np.zeros(len(froms), dtype=np.int64)
    filled = tos > froms
    if filled.any():
        newest_times[filled] = np.maximum.reduceat(times.astype(np.int64), froms[filled])
    return newest_times


@dataclass(frozen=True, eq=False)
class Pages:
    """A bucket's pages: the first slot of each, ascending from 0; a page holds the slots up to the next one's
    first. Kept in the bucket's value; an entry is keyed by its page's first slot.

    Pages are cut, never merged: a page cut when its history grew holds about half a page once its cards
    come and go (new cards hash evenly over the slots), so the directory follows the history's size, up to
    a page per slot. Where a page is cut depends only on the rows it holds when written, so a replay of the
    same events cuts the same pages.
    """

    starts: IntArray

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Pages) and np.array_equal(self.starts, other.starts)

    __hash__ = None  # type: ignore[assignment]

    @classmethod
    def one(cls) -> Pages:
        """A bucket's pages before it holds anything: one page of every slot."""
        return cls(np.zeros(1, dtype=np.int64))

    @classmethod
    def of_bytes(cls, blob: bytes | None) -> Pages:
        return cls(np.frombuffer(blob, dtype=_STARTS).astype(np.int64)) if blob else cls.one()

    def as_bytes(self) -> bytes:
        return self.starts.astype(_STARTS).tobytes()

    def page_of(self, slots: IntArray) -> IntArray:
        """The page (its first slot) that holds each of ``slots``."""
        return self.starts[np.searchsorted(self.starts, slots, side="right") - 1]

    def cut(self, first: Rows, second: Rows, page_bytes: int) -> Pages:
        """These pages with each page whose rows (of ``first`` and ``second``) pack to more than
        ``page_bytes`` cut into pages of about half of it, at slot boundaries (a slot is never cut)."""
        slots, sizes = _slot_sizes(first, second)
        if not len(slots):
            return self
        pages = self.page_of(slots)
        _, inverse = np.unique(pages, return_inverse=True)
        totals = np.bincount(inverse, weights=sizes) + _HEADER.size
        half = max(page_bytes // 2, 1)
        cuts = []
        for page in np.flatnonzero(totals > page_bytes).tolist():
            mine = inverse == page
            before = np.cumsum(sizes[mine]) - sizes[mine]
            part = before // half
            cuts.append(slots[mine][1:][part[1:] != part[:-1]])
        if not cuts:
            return self
        return Pages(np.union1d(self.starts, np.concatenate(cuts)).astype(np.int64))


def _slot_sizes(first: Rows, second: Rows) -> tuple[IntArray, npt.NDArray[np.float64]]:
    """The slots that ``first`` and ``second`` have rows in, ascending, and the bytes each adds to its
    entry's value (:func:`pack_entries`): its rows, and per key its length, its bytes and two counts."""
    code_a, code_b, keys = _joint_codes(first, second)
    codes = np.concatenate([code_a, code_b])
    slots = np.concatenate([first.slots, second.slots]).astype(np.int64)
    per_key = np.fromiter(
        (_LENGTH.itemsize + len(str(key).encode()) + 2 * _COUNT.itemsize for key in keys),
        dtype=np.float64,
        count=len(keys),
    )
    n_keys = max(len(keys), 1)
    pairs = np.unique(slots * n_keys + codes)
    pair_slots, pair_codes = pairs // n_keys, pairs % n_keys
    row_bytes = np.concatenate(
        [np.full(len(first.slots), first.rows.itemsize), np.full(len(second.slots), second.rows.itemsize)]
    ).astype(np.float64)
    unique_slots, inverse = np.unique(np.concatenate([slots, pair_slots]), return_inverse=True)
    sizes = np.bincount(inverse, weights=np.concatenate([row_bytes, per_key[pair_codes]]))
    return unique_slots.astype(np.int64), sizes.astype(np.float64)


def paged_entries(
    first: Rows, second: Rows, pages: Pages, page_bytes: int, read: Mapping[int, bytes]
) -> tuple[Written, Pages]:
    """The entries of a call's rows, by page (pages cut first where they grew past ``page_bytes``), and the
    pages; the pages ``read`` that hold no rows any more, removed."""
    packed, newest_times = pack_entries(first.in_pages(pages), second.in_pages(pages))
    full = np.asarray([page for page, value in packed.items() if len(value) > page_bytes], dtype=np.int64)
    if len(full):
        cut = pages.cut(first.of_pages(pages, full), second.of_pages(pages, full), page_bytes)
        if cut != pages:
            pages = cut
            packed, newest_times = pack_entries(first.in_pages(pages), second.in_pages(pages))
    values: dict[int, bytes | None] = dict.fromkeys(read)
    values.update(packed)
    return Written(values, newest_times), pages


#: Bits of the first field's span (from its least value) that :func:`_sorted_rows` packs below the rank of
#: a row's slot and key: 139 years of milliseconds.
_FIELD_BITS = 42


def _slot_key_rank(slots: IntArray, codes: IntArray) -> IntArray:
    """The rank of each row's (slot, key) pair. A key is routed to one slot, so the pairs are ranked per key,
    not per row (rows whose key has several slots are ranked per row)."""
    key_slots = np.zeros(int(codes.max()) + 1, dtype=np.int64)
    key_slots[codes] = slots
    if not np.array_equal(key_slots[codes], slots):
        return np.unique(slots * len(key_slots) + codes, return_inverse=True)[1].astype(np.int64)
    by_slot = np.lexsort((np.arange(len(key_slots)), key_slots))
    key_rank = np.empty(len(key_slots), dtype=np.int64)
    key_rank[by_slot] = np.arange(len(key_slots))
    return key_rank[codes]


def _sorted_rows(rows: Rows, codes: IntArray) -> IntArray:
    """The order of rows by slot, key, then their fields (the canonical order of an entry).

    One sort of an int64 that packs the rank of (slot, key) above the first field where both fit, as event
    times do, then the rows that tie on it sorted by the other fields; ``np.lexsort`` over every field
    (several times slower) where they do not fit."""
    names = rows.rows.dtype.names or ()
    if len(rows.slots) and names:
        rank = _slot_key_rank(rows.slots, codes)
        first = rows.rows[names[0]].astype(np.int64)
        span = first - first.min()
        if int(rank.max()) < 2 ** (63 - _FIELD_BITS) and int(span.max()) < 2**_FIELD_BITS:
            packed = (rank.astype(np.int64) << _FIELD_BITS) | span
            order = np.argsort(packed, kind="stable")
            ordered = packed[order]
            tie = ordered[1:] == ordered[:-1]
            if len(names) > 1 and tie.any():
                tied = np.zeros(len(order), dtype=bool)
                tied[1:] |= tie
                tied[:-1] |= tie
                at = np.flatnonzero(tied)
                rest = [rows.rows[name][order[at]] for name in reversed(names[1:])]
                order[at] = order[at][np.lexsort((*rest, ordered[at]))]
            return order
    fields = [rows.rows[name] for name in reversed(names)]
    return np.lexsort((*fields, codes, rows.slots))


@dataclass(frozen=True)
class Held:
    """The rows of many entries as read (:func:`unpack_entries`): the entries' keys, each once, and per row
    its key's code in them, so that a call can tell the rows of the keys it has events for from the others
    per key, not per row, and carry the others to the entries it writes without turning them into rows of
    objects."""

    keys: npt.NDArray[Any]
    first_codes: IntArray
    first: npt.NDArray[np.void]
    second_codes: IntArray
    second: npt.NDArray[np.void]

    def keys_in(self, wanted: npt.NDArray[Any] | pd.Series) -> npt.NDArray[np.bool_]:
        """Which of the held keys are among ``wanted``."""
        return pd.Series(self.keys, dtype=object).isin(pd.unique(np.asarray(wanted, dtype=object))).to_numpy()

    def of_keys(self, mine: npt.NDArray[np.bool_]) -> Held:
        """The rows of the keys marked in ``mine`` (one flag per held key)."""
        a, b = mine[self.first_codes], mine[self.second_codes]
        return Held(
            self.keys,
            self.first_codes[a],
            _rows_at(self.first, a),
            self.second_codes[b],
            _rows_at(self.second, b),
        )

    def first_rows(self, slots: IntArray, time_field: str) -> Rows:
        """The first rows to pack again, ``slots`` being the slot of each held key."""
        return Rows(slots[self.first_codes], self.first_codes, self.keys, self.first, time_field)

    def second_rows(self, slots: IntArray, time_field: str) -> Rows:
        """The second rows to pack again, ``slots`` being the slot of each held key."""
        return Rows(slots[self.second_codes], self.second_codes, self.keys, self.second, time_field)

    def first_keys(self) -> pd.Categorical:
        """The key of each first row, as codes into the held keys."""
        return pd.Categorical.from_codes(self.first_codes, categories=self.keys, validate=False)

    def second_keys(self) -> pd.Categorical:
        """The key of each second row, as codes into the held keys."""
        return pd.Categorical.from_codes(self.second_codes, categories=self.keys, validate=False)


def unpack_entries(
    blobs: Iterable[bytes], first: np.dtype[np.void], second: np.dtype[np.void]
) -> tuple[Held, list[int]]:
    """The rows of many entries (:func:`pack_entries`), and each entry's newest time. Per entry only its
    header and keys are read; its counts and rows are cut out as bytes and decoded with all the others."""
    keys: list[str] = []
    parts: dict[str, list[bytes]] = {"count_a": [], "count_b": [], "a": [], "b": []}
    newest_times = []
    for blob in blobs:
        n_keys, n_a, n_b, newest_time = _HEADER.unpack_from(blob)
        newest_times.append(newest_time)
        at = _HEADER.size
        lengths = np.frombuffer(blob, _LENGTH, n_keys, at).tolist()
        at += n_keys * _LENGTH.itemsize
        for length in lengths:
            keys.append(blob[at : at + length].decode())
            at += length
        for name, size in (("count_a", n_keys * _COUNT.itemsize), ("count_b", n_keys * _COUNT.itemsize)):
            parts[name].append(blob[at : at + size])
            at += size
        parts["a"].append(blob[at : at + n_a * first.itemsize])
        parts["b"].append(blob[at + n_a * first.itemsize : at + n_a * first.itemsize + n_b * second.itemsize])

    def joined(name: str, dtype: np.dtype[Any]) -> npt.NDArray[Any]:
        return np.frombuffer(bytearray(b"".join(parts[name])), dtype=dtype)

    codes = np.arange(len(keys), dtype=np.int64)
    held = Held(
        np.asarray(keys, dtype=object),
        np.repeat(codes, joined("count_a", _COUNT)),
        joined("a", first),
        np.repeat(codes, joined("count_b", _COUNT)),
        joined("b", second),
    )
    return held, newest_times


def newest_of_entry(blob: bytes) -> int:
    """The newest time of one entry (from its header)."""
    return int(_HEADER.unpack_from(blob)[3])
