"""The streaming feature job's stages as pure functions over pandas frames.

Three stages, each a thin Spark shell (``features.job``) around a pure function:

1. ``decode``: Kafka records of the transactions and labels topics become typed event rows; records that
   fail validation become dead rows with the reason. Each event is routed to a card bucket (cards hashed
   into a few buckets per Spark key, so one state call serves many cards).
2. ``card_stage``: per card bucket, events wait until the input's event-time frontier
   (``infra.spark.frontier``) passes them, then go through ``features.core.card_step`` in event-time order. The final micro-batch of an
   ``availableNow`` run moves each bucket's frontier past every event it holds, which releases them all.
   An event that arrives behind the bucket's frontier already passed is *late*: processed at once against
   the state as it is, and marked.
3. ``terminal_stage``: per terminal bucket, the released transactions and labels go through
   ``features.core.terminal_step``; the time features complete the record.

Because every micro-batch releases exactly the events below a frontier, in order, and the core steps give
the same result for any chunking of an ordered stream, the streaming result equals the batch definition
(``features.core.compute_features``) whatever the micro-batch sizes, restarts included.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import orjson
import pandas as pd

from contracts.events import Reason, TxColumns
from features.buckets import terminal_buckets
from features.core import CardState, TerminalState, card_step, terminal_step, time_features
from features.definitions import EVENT_TIME_MS, KNOWN_AT_MS, TX_TIME_MS, FeatureParams
from features.rows import (
    CARD_BUCKET,
    DETAIL,
    KIND,
    LATE,
    RAW,
    REASON,
    SOURCE_FIELDS,
    SOURCE_OFFSET,
    TERMINAL_BUCKET,
    RowKind,
    card_stage_fields,
    concat_frames,
    frame_of,
    output_fields,
    rows_where,
)

C = TxColumns


@dataclass
class CardBucket:
    """The state of one card bucket: card history, events waiting for the frontier, the frontier.

    The frontier is past every event the bucket released in order: a later event behind it is late.
    """

    history: CardState
    pending: pd.DataFrame
    frontier_ms: int


def _event_time(events: pd.DataFrame) -> np.ndarray:
    """When an event happens for ordering: a transaction's event time, a label's known time."""
    is_label = (events[KIND] == RowKind.LABEL).to_numpy()
    return np.where(
        is_label,
        events[KNOWN_AT_MS].fillna(0).to_numpy(dtype=np.int64),
        events[EVENT_TIME_MS].to_numpy(dtype=np.int64),
    )


#: What a duplicate's dead letter shows of it.
DUPLICATE_RAW_FIELDS = [C.TX_ID, C.CARD_ID, C.TERMINAL_ID, C.AMOUNT, EVENT_TIME_MS]


def repeated_transactions(events: pd.DataFrame, earlier_ids: np.ndarray) -> np.ndarray:
    """Which events are transactions whose tx id is among ``earlier_ids`` (a bucket's waiting events, a card
    history) or earlier among ``events`` (by source offset, so a re-run judges alike)."""
    is_tx = (events[KIND] == RowKind.TX).to_numpy()
    if not is_tx.any():
        return np.zeros(len(events), dtype=bool)
    ids = events[C.TX_ID].to_numpy(dtype=np.int64, na_value=-1)
    # A hash table of the batch's ids, probed by the earlier ones (a history holds many more): np.isin sorts
    # both, and hashing the larger side costs 4x more.
    found = earlier_ids[pd.Series(earlier_ids).isin(ids).to_numpy()]
    seen = pd.Series(ids).isin(found).to_numpy() & is_tx
    order = np.lexsort((events[SOURCE_OFFSET].to_numpy(dtype=np.int64, na_value=0), ids))
    earlier = np.zeros(len(events), dtype=bool)
    tied = is_tx[order][1:] & is_tx[order][:-1] & (ids[order][1:] == ids[order][:-1])
    earlier[order[1:]] = tied
    return seen | earlier


def as_duplicates(events: pd.DataFrame) -> pd.DataFrame:
    """Dead rows (``duplicate_tx_id``) of repeated transactions: the transaction as decoded (the original
    is at its source offset), and why."""
    raws = [
        orjson.dumps({name: _plain(value) for name, value in row.items()})
        for row in events[DUPLICATE_RAW_FIELDS].to_dict("records")
    ]
    return events.assign(
        **{
            KIND: RowKind.DEAD,
            RAW: raws,
            REASON: Reason.DUPLICATE_TX_ID.value,
            DETAIL: [f"tx_id {tx_id} was processed already" for tx_id in events[C.TX_ID].tolist()],
        }
    )


def _plain(value: object) -> object:
    return value.item() if isinstance(value, np.generic) else value


@dataclass
class Waiting:
    """A card bucket's events waiting for the frontier, and the frontier: past every event the bucket
    released in order, so a later event behind it is late."""

    pending: pd.DataFrame
    frontier_ms: int


@dataclass
class Released:
    """What a card bucket releases in one call: events in event-time order (late ones after, flagged) and
    dead rows (those decoded dead, and repeats)."""

    events: pd.DataFrame
    dead: pd.DataFrame

    @property
    def transactions(self) -> pd.DataFrame:
        return rows_where(self.events, self.events[KIND] == RowKind.TX).reset_index(drop=True)


def release(waiting: Waiting, rows: pd.DataFrame) -> tuple[Waiting, Released]:
    """Hold events until the frontier passes them; release those it has passed.

    A final tick moves the frontier past every waiting event, so they are all released (in event-time
    order, as any others). The frontier after the call is the highest of the bucket's, the ticks' and the
    time + 1 of the newest event released in order (not late). A transaction repeated in the call or of
    one waiting is dead here; one repeating a transaction already released is found against the card's
    history (:func:`card_features`), which this step does not need.
    """
    kinds = rows[KIND]
    ticks_in = rows.loc[kinds.isin([RowKind.TICK, RowKind.FINAL_TICK]), EVENT_TIME_MS]
    frontier = max([waiting.frontier_ms, *ticks_in.astype("int64").tolist()])
    events = rows_where(rows, (kinds == RowKind.TX) | (kinds == RowKind.LABEL))
    pending = waiting.pending
    waiting_ids = (
        pending.loc[pending[KIND] == RowKind.TX, C.TX_ID].to_numpy(dtype=np.int64)
        if len(pending)
        else np.empty(0)
    )
    repeated = repeated_transactions(events, waiting_ids)
    repeats = [as_duplicates(rows_where(events, repeated))] if repeated.any() else []
    dead = concat_frames(rows_where(rows, kinds == RowKind.DEAD), *repeats)
    events = rows_where(events, ~repeated)

    late_mask = _event_time(events) < waiting.frontier_ms if len(events) else np.zeros(0, dtype=bool)
    late = rows_where(events, late_mask)
    held = concat_frames(pending, rows_where(events, ~late_mask))
    if len(held) and (kinds == RowKind.FINAL_TICK).any():
        frontier = max(frontier, int(_event_time(held).max()) + 1)
    if len(held):
        due_mask = _event_time(held) < frontier
        due, still = rows_where(held, due_mask), rows_where(held, ~due_mask)
    else:
        due, still = held, held
    released = concat_frames(due, late)  # a new frame: its late flags are set in place
    released[LATE] = np.arange(len(released)) >= len(due)
    return Waiting(still.reset_index(drop=True), frontier), Released(released, dead)


def card_features(
    history: CardState, released: Released, params: FeatureParams, terminal_buckets_n: int
) -> tuple[CardState, pd.DataFrame]:
    """Card features of released transactions against ``history`` (the history of at least their cards),
    and the history after them.

    Returns the history after the call and the rows for the terminal stage: released transactions (with
    card features and the late flag), released labels, and dead rows passed through (transactions that
    repeat one in ``history`` among them).
    """
    events = released.events
    repeated = repeated_transactions(events, history.tx_id) if len(events) else np.zeros(0, dtype=bool)
    dead = concat_frames(released.dead, as_duplicates(events[repeated])) if repeated.any() else released.dead
    events = rows_where(events, ~repeated)
    tx = rows_where(events, events[KIND] == RowKind.TX).reset_index(drop=True)
    labels = rows_where(events, events[KIND] == RowKind.LABEL).reset_index(drop=True)

    columns: dict[str, object] = {}
    if len(tx):
        history, card = card_step(history, tx, params)
        columns = {name: card[name].to_numpy() for name in params.card_feature_columns}
    fields = card_stage_fields(params)
    # The transactions' frame always (it gives an empty output its columns); labels and dead rows only when
    # there are some: a frame of these fields costs a millisecond to build, even empty.
    parts = [frame_of(fields, {**{c: tx[c] for c in tx.columns if c != CARD_BUCKET}, **columns}, len(tx))]
    if len(labels):
        parts.append(
            frame_of(fields, {c: labels[c] for c in labels.columns if c != CARD_BUCKET}, len(labels))
        )
    if len(dead):
        parts.append(
            frame_of(fields, {c: dead[c].to_numpy() for c in dead.columns if c != CARD_BUCKET}, len(dead))
        )
    out = concat_frames(*parts)
    if len(out):
        is_dead = (out[KIND] == RowKind.DEAD).to_numpy()
        routed = terminal_buckets(out[C.TERMINAL_ID].fillna(""), terminal_buckets_n)
        by_offset = out[SOURCE_OFFSET].fillna(0).to_numpy(dtype=np.int64) % terminal_buckets_n
        out[TERMINAL_BUCKET] = np.where(is_dead, by_offset, routed).astype(np.int32)
    return history, out


def card_stage(
    bucket: CardBucket, rows: pd.DataFrame, params: FeatureParams, terminal_buckets_n: int
) -> tuple[CardBucket, pd.DataFrame]:
    """:func:`release` then :func:`card_features` over a bucket's whole history: one call of the card
    stage, as the job makes it (the job reads only the history of the released transactions' cards)."""
    waiting, released = release(Waiting(bucket.pending, bucket.frontier_ms), rows)
    history, out = card_features(bucket.history, released, params, terminal_buckets_n)
    return CardBucket(history, waiting.pending, waiting.frontier_ms), out


# --- 3. terminal stage ------------------------------------------------------------------------------


def terminal_stage(
    state: TerminalState, rows: pd.DataFrame, params: FeatureParams
) -> tuple[TerminalState, pd.DataFrame]:
    """Terminal and time features of released transactions; labels update the terminal risk."""
    kinds = rows[KIND]
    tx = rows_where(rows, kinds == RowKind.TX).reset_index(drop=True)
    labels = rows_where(rows, kinds == RowKind.LABEL)
    dead = rows_where(rows, kinds == RowKind.DEAD)
    label_batch = pd.DataFrame(
        {
            C.TX_ID: labels[C.TX_ID].to_numpy(dtype=np.int64),
            C.TERMINAL_ID: labels[C.TERMINAL_ID].to_numpy(dtype=object),
            TX_TIME_MS: labels[EVENT_TIME_MS].to_numpy(dtype=np.int64),
            KNOWN_AT_MS: labels[KNOWN_AT_MS].to_numpy(dtype=np.int64),
            C.IS_FRAUD: labels[C.IS_FRAUD].to_numpy(dtype=bool),
        }
    )
    tx_batch = pd.DataFrame(
        {
            C.TX_ID: tx[C.TX_ID].to_numpy(dtype=np.int64),
            C.TERMINAL_ID: tx[C.TERMINAL_ID].to_numpy(dtype=object),
            EVENT_TIME_MS: tx[EVENT_TIME_MS].to_numpy(dtype=np.int64),
        }
    )
    state, terminal = terminal_step(state, tx_batch, label_batch, params)
    when = time_features(tx_batch[EVENT_TIME_MS].to_numpy())
    columns = {
        c: tx[c].to_numpy() if c not in (KIND,) else np.full(len(tx), RowKind.FEATURES, dtype=object)
        for c in tx.columns
        if c != TERMINAL_BUCKET
    }
    columns |= {name: terminal[name].to_numpy() for name in params.terminal_feature_columns}
    columns |= {name: when[name].to_numpy() for name in when.columns}
    fields = output_fields(params)
    parts = [frame_of(fields, columns, len(tx))]
    if len(dead):
        parts.append(
            frame_of(fields, {c: dead[c].to_numpy() for c in dead.columns if c != TERMINAL_BUCKET}, len(dead))
        )
    return state, in_source_order(concat_frames(*parts))


def in_source_order(rows: pd.DataFrame) -> pd.DataFrame:
    """The rows in the order of the records they come from (topic, partition, offset).

    Spark may hand a state call its rows in another order on a re-run of the micro-batch; the sink's
    write tasks must write the same records in the same order on every attempt (``contracts.provenance``).
    """
    if len(rows) < 2:
        return rows
    return rows.sort_values(list(SOURCE_FIELDS), kind="stable", ignore_index=True)
