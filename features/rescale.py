"""Re-keying the feature job's state into another layout: the state of every card bucket and terminal bucket
of one layout (bucket counts), split by card and by terminal into the buckets of another.

The job keeps its state per bucket (``features.job``): a card bucket holds the histories of the cards hashed
into it (``features.buckets.card_bucket``; in entries by slot, ``features.entries``), its waiting events and
a frontier; a terminal bucket holds the transactions and labels of its terminals. Every entry names its card or terminal, so a layout's state is
re-keyed by routing each entry as the job routes new events; entries are moved, none is made, dropped or
changed. A job started from a savepoint in another layout (``fraud.savepoints``) gets the re-keyed state in
its first micro-batch (``transformWithStateInPandas(initialState=...)``).

The frontier of every new card bucket is the highest frontier of the old ones. The job gives every card
bucket the same ticks, so the frontiers differ only after the final micro-batch of an ``--once`` run, which
moves each bucket past the events it held; when records are stamped with their event time, as ``fraud
ingest`` stamps them, that is past every record read, the same for all. Where they do differ, the highest
is the safe choice: each card's events up to its old bucket's frontier have been released, so its history
holds them, and an event older than that must stay late (processed at once against the state, marked):
under a lower frontier it would wait and be released in order behind history it should have preceded. An
event the old bucket would still have held, between its frontier and the highest, is judged late instead
(the only difference a rescale can make, and only in that case); events already waiting are released by
the first micro-batch's frontier as they would have been by their own bucket's.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np
import pandas as pd

from contracts.events import TxColumns
from features.buckets import card_buckets, terminal_buckets
from features.core import CardState, TerminalState
from features.rows import CARD_BUCKET, concat_frames, empty_events
from features.stages import CardBucket
from infra.kafka.offsets import NO_FRONTIER
from infra.spark.offset_log import Position

C = TxColumns


@dataclass(frozen=True)
class Rescale:
    """Where a job that starts into another layout takes its first state and input position from: a copy of a
    query checkpoint (a savepoint's) at a committed micro-batch."""

    #: The query checkpoint whose state is re-keyed.
    query_dir: Path
    #: Its committed micro-batch: the state as that batch left it.
    batch: int
    #: Where that batch left the job's input (the connector's offsets and the frontier): where the new
    #: query's input starts.
    position: Position


def rekey_cards(buckets: Iterable[CardBucket], count: int) -> dict[int, CardBucket]:
    """The state of ``count`` card buckets that hold what ``buckets`` (all of a layout's) hold: each card's
    history and waiting events in the card's new bucket, every bucket's frontier the highest of the old
    ones (see the module docstring). Every new bucket is there, empty or not: each needs its frontier."""
    old = list(buckets)
    frontier = max((bucket.frontier_ms for bucket in old), default=NO_FRONTIER)
    history = _concat_cards([bucket.history for bucket in old])
    pending = concat_frames(empty_events(), *(bucket.pending for bucket in old))
    history_to = card_buckets(pd.Series(history.card_id, dtype=object), count)
    pending_to = card_buckets(pending[C.CARD_ID].astype(object), count)
    return {
        key: CardBucket(
            _card_rows(history, history_to == key),
            pending[pending_to == key].assign(**{CARD_BUCKET: np.int32(key)}).reset_index(drop=True),
            frontier,
        )
        for key in range(count)
    }


def rekey_terminals(states: Iterable[TerminalState], count: int) -> dict[int, TerminalState]:
    """The state of ``count`` terminal buckets that hold what ``states`` (all of a layout's) hold: each
    terminal's transactions and labels in its new bucket. Buckets left empty are left out (a terminal bucket
    without state starts empty, as a new one does)."""
    whole = _concat_terminals(list(states))
    tx_to = terminal_buckets(pd.Series(whole.terminal_id, dtype=object), count)
    label_to = terminal_buckets(pd.Series(whole.label_terminal_id, dtype=object), count)
    split = {key: _terminal_rows(whole, tx_to == key, label_to == key) for key in range(count)}
    return {key: state for key, state in split.items() if len(state)}


def _concat_cards(states: list[CardState]) -> CardState:
    if not states:
        return CardState.empty()
    return CardState(
        np.concatenate([s.card_id for s in states]),
        np.concatenate([s.event_time_ms for s in states]),
        np.concatenate([s.tx_id for s in states]),
        np.concatenate([s.amount_cents for s in states]),
    )


def _card_rows(state: CardState, rows: np.ndarray) -> CardState:
    return CardState(
        state.card_id[rows], state.event_time_ms[rows], state.tx_id[rows], state.amount_cents[rows]
    )


#: The fields of a terminal state: its transactions', then its labels' (``label_*``).
_LABEL_FIELDS = tuple(f.name for f in fields(TerminalState) if f.name.startswith("label_"))
_TX_FIELDS = tuple(f.name for f in fields(TerminalState) if f.name not in _LABEL_FIELDS)


def _concat_terminals(states: list[TerminalState]) -> TerminalState:
    if not states:
        return TerminalState.empty()
    names = (*_TX_FIELDS, *_LABEL_FIELDS)
    return TerminalState(**{name: np.concatenate([getattr(s, name) for s in states]) for name in names})


def _terminal_rows(state: TerminalState, tx: np.ndarray, labels: np.ndarray) -> TerminalState:
    return TerminalState(
        **{name: getattr(state, name)[tx] for name in _TX_FIELDS},
        **{name: getattr(state, name)[labels] for name in _LABEL_FIELDS},
    )
