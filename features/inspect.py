"""What the feature job holds for one card or one terminal, read from its checkpoint or from a savepoint.

The job keeps its state per card bucket and per terminal bucket (``features.job``), each card's history and
each terminal's transactions and labels in the entry of its slot (``features.entries``). A card is looked up
in the bucket and entry the job routes it to (with the counts of the checkpoint's layout file), and decoded
as the job decodes it. The windows shown are the core's, at the event-time frontier:
``features.core.card_windows`` for the card and ``features.core.terminal_step`` for a transaction at the
frontier for the terminal, so they follow the feature definitions and cannot drift from them.

The card state keeps what the card features need of each transaction (tx id, event time, amount in cents)
and the events still waiting for the frontier, whole; it keeps no terminal of a released transaction. The
terminal state keeps transaction times and fraud labels per terminal, no card.

Delivery guarantee: read-only. Everything shown is the state of the last micro-batch the job committed
(``infra.spark.state_store``), read beside the running job without stopping it; a later batch is not shown.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt
import pandas as pd

from contracts.errors import NotFoundError, StateError
from contracts.events import TxColumns
from features.bucket_entries import unpack_cards, unpack_terminals
from features.buckets import card_bucket, terminal_buckets
from features.compat import recorded_params
from features.core import CardState, TerminalState, card_windows, terminal_step
from features.definitions import (
    DAY_MS,
    EVENT_TIME_MS,
    HOUR_MS,
    KNOWN_AT_MS,
    TX_TIME_MS,
    FeatureParams,
    terminal_nb_tx_column,
    terminal_risk_column,
)
from features.entries import Layout, Pages
from features.entry_store import entry_bytes
from features.job import CARD_ENTRIES_VAR, CARD_STATE_VAR, TERMINAL_ENTRIES_VAR, TERMINAL_STATE_VAR
from features.rows import KIND, RowKind, empty_events
from features.stages import CardBucket
from features.state_layout import LAYOUT_FILE, check_current, recorded
from features.transport import KEY, from_blob
from infra.kafka.offsets import NO_FRONTIER
from infra.spark.checkpoint import check_intact, query_location
from infra.spark.offset_log import Frontier, frontier_after
from infra.spark.state_store import CheckpointNotFoundError, CommittedBatch, StateReader, committed_batch

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

C = TxColumns

#: Columns of the events shown for a card.
WAITING = "waiting"
EVENT_COLUMNS = [KIND, C.TX_ID, EVENT_TIME_MS, C.AMOUNT, C.TERMINAL_ID, KNOWN_AT_MS, WAITING]


class NothingHeldError(NotFoundError):
    """The state holds nothing for the card or terminal asked for."""


@dataclass(frozen=True)
class JobState:
    """A feature job's checkpoint (or a savepoint: a copy of one) as found on disk: its layout, its last
    committed micro-batch, with its sources' end offsets, and the feature parameters its job records
    (``features.compat``; None when it records none)."""

    checkpoint: Path
    layout: dict[str, int]
    batch: CommittedBatch
    params: FeatureParams | None = None

    @property
    def entry_layout(self) -> Layout:
        """The layout as ``features.entries`` routes by it."""
        return Layout(**{name: int(count) for name, count in self.layout.items()})

    def params_or(self, default: FeatureParams) -> FeatureParams:
        """The parameters the job records, else ``default``."""
        return self.params if self.params is not None else default

    @property
    def query_dir(self) -> Path:
        return query_location(self.checkpoint)

    @property
    def _frontier(self) -> Frontier | None:
        return frontier_after(self.query_dir, self.batch.batch_id, self.batch.source_offsets)

    @property
    def frontier_ms(self) -> int | None:
        """The batch's event-time frontier (``infra.spark.frontier``): every record stamped before it was
        read. None before the job has seen a record."""
        frontier = self._frontier
        return None if frontier is None or frontier.frontier_ms <= NO_FRONTIER else frontier.frontier_ms

    @property
    def final(self) -> bool:
        """Whether the batch was the last of an ``--once`` run, which released every event held."""
        frontier = self._frontier
        return frontier is not None and frontier.final

    def as_json(self) -> dict[str, Any]:
        """Where the state was read and what it reflects, as JSON values."""
        return {
            "checkpoint": str(self.checkpoint),
            "batch_id": self.batch.batch_id,
            "frontier_ms": self.frontier_ms,
            "final": self.final,
        }


def open_job_state(checkpoint: Path) -> JobState:
    """The feature job's state at ``checkpoint``, without reading the state itself (no Spark).

    Raises:
        CheckpointNotFoundError: no checkpoint there, or nothing committed yet.
        StateError: the directory is a checkpoint of another kind of job, it is damaged
            (``infra.spark.checkpoint.check_intact``), or it keeps its state in an earlier layout.
    """
    if not checkpoint.is_dir():
        raise CheckpointNotFoundError(f"no checkpoint at {checkpoint}: no job has run with it")
    check_intact(checkpoint)
    batch = committed_batch(query_location(checkpoint))
    record = recorded(checkpoint)
    if record is None or not record.layout:
        raise StateError(f"{checkpoint} has no {LAYOUT_FILE}: it is not the checkpoint of a feature job")
    check_current(record.layout, f"checkpoint {checkpoint}")
    layout = {name: int(value) for name, value in record.layout.items()}
    return JobState(checkpoint, layout, batch, recorded_params(record.specs))


def window_name(window_ms: int) -> str:
    """A window's length as people say it: ``1 h``, ``30 d``."""
    return f"{window_ms // DAY_MS} d" if window_ms % DAY_MS == 0 else f"{window_ms / HOUR_MS:g} h"


def _cents_to_amount(cents: np.ndarray) -> np.ndarray:
    return np.asarray(cents, dtype=np.int64) / 100


# --- cards ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CardView:
    """What the job holds for one card at its last committed micro-batch."""

    card_id: str
    job: JobState
    bucket: int
    #: The card bucket's own frontier: its released transactions are before it, its waiting events at or
    #: after it. The batch's frontier, but after a final batch, which moves it past every event it released.
    bucket_frontier_ms: int | None
    #: The released transactions and the events waiting for the frontier (``EVENT_COLUMNS``), in event-time
    #: order; a released transaction's terminal is not kept (None).
    events: pd.DataFrame
    #: ``features.core.card_windows`` at ``at_ms``, with each window's name (``window``: ``1 h``, ``7 d``).
    windows: pd.DataFrame

    @property
    def at_ms(self) -> int | None:
        """Where the windows end: the bucket's frontier (the batch's when the bucket has none)."""
        return self.bucket_frontier_ms if self.bucket_frontier_ms is not None else self.job.frontier_ms

    def as_json(self) -> dict[str, Any]:
        """The view as JSON values (amounts in currency units, times in UTC ms)."""
        return {
            "card_id": self.card_id,
            **self.job.as_json(),
            "card_bucket": self.bucket,
            "card_buckets": self.job.layout.get("card_buckets"),
            "bucket_frontier_ms": self.bucket_frontier_ms,
            "windows_end_ms": self.at_ms,
            "windows": [
                {
                    "window": row["window"],
                    "window_ms": int(row["window_ms"]),
                    "feature": row["count_column"],
                    "nb_tx": int(row["nb_tx"]),
                    "amount_sum": int(row["amount_cents"]) / 100,
                    "avg_amount": None if np.isnan(row["avg_amount"]) else float(row["avg_amount"]),
                }
                for row in self.windows.to_dict("records")
            ],
            "events": [
                {name: _plain(value) for name, value in row.items()} for row in self.events.to_dict("records")
            ],
        }


def _plain(value: Any) -> Any:
    """A JSON value of a frame cell: numpy scalars as Python ones, missing values as None."""
    if value is None or (isinstance(value, float) and np.isnan(value)) or value is pd.NA:
        return None
    return value.item() if isinstance(value, np.generic) else value


def card_view(
    card_id: str, job: JobState, bucket: int, held: CardBucket | None, params: FeatureParams
) -> CardView:
    """The view of ``card_id`` from what its bucket holds (the card's history, at least; its waiting events
    and frontier; None: the bucket holds nothing).

    Raises:
        NothingHeldError: the bucket holds no transaction and no waiting event of the card.
    """
    history, pending, frontier = CardState.empty(), pd.DataFrame(columns=EVENT_COLUMNS), None
    if held is not None:
        history, pending = held.history, held.pending
        frontier = None if held.frontier_ms <= NO_FRONTIER else held.frontier_ms
    mine = history.card_id == card_id
    released = pd.DataFrame(
        {
            KIND: RowKind.TX,
            C.TX_ID: history.tx_id[mine],
            EVENT_TIME_MS: history.event_time_ms[mine],
            C.AMOUNT: _cents_to_amount(history.amount_cents[mine]),
            C.TERMINAL_ID: None,
            KNOWN_AT_MS: None,
            WAITING: False,
        },
        columns=EVENT_COLUMNS,
    )
    waiting = (
        pending[(pending[C.CARD_ID] == card_id) & pending[KIND].isin([RowKind.TX, RowKind.LABEL])]
        if len(pending)
        else pending
    )
    waiting = waiting.assign(**{WAITING: True})[EVENT_COLUMNS]
    if not len(released) and not len(waiting):
        buckets = job.layout.get("card_buckets")
        raise NothingHeldError(
            f"the state holds nothing for card {card_id} at batch {job.batch.batch_id} (card bucket "
            f"{bucket} of {buckets}): no transaction of it within its windows, nor one waiting"
        )
    events = pd.concat([frame for frame in (released, waiting) if len(frame)], ignore_index=True)
    events = events.sort_values([EVENT_TIME_MS, C.TX_ID], kind="stable", ignore_index=True)
    at = frontier if frontier is not None else job.frontier_ms
    windows = card_windows(history, card_id, at if at is not None else NO_FRONTIER, params)
    windows.insert(0, "window", [window_name(int(ms)) for ms in windows["window_ms"]])
    return CardView(card_id, job, bucket, frontier, events, windows)


def page_of(stored: Mapping[str, Any] | None, slot: int) -> int:
    """The entry that holds ``slot`` in a bucket whose value is ``stored``: its page."""
    pages = Pages.of_bytes(None if stored is None else stored["pages"])
    return int(pages.page_of(np.asarray([slot]))[0])


@dataclass(frozen=True)
class StateVars:
    """Where the job keeps the state of one kind of key (cards or terminals): the bucket's value state and its
    entries' map state, and how a key is routed to its slot."""

    bucket: str
    entries: str
    slots_of: Callable[[Layout, npt.NDArray[Any]], npt.NDArray[np.int64]]


CARD_VARS = StateVars(CARD_STATE_VAR, CARD_ENTRIES_VAR, Layout.card_slots_of)
TERMINAL_VARS = StateVars(TERMINAL_STATE_VAR, TERMINAL_ENTRIES_VAR, Layout.terminal_slots_of)


def read_state(
    spark: SparkSession, job: JobState, variables: StateVars, bucket: int, key: str
) -> tuple[dict[str, Any] | None, tuple[Any, ...] | None]:
    """What the job's last committed micro-batch holds for ``key`` (Spark's state data source): its bucket's
    value (None: nothing held) and the entry of its slot's page (None: none held)."""
    with StateReader(spark, job.query_dir, job.batch.batch_id) as reader:
        stored = reader.value_state(variables.bucket, KEY, [bucket]).get(bucket)
        slot = int(variables.slots_of(job.entry_layout, np.asarray([key], dtype=object))[0])
        return stored, reader.map_value(variables.entries, KEY, bucket, page_of(stored, slot))


def read_card(spark: SparkSession, job: JobState, card_id: str, params: FeatureParams) -> CardView:
    """What the job holds for ``card_id``, read from its card bucket's state: the bucket's waiting events and
    frontier, and the card's entry."""
    bucket = card_bucket(card_id, job.layout["card_buckets"])
    stored, entry = read_state(spark, job, CARD_VARS, bucket, card_id)
    history, _ = unpack_cards([] if entry is None else [entry_bytes(entry[0])])
    if stored is None and entry is None:
        return card_view(card_id, job, bucket, None, params)
    pending = from_blob(stored["pending"]) if stored is not None else empty_events()
    frontier = int(stored["frontier"]) if stored is not None else NO_FRONTIER
    return card_view(card_id, job, bucket, CardBucket(history, pending, frontier), params)


# --- terminals --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TerminalView:
    """What the job holds for one terminal at its last committed micro-batch."""

    terminal_id: str
    job: JobState
    bucket: int
    #: Event times of the terminal's kept transactions, oldest first.
    transaction_times_ms: np.ndarray
    #: Its kept labels, one per tx id (``features.definitions.LABEL_COLUMNS`` but the terminal).
    labels: pd.DataFrame
    #: The terminal features of a transaction of the terminal at the frontier: one row per window with
    #: ``window`` (its name), ``window_ms``, ``nb_tx`` and ``risk`` (empty without a frontier).
    windows: pd.DataFrame

    def as_json(self) -> dict[str, Any]:
        return {
            "terminal_id": self.terminal_id,
            **self.job.as_json(),
            "terminal_bucket": self.bucket,
            "terminal_buckets": self.job.layout.get("terminal_buckets"),
            "transaction_times_ms": [int(t) for t in self.transaction_times_ms],
            "labels": [
                {name: _plain(value) for name, value in row.items()} for row in self.labels.to_dict("records")
            ],
            "windows": [
                {
                    "window": row["window"],
                    "window_ms": int(row["window_ms"]),
                    "nb_tx": int(row["nb_tx"]),
                    "risk": float(row["risk"]),
                }
                for row in self.windows.to_dict("records")
            ],
        }


def terminal_windows(
    state: TerminalState, terminal_id: str, at_ms: int, params: FeatureParams
) -> pd.DataFrame:
    """The terminal features a transaction of ``terminal_id`` at ``at_ms`` gets from ``state``
    (``terminal_step``; its windows end a label delay before it, so it does not count itself)."""
    probe = pd.DataFrame({C.TX_ID: [-1], C.TERMINAL_ID: [terminal_id], EVENT_TIME_MS: [at_ms]})
    _, features = terminal_step(state, probe, None, params)
    return pd.DataFrame(
        {
            "window": [window_name(ms) for ms in params.windows_ms],
            "window_ms": list(params.windows_ms),
            "nb_tx": [int(features[terminal_nb_tx_column(days)].iloc[0]) for days in params.window_days],
            "risk": [float(features[terminal_risk_column(days)].iloc[0]) for days in params.window_days],
        }
    )


def terminal_view(
    terminal_id: str, job: JobState, bucket: int, held: TerminalState | None, params: FeatureParams
) -> TerminalView:
    """The view of ``terminal_id`` from what its bucket holds (its transactions and labels, at least; None:
    nothing).

    Raises:
        NothingHeldError: the bucket holds no transaction and no label of the terminal.
    """
    state = TerminalState.empty() if held is None else held
    tx = state.terminal_id == terminal_id
    lab = state.label_terminal_id == terminal_id
    mine = TerminalState(
        state.terminal_id[tx],
        state.event_time_ms[tx],
        state.label_terminal_id[lab],
        state.label_tx_id[lab],
        state.label_tx_time_ms[lab],
        state.label_known_at_ms[lab],
        state.label_is_fraud[lab],
    )
    if not len(mine):
        buckets = job.layout.get("terminal_buckets")
        raise NothingHeldError(
            f"the state holds nothing for terminal {terminal_id} at batch {job.batch.batch_id} "
            f"(terminal bucket {bucket} of {buckets}): no transaction or label of it within its windows"
        )
    _, labels = mine.to_frames()
    labels = labels.drop(columns=C.TERMINAL_ID).sort_values([KNOWN_AT_MS, C.TX_ID], ignore_index=True)
    at = job.frontier_ms
    windows = (
        terminal_windows(mine, terminal_id, at, params)
        if at is not None
        else pd.DataFrame(columns=["window", "window_ms", "nb_tx", "risk"])
    )
    return TerminalView(
        terminal_id,
        job,
        bucket,
        np.sort(mine.event_time_ms),
        labels[[C.TX_ID, TX_TIME_MS, KNOWN_AT_MS, C.IS_FRAUD]],
        windows,
    )


def read_terminal(
    spark: SparkSession, job: JobState, terminal_id: str, params: FeatureParams
) -> TerminalView:
    """What the job holds for ``terminal_id``, read from its terminal bucket's state."""
    bucket = int(terminal_buckets(pd.Series([terminal_id]), job.layout["terminal_buckets"])[0])
    _, entry = read_state(spark, job, TERMINAL_VARS, bucket, terminal_id)
    held = None if entry is None else unpack_terminals([entry_bytes(entry[0])])[0]
    return terminal_view(terminal_id, job, bucket, held, params)
