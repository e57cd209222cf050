"""The state entries of the stateful stages: routing to buckets and slots, packing, and the store that reads,
writes and expires them (with dictionaries for Spark's map state)."""

from __future__ import annotations

import binascii

import numpy as np
import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

from features.bucket_entries import (
    card_entries,
    card_rows,
    card_state,
    read_cards,
    read_terminals,
    terminal_entries,
    terminal_rows,
    terminal_state,
    unpack_cards,
    unpack_terminals,
)
from features.buckets import card_bucket, terminal_buckets
from features.core import CardState, TerminalState
from features.definitions import HOUR_MS
from features.entries import (
    CARD_ROW,
    Layout,
    Pages,
    Rows,
    _sorted_factorize,
    _sorted_rows,
    newest_of_entry,
    pack_entries,
    route_hashes,
    terminal_hash,
)
from features.entry_store import (
    LAST_READER_OF_EARLIER_LAYOUTS,
    Clock,
    EarlierLayoutError,
    EntryStore,
    Written,
    entry_bytes,
    entry_text,
)
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


def one_slot(keys: np.ndarray) -> np.ndarray:
    return np.zeros(len(keys), dtype=np.int64)


def pack_cards(state: CardState) -> bytes:
    """The state as one entry."""
    (value,) = pack_entries(card_rows(state, one_slot), Rows.none())[0].values()
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
    (value,) = pack_entries(*terminal_rows(state, one_slot))[0].values()
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
    a_page_a_slot = Pages(np.arange(16))
    written, pages = card_entries(history, layout, a_page_a_slot, horizon, read)
    assert pages == a_page_a_slot, "nothing to cut: a few cards a page"
    kept, _ = unpack_cards(value for value in written.values.values() if value is not None)
    assert rows_of(kept) == {row for row in rows_of(history) if row[1] > horizon}
    emptied = [slot for slot, value in written.values.items() if value is None]
    assert set(emptied) == set(range(16)) - set(layout.card_slots_of(kept.card_id).tolist())


def test_a_page_that_grows_past_the_page_size_is_cut_at_slots_into_pages_of_about_half_of_it() -> None:
    """400 cards of 3 rows (24 bytes each) and a 3,000-byte page: the bucket's one page is cut so that every
    page but a one-slot page packs to at most the page size, most to about half of it; each card's rows land
    in the page of its slot, and cutting again changes nothing."""
    layout = Layout(card_slots=1024, page_bytes=3_000)
    history = cards_state(CARDS)
    written, pages = card_entries(history, layout, Pages.one(), None, {})
    assert pages.starts[0] == 0 and (np.diff(pages.starts) > 0).all()
    sizes = {page: len(value) for page, value in written.values.items() if value is not None}
    assert set(sizes) <= set(pages.starts.tolist()) and len(sizes) > 1
    assert max(sizes.values()) <= 3_000
    assert np.median(list(sizes.values())) <= 0.75 * 3_000
    for page, value in written.values.items():
        assert value is not None
        cards, _ = unpack_cards([value])
        assert (pages.page_of(layout.card_slots_of(cards.card_id)) == page).all()
    again, pages_again = card_entries(history, layout, pages, None, written.values)
    assert pages_again == pages and again.values == written.values
    whole, _ = unpack_cards(value for value in written.values.values() if value is not None)
    assert rows_of(whole) == rows_of(history)


def test_a_slot_is_never_cut_however_large_and_pages_are_kept_as_bytes() -> None:
    layout = Layout(card_slots=4, page_bytes=100)
    history = cards_state(CARDS[:40], rows_each=10)
    written, pages = card_entries(history, layout, Pages.one(), None, {})
    slots = set(layout.card_slots_of(history.card_id).tolist())
    assert set(pages.starts.tolist()) <= {0, *slots} and len(written.values) == len(slots)
    assert Pages.of_bytes(pages.as_bytes()) == pages and Pages.of_bytes(None) == Pages.one()


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


def test_the_store_keeps_entries_as_ascii_text_and_refuses_them_as_earlier_versions_stored_them() -> None:
    """Spark's state server sends text to Python far faster than bytes: entries are stored as ASCII, seven
    bits a character; the base64 and the bytes earlier versions stored are refused, saying how to move them
    (never misread)."""
    entries = Map()
    store = EntryStore(entries, Map())
    packed = {1: bytes(range(256)) * 3, 2: b"", 3: b"\x00\xff" * 5}
    store.write(
        Clock.start().advanced(np.asarray([T0])), Written(dict(packed), dict.fromkeys(packed, T0)), {}
    )

    assert all(isinstance(value, str) and value.isascii() for (value,) in entries.values())
    assert store.read([1, 2, 3, 4]) == packed
    earlier = [
        b"\x00\x01",
        *(binascii.b2a_base64(value, newline=False).decode() for value in packed.values()),
    ]
    for value in earlier:
        with pytest.raises(
            EarlierLayoutError, match=f"commit {LAST_READER_OF_EARLIER_LAYOUTS} .*--from TIME"
        ):
            entry_bytes(value)


@given(st.binary(max_size=400))
def test_an_entry_as_text_is_ascii_and_reads_back_byte_for_byte(value: bytes) -> None:
    text = entry_text(value)

    assert text.isascii()
    assert entry_bytes(text) == value
    assert len(text) % 64 == 1  # never base64, a multiple of 4


def test_entries_are_packed_in_one_canonical_order_whether_rows_tie_on_their_first_field_or_not() -> None:
    """Rows sorted by slot, key, then each field, as ``np.lexsort`` orders them: with distinct times (one
    sort of a packed key) and with times that tie (the sort over every field)."""
    rng = np.random.default_rng(4)
    for times in (T0 + rng.permutation(3_000), T0 + rng.integers(0, 50, 3_000)):
        rows = np.empty(3_000, dtype=CARD_ROW)
        rows["time"], rows["tx_id"], rows["cents"] = times, rng.permutation(3_000), rng.integers(0, 9, 3_000)
        keys = rng.choice(CARDS[:50], 3_000)
        slots = rng.integers(0, 7, 3_000)
        codes, table = pd.factorize(keys, sort=True)
        codes = codes.astype(np.int64)
        expected = np.lexsort((rows["cents"], rows["tx_id"], rows["time"], codes, slots))
        order = _sorted_rows(Rows(slots, codes, table, rows, "time"), codes)
        assert (order == expected).all()


@given(
    st.one_of(
        st.lists(st.text(st.characters(blacklist_characters="\x00"), max_size=6), max_size=40),
        st.lists(st.integers(-50, 50), max_size=40),
    )
)
def test_keys_are_coded_in_the_order_python_sorts_them_strings_or_not(keys: list[object]) -> None:
    values = np.asarray(keys, dtype=object)
    codes, distinct = _sorted_factorize(values)
    expected_codes, expected = pd.factorize(values, sort=True)

    assert list(distinct) == list(expected) == sorted(set(keys))
    assert (codes == expected_codes).all()


def test_rows_carried_as_read_write_the_entries_their_whole_history_writes() -> None:
    """A call hands the core only the history of the cards (terminals) it has events for and carries the
    others' rows as read: what it writes is what the whole history, decoded, would write."""
    layout = Layout(card_slots=64, terminal_slots=64, page_bytes=2_000)
    history = cards_state(CARDS[:120], rows_each=4)
    written, pages = card_entries(history, layout, Pages.one(), None, {})
    stored = {page: value for page, value in written.values.items() if value is not None}
    held, _ = read_cards(stored.values())
    theirs = held.keys_in(CARDS[:7])
    horizon = int(np.quantile(history.event_time_ms, 0.3))
    whole = card_entries(card_state(held), layout, pages, horizon, stored)
    carried = card_entries(
        card_state(held.of_keys(theirs)), layout, pages, horizon, stored, held.of_keys(~theirs)
    )
    assert carried == whole and theirs.sum() == 7

    rng = np.random.default_rng(5)
    terminals = TerminalState(
        np.asarray([f"t{i % 50}" for i in range(600)], dtype=object),
        T0 + rng.integers(0, 10**9, 600),
        np.asarray([f"t{i % 40}" for i in range(90)], dtype=object),
        np.arange(90, dtype=np.int64),
        T0 + rng.integers(0, 10**9, 90),
        T0 + 10**9 + rng.integers(0, 10**6, 90),
        rng.integers(0, 2, 90).astype(bool),
    )
    written, pages = terminal_entries(terminals, layout, Pages.one(), None, {})
    stored = {page: value for page, value in written.values.items() if value is not None}
    held, _ = read_terminals(stored.values())
    theirs = held.keys_in(np.asarray(["t3", "t17", "t45"], dtype=object))
    whole = terminal_entries(terminal_state(held), layout, pages, horizon, stored)
    carried = terminal_entries(
        terminal_state(held.of_keys(theirs)), layout, pages, horizon, stored, held.of_keys(~theirs)
    )
    assert carried == whole and theirs.sum() == 3
