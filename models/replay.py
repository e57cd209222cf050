"""Training sets by replaying the transactions and labels topics (Kappa: the log is the system of record).

Reads every record present now (read_committed), validates it against the event schema exactly as the
feature job does (records that fail are counted and left out: they are on the dead-letter topic since
ingest), de-duplicates transactions by tx id (ingest is at-least-once), and hands the transactions and
the labels, with the time each became known, to the batch path of the feature definitions.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import TypeVar

import pandas as pd
from pydantic import BaseModel

from contracts.events import DeadLetter, LabelEvent, TransactionEvent, TxColumns
from contracts.settings import Topics
from features.definitions import EVENT_TIME_MS, FeatureParams
from infra.clients import Clients
from infra.kafka.log import offset_bounds, read_topic
from models.dataset import LABEL_TABLE_COLUMNS, Dataset, DatasetError, build_dataset, in_range
from validation.parse import parse_event

C = TxColumns
EventT = TypeVar("EventT", bound=BaseModel)
_PROGRESS_STEP = 10_000

#: ``progress(description, total)`` opens a progress display and yields ``advance(n)`` (the CLI's bar).
Progress = Callable[[str, int], AbstractContextManager[Callable[[int], None]]]


@contextmanager
def no_progress(description: str, total: int) -> Iterator[Callable[[int], None]]:
    """A :data:`Progress` that shows nothing."""
    yield lambda amount: None


@dataclass(frozen=True)
class ReplayedEvents:
    """Valid transactions (one per tx id) and labels read from the topics, and how many were rejected."""

    transactions: pd.DataFrame
    labels: pd.DataFrame
    source: str
    rejected: int

    @property
    def last_ms(self) -> int:
        return int(self.transactions[EVENT_TIME_MS].max())


def _read_events(
    clients: Clients, topic: str, model: type[EventT], max_bytes: int, progress: Progress
) -> tuple[list[EventT], int]:
    total = sum(end - first for first, end in offset_bounds(clients.admin(), topic).values())
    events: list[EventT] = []
    rejected = 0
    pending = 0
    with progress(f"Replaying {topic}", total) as advance:
        for message in read_topic(clients, topic):
            parsed = parse_event(model, message.value() or b"", f"kafka:{topic}", max_bytes)
            if isinstance(parsed, DeadLetter):
                rejected += 1
            else:
                events.append(parsed)
            pending += 1
            if pending == _PROGRESS_STEP:
                advance(pending)
                pending = 0
        advance(pending)
    return events, rejected


def replay_topics(
    clients: Clients, topics: Topics, max_event_bytes: int, progress: Progress = no_progress
) -> ReplayedEvents:
    """Every valid transaction and label in the topics now, with ``progress`` shown per topic."""
    transactions, bad_tx = _read_events(
        clients, topics.transactions, TransactionEvent, max_event_bytes, progress
    )
    labels, bad_labels = _read_events(clients, topics.labels, LabelEvent, max_event_bytes, progress)
    source = f"kafka:{topics.transactions}+{topics.labels}"
    if not transactions:
        raise DatasetError(f"no valid transactions in topic {topics.transactions!r}")
    tx_frame = pd.DataFrame(
        [
            event.model_dump(include={C.TX_ID, C.CARD_ID, C.TERMINAL_ID, C.AMOUNT, EVENT_TIME_MS})
            for event in transactions
        ]
    ).drop_duplicates(C.TX_ID, keep="first")
    return ReplayedEvents(tx_frame.reset_index(drop=True), label_table(labels), source, bad_tx + bad_labels)


def label_table(labels: list[LabelEvent]) -> pd.DataFrame:
    """Label events as a label table (``LABEL_TABLE_COLUMNS``), without repeats."""
    return pd.DataFrame(
        [event.model_dump(include=set(LABEL_TABLE_COLUMNS)) for event in labels],
        columns=list(LABEL_TABLE_COLUMNS),
    ).drop_duplicates()


def replay_labels(
    clients: Clients, topic: str, max_event_bytes: int, progress: Progress = no_progress
) -> pd.DataFrame:
    """Every valid label in ``topic`` now, as a label table."""
    labels, _ = _read_events(clients, topic, LabelEvent, max_event_bytes, progress)
    return label_table(labels)


def replay_dataset(
    events: ReplayedEvents, params: FeatureParams, since_ms: int | None = None, until_ms: int | None = None
) -> Dataset:
    """The dataset of the replayed events, from the transactions that matter for [since_ms, until_ms)."""
    transactions = events.transactions[
        in_range(events.transactions[EVENT_TIME_MS], params, since_ms, until_ms)
    ]
    return build_dataset(
        transactions.reset_index(drop=True), events.labels, params, events.source, events.rejected
    )
