"""The state entries of the stateful stages: routing to buckets and slots, packing, and the store that reads,
writes and expires them (with dictionaries for Spark's map state)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from features.buckets import card_bucket, terminal_buckets
from features.core import CardState, TerminalState
from features.definitions import HOUR_MS
from features.entries import (
    Layout,
    Rows,
    card_entries,
    card_rows,
    newest_of_entry,
    pack_entries,
    route_hashes,
    terminal_hash,
    terminal_rows,
    unpack_cards,
    unpack_terminals,
)
from features.entry_store import Clock, EntryStore, Written
from tests.support.state_vars import Map

T0 = 1_522_540_800_000
RNG = np.random.default_rng(3)
CARDS = np.asarray(
    [f"{RNG.integers(0, 2**63):016x}{RNG.integers(0, 2**63):016x}" for _ in range(400)], dtype=object
)


def cards_state(cards: np.ndarray, rows_each: int = 3) -> CardState:
    ids = np.repeat(cards, rows_each)
    n = len(ids)
    return CardState(
        ids, T0 + RNG.integers(0, 10**9, n), np.arange(n, dtype=np.int64), RNG.integers(0, 10**6, n)
    )


def pack_cards(state: CardState) -> bytes:
    """The state as one entry."""
    (value,) = pack_entries(card_rows(state, np.zeros(len(state), dtype=np.int64)), Rows.none())[0].values()
    return value


def rows_of(state: CardState) -> set[tuple[object, ...]]:
    return set(zip(state.card_id, state.event_time_ms, state.tx_id, state.amount_cents, strict=True))


def test_a_card_entrys_rows_come_back_whole_and_its_bytes_do_not_depend_on_row_order() -> None:
    state = cards_state(CARDS[:5])
    shuffled = np.random.default_rng(1).permutation(len(state))
    reordered = CardState(
        *(getattr(state, f)[shuffled] for f in ("card_id", "event_time_ms", "tx_id", "amount_cents"))
    )
    assert pack_cards(state) == pack_cards(reordered)
    other = cards_state(CARDS[5:6])
    back, newest = unpack_cards([pack_cards(state), pack_cards(other)])
    assert rows_of(back) == rows_of(state) | rows_of(other)
    assert newest == [int(state.event_time_ms.max()), int(other.event_time_ms.max())]
    assert back.card_id.dtype == object and isinstance(back.card_id[0], str)


def test_a_terminal_entrys_transactions_and_labels_come_back_whole() -> None:
    terminals = np.asarray(["t1", "términal 2", "t1", "x"], dtype=object)
    state = TerminalState(
        terminals,
        np.asarray([T0, T0 + 5, T0 + 9, T0 + 2]),
        np.asarray(["t1", "y", "y"], dtype=object),  # labels of a terminal without transactions too
        np.asarray([10, 11, 12]),
        np.asarray([T0 - 5, T0 + 50, T0 + 1]),
        np.asarray([T0 + 1, T0 + 60, T0 + 2]),
        np.asarray([True, False, True]),
    )
    slots = (
        np.zeros(len(state.terminal_id), dtype=np.int64),
        np.zeros(len(state.label_tx_id), dtype=np.int64),
    )
    (value,) = pack_entries(*terminal_rows(state, *slots))[0].values()
    (back, newest) = unpack_terminals([value])
    assert newest_of_entry(value) == T0 + 50
    assert sorted(zip(back.terminal_id, back.event_time_ms, strict=True)) == sorted(
        zip(state.terminal_id, state.event_time_ms, strict=True)
    )
    label_fields = (
        "label_terminal_id",
        "label_tx_id",
        "label_tx_time_ms",
        "label_known_at_ms",
        "label_is_fraud",
    )
    assert sorted(zip(*(getattr(back, f) for f in label_fields), strict=True)) == sorted(
        zip(*(getattr(state, f) for f in label_fields), strict=True)
    )
    assert newest == [T0 + 50]  # a label's transaction time counts


def test_entries_route_by_the_buckets_hash_and_spread_over_every_slot() -> None:
    layout = Layout(card_buckets=6, terminal_buckets=6, card_slots=8, terminal_slots=8)
    slots = layout.card_slots_of(CARDS)
    buckets = np.asarray([card_bucket(card, 6) for card in CARDS])
    for b in range(6):
        assert set(slots[buckets == b].tolist()) == set(range(8)), "every slot of every bucket is used"
    terminals = pd.Series([f"terminal-{i}" for i in range(400)])
    assert (route_hashes(terminals, terminal_hash) % 6 == terminal_buckets(terminals, 6)).all()
    assert set(layout.terminal_slots_of(terminals).tolist()) == set(range(8))


def test_a_calls_entries_keep_only_history_newer_than_the_horizon_and_remove_emptied_ones() -> None:
    layout = Layout(card_slots=16)
    history = cards_state(CARDS[:40])
    read = {slot: b"" for slot in range(16)}
    horizon = int(np.median(history.event_time_ms))
    written = card_entries(history, layout, horizon, read)
    kept, _ = unpack_cards(value for value in written.values.values() if value is not None)
    assert rows_of(kept) == {row for row in rows_of(history) if row[1] > horizon}
    emptied = [slot for slot, value in written.values.items() if value is None]
    assert set(emptied) == set(range(16)) - set(layout.card_slots_of(kept.card_id).tolist())


def test_the_store_expires_an_entry_once_its_newest_event_is_behind_the_horizon_and_only_then() -> None:
    """Entries are listed under the hour of their newest event; an hour wholly behind the horizon is
    expired, but an entry written again since (a newer hour) stays."""
    entries, index = Map(), Map()
    store = EntryStore(entries, index)
    newest = {1: T0 + 10, 2: T0 + 20, 3: T0 + 2 * HOUR_MS}
    blobs = {
        slot: pack_cards(
            CardState(np.asarray(["c"], dtype=object), np.asarray([t]), np.asarray([slot]), np.asarray([1]))
        )
        for slot, t in newest.items()
    }

    def newest_of(blob: bytes) -> int:
        return unpack_cards([blob])[1][0]

    clock = store.write(
        Clock.start().advanced(np.asarray(list(newest.values()))), Written(dict(blobs), dict(newest)), {}
    )
    assert len(index) == 2  # two hours: slots 1 and 2, slot 3
    # Slot 2 gets a newer event: listed under its new hour too.
    later = T0 + 3 * HOUR_MS
    blobs[2] = pack_cards(
        CardState(np.asarray(["c"], dtype=object), np.asarray([later]), np.asarray([9]), np.asarray([1]))
    )
    clock = store.write(
        clock.advanced(np.asarray([later])), Written({2: blobs[2]}, {2: later}), {2: newest[2]}
    )
    clock, removed = store.expire(clock, T0 + HOUR_MS, newest_of)
    assert removed == 1 and set(entries) == {(2,), (3,)}
    clock, removed = store.expire(clock, T0 + HOUR_MS, newest_of)
    assert removed == 0, "an hour is expired once"
    clock, removed = store.expire(clock, later + HOUR_MS, newest_of)
    assert removed == 2 and not entries and not index and len(clock.hours) == 0
