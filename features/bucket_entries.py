"""A card bucket's and a terminal bucket's state as entries (``features.entries``): their rows, their
states read back from entries, and the entries a stateful call writes."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace

import numpy as np

from features.core import CardState, TerminalState, concat_keys
from features.entries import (
    CARD_ROW,
    LABEL_ROW,
    NO_ROW,
    TERMINAL_TX_ROW,
    Held,
    Layout,
    Pages,
    Rows,
    SlotsOf,
    coded,
    paged_entries,
    unpack_entries,
)
from features.entry_store import Written

# --- card entries -------------------------------------------------------------------------------------


def card_rows(state: CardState, slots_of: SlotsOf) -> Rows:
    rows = np.empty(len(state), dtype=CARD_ROW)
    rows["time"], rows["tx_id"], rows["cents"] = state.event_time_ms, state.tx_id, state.amount_cents
    return Rows.keyed(state.card_id, rows, "time", slots_of)


def read_cards(blobs: Iterable[bytes]) -> tuple[Held, list[int]]:
    """The card rows of many entries, and each entry's newest event time."""
    return unpack_entries(blobs, CARD_ROW, NO_ROW)


def card_state(held: Held) -> CardState:
    """Held card rows as a card history, its card ids a categorical of the held keys (no string per row)."""
    return CardState(
        card_id=held.first_keys(),
        event_time_ms=held.first["time"].astype(np.int64),
        tx_id=held.first["tx_id"].astype(np.int64),
        amount_cents=held.first["cents"].astype(np.int64),
    )


def unpack_cards(blobs: Iterable[bytes]) -> tuple[CardState, list[int]]:
    """The card history of many entries as one state, and each entry's newest event time."""
    held, newest_times = read_cards(blobs)
    history = card_state(held)
    return replace(history, card_id=np.asarray(history.card_id, dtype=object)), newest_times


# --- terminal entries ---------------------------------------------------------------------------------


def terminal_rows(state: TerminalState, slots_of: SlotsOf) -> tuple[Rows, Rows]:
    tx = np.empty(len(state.event_time_ms), dtype=TERMINAL_TX_ROW)
    tx["time"] = state.event_time_ms
    labels = np.empty(len(state.label_tx_id), dtype=LABEL_ROW)
    labels["tx_id"] = state.label_tx_id
    labels["tx_time"] = state.label_tx_time_ms
    labels["known_at"] = state.label_known_at_ms
    labels["is_fraud"] = state.label_is_fraud
    # One table of both kinds' keys, routed once.
    n_tx = len(state.terminal_id)
    slots, codes, keys = coded(concat_keys(state.terminal_id, state.label_terminal_id), slots_of)
    return (
        Rows(slots[:n_tx], codes[:n_tx], keys, tx, "time"),
        Rows(slots[n_tx:], codes[n_tx:], keys, labels, "tx_time"),
    )


def read_terminals(blobs: Iterable[bytes]) -> tuple[Held, list[int]]:
    """The terminal rows (transactions, labels) of many entries, and each entry's newest time (of its
    transactions and its labels' transactions)."""
    return unpack_entries(blobs, TERMINAL_TX_ROW, LABEL_ROW)


def terminal_state(held: Held) -> TerminalState:
    """Held terminal rows as a terminal state, its terminal ids categoricals of the held keys."""
    labels = held.second
    return TerminalState(
        terminal_id=held.first_keys(),
        event_time_ms=held.first["time"].astype(np.int64),
        label_terminal_id=held.second_keys(),
        label_tx_id=labels["tx_id"].astype(np.int64),
        label_tx_time_ms=labels["tx_time"].astype(np.int64),
        label_known_at_ms=labels["known_at"].astype(np.int64),
        label_is_fraud=labels["is_fraud"].astype(bool),
    )


def unpack_terminals(blobs: Iterable[bytes]) -> tuple[TerminalState, list[int]]:
    """The terminal state of many entries as one, and each entry's newest time."""
    held, newest_times = read_terminals(blobs)
    state = terminal_state(held)
    return replace(
        state,
        terminal_id=np.asarray(state.terminal_id, dtype=object),
        label_terminal_id=np.asarray(state.label_terminal_id, dtype=object),
    ), newest_times


# --- what a call writes -------------------------------------------------------------------------------


def card_entries(
    history: CardState,
    layout: Layout,
    pages: Pages,
    horizon: int | None,
    read: Mapping[int, bytes],
    others: Held | None = None,
) -> tuple[Written, Pages]:
    """The entries of a card history after a call (:func:`paged_entries`), with the rows read for cards the
    call had no events for (``others``, carried as read): the rows newer than ``horizon`` (None: all)."""
    rows = card_rows(history, layout.card_slots_of)
    if others is not None:
        rows = rows.plus(others.first_rows(layout.card_slots_of(others.keys), "time"))
    return paged_entries(rows.newer_than(horizon), Rows.none(), pages, layout.page_bytes, read)


def terminal_entries(
    state: TerminalState,
    layout: Layout,
    pages: Pages,
    horizon: int | None,
    read: Mapping[int, bytes],
    others: Held | None = None,
) -> tuple[Written, Pages]:
    """The entries of a terminal state after a call (:func:`paged_entries`), with the rows read for
    terminals the call had no events for (``others``): its transactions and labels (by their transaction's
    time) newer than ``horizon`` (None: all)."""
    tx, labels = terminal_rows(state, layout.terminal_slots_of)
    if others is not None:
        slots = layout.terminal_slots_of(others.keys)
        tx = tx.plus(others.first_rows(slots, "time"))
        labels = labels.plus(others.second_rows(slots, "tx_time"))
    return paged_entries(tx.newer_than(horizon), labels.newer_than(horizon), pages, layout.page_bytes, read)
