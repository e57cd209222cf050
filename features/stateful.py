"""One state call of each stateful stage: a bucket's state in, the pure stage in the middle, the state out.

The Spark job (``features.job``) calls these from ``transformWithStateInPandas`` with Spark's state
variables; the tests call them with dictionaries. Per bucket, a stage keeps a value (the card stage: its
waiting events, frontier, clock and pages; the terminal stage: its clock and pages) and its entries, a page
each (``features.entries``), with their expiry index (``features.entry_store``). A call reads the pages of
the cards (terminals) it has events for, no others: the card stage first releases the events the frontier
has passed (``features.stages.release``), then reads the pages of the released transactions' cards. Of the
rows read, the core gets those of the cards (terminals) the call has events for; the other cards' rows in
those pages are told apart per key (``features.entries.Held``) and written back as read, never turned into
rows of objects, so a call's Python work follows its own cards' history.

Delivery guarantee: none of its own; the same state and rows give the same state and rows, so Spark's
checkpointed state and replayable input make the job exactly-once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import pandas as pd

from contracts.events import TxColumns
from features.bucket_entries import (
    card_entries,
    card_state,
    read_cards,
    read_terminals,
    terminal_entries,
    terminal_state,
)
from features.core import TerminalState
from features.definitions import EVENT_TIME_MS, FeatureParams
from features.entries import Layout, Pages, newest_of_entry
from features.entry_store import Clock, EntryStore
from features.rows import KIND, RowKind, empty_events
from features.stages import CardBucket, Waiting, card_features, release, terminal_stage
from features.transport import from_blob, to_blob
from infra.kafka.offsets import NO_FRONTIER
from infra.spark.timing import Timings

C = TxColumns

#: The card stage's value per card bucket: the events waiting for the frontier (an Arrow IPC blob), the
#: frontier, the bucket's clock (``features.entry_store.Clock``: its newest released event time and the
#: hours its expiry index lists) and its pages (``features.entries.Pages``). Spark DDL.
CARD_BUCKET_STATE = "pending binary, frontier bigint, newest bigint, hours binary, pages binary"
#: The terminal stage's value per terminal bucket: its clock and its pages.
TERMINAL_BUCKET_STATE = "newest bigint, hours binary, pages binary"


class ValueLike(Protocol):
    """What a call uses of Spark's ``ValueState``."""

    def get(self) -> tuple[Any, ...] | None: ...

    def update(self, newValue: tuple[Any, ...]) -> None: ...


@dataclass(frozen=True)
class BucketState:
    """One bucket's state variables: its value and its entries."""

    value: ValueLike
    entries: EntryStore


# --- card stage ---------------------------------------------------------------------------------------


def card_call(
    state: BucketState, rows: pd.DataFrame, params: FeatureParams, layout: Layout, timings: Timings
) -> pd.DataFrame:
    """One card bucket's call: release what the frontier passed, read the released cards' entries, compute
    their card features, write the entries back and expire idle ones. Returns the terminal stage's rows."""
    with timings.phase("state-get"):
        waiting, clock, pages = _card_bucket(state.value.get())
    with timings.phase("core"):
        waiting, released = release(waiting, rows)
        tx = released.transactions
        cards = tx[C.CARD_ID].to_numpy()
        touched = np.unique(pages.page_of(layout.card_slots_of(cards)))
    with timings.phase("state-get"):
        stored = state.entries.read(touched)
        held, newest = read_cards(stored.values())
    with timings.phase("core"):
        theirs = held.keys_in(cards)
        history, out = card_features(
            card_state(held.of_keys(theirs)), released, params, layout.terminal_buckets
        )
        clock = clock.advanced(tx[EVENT_TIME_MS].to_numpy(dtype=np.int64))
        horizon = clock.horizon(params.card_history_ms)
        written, pages = card_entries(history, layout, pages, horizon, stored, held.of_keys(~theirs))
    with timings.phase("state-put"):
        clock = state.entries.write(clock, written, dict(zip(stored, newest, strict=True)))
        clock, _ = state.entries.expire(clock, horizon, newest_of_entry, written.values)
        state.value.update((to_blob(waiting.pending), waiting.frontier_ms, *_clock_and_pages(clock, pages)))
    return out


def _card_bucket(stored: tuple[Any, ...] | None) -> tuple[Waiting, Clock, Pages]:
    if stored is None:
        return Waiting(empty_events(), NO_FRONTIER), Clock.start(), Pages.one()
    pending, frontier, newest, hours, pages = stored
    return Waiting(from_blob(pending), int(frontier)), Clock.of(newest, hours), Pages.of_bytes(pages)


def _clock_and_pages(clock: Clock, pages: Pages) -> tuple[int | None, bytes, bytes]:
    """The fields of a bucket's value after its clock."""
    return clock.newest_ms, clock.hours_bytes(), pages.as_bytes()


def card_start(state: BucketState, bucket: CardBucket, layout: Layout) -> None:
    """Store a whole card bucket (a rescaled start: ``features.rescale``) in an empty bucket's state."""
    clock = Clock.start().advanced(bucket.history.event_time_ms)
    written, pages = card_entries(bucket.history, layout, Pages.one(), None, {})
    clock = state.entries.write(clock, written, {})
    state.value.update((to_blob(bucket.pending), bucket.frontier_ms, *_clock_and_pages(clock, pages)))


# --- terminal stage -----------------------------------------------------------------------------------


def terminal_call(
    state: BucketState, rows: pd.DataFrame, params: FeatureParams, layout: Layout, timings: Timings
) -> pd.DataFrame:
    """One terminal bucket's call: read the entries of the terminals of its transactions and labels, compute
    the terminal and time features, write the entries back and expire idle ones. Returns the feature rows
    and dead rows (``features.stages.terminal_stage``)."""
    with timings.phase("state-get"):
        stored_value = state.value.get()
        clock, pages = (
            (Clock.start(), Pages.one()) if stored_value is None else _terminal_bucket(stored_value)
        )
        ids = rows[C.TERMINAL_ID].to_numpy()[rows[KIND].isin([RowKind.TX, RowKind.LABEL]).to_numpy()]
        stored = state.entries.read(np.unique(pages.page_of(layout.terminal_slots_of(ids))))
        held, newest = read_terminals(stored.values())
    with timings.phase("core"):
        theirs = held.keys_in(ids)
        terminals, out = terminal_stage(terminal_state(held.of_keys(theirs)), rows, params)
        clock = clock.advanced(rows.loc[rows[KIND] == RowKind.TX, EVENT_TIME_MS].to_numpy(dtype=np.int64))
        horizon = clock.horizon(params.terminal_history_ms)
        written, pages = terminal_entries(terminals, layout, pages, horizon, stored, held.of_keys(~theirs))
    with timings.phase("state-put"):
        clock = state.entries.write(clock, written, dict(zip(stored, newest, strict=True)))
        clock, _ = state.entries.expire(clock, horizon, newest_of_entry, written.values)
        state.value.update(_clock_and_pages(clock, pages))
    return out


def _terminal_bucket(stored: tuple[Any, ...]) -> tuple[Clock, Pages]:
    newest, hours, pages = stored
    return Clock.of(newest, hours), Pages.of_bytes(pages)


def terminal_start(state: BucketState, terminals: TerminalState, layout: Layout) -> None:
    """Store a whole terminal bucket (a rescaled start) in an empty bucket's state."""
    clock = Clock.start().advanced(terminals.event_time_ms)
    written, pages = terminal_entries(terminals, layout, Pages.one(), None, {})
    clock = state.entries.write(clock, written, {})
    state.value.update(_clock_and_pages(clock, pages))
