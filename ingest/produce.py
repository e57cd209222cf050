"""Ingest: transactions and their delayed labels from a table or JSON lines into Kafka.

Every record is validated against the event schema; failures go to the dead-letter topic with the
original bytes and the reason, and the good records around them are produced unchanged.

Delivery guarantee: at-least-once per run, in event-time order per card. The producer is idempotent, so
retries never duplicate or reorder records; running the same import twice produces its records twice
(tx ids identify them for consumers that de-duplicate). Records are keyed by card token and carry the
event time (transactions) or the time the label became known (labels) as their Kafka timestamp.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import orjson
import pandas as pd
from confluent_kafka import KafkaError, Message, Producer

from contracts.events import (
    SCHEMA_VERSION,
    DeadLetter,
    LabelEvent,
    Reason,
    TransactionEvent,
    TxColumns,
    to_record,
)
from contracts.settings import Topics
from ingest.deadletter import DeadLetterSummary
from ingest.files import JSONL_SUFFIXES, CleanTable, load_table, read_jsonl
from ingest.tokens import tokenise
from ingest.validation import Clock, event_bytes, parse_transaction

C = TxColumns


@dataclass
class EventBatch:
    """Validated events ready to produce, in any order (they are produced in timestamp order)."""

    tx_keys: list[bytes] = field(default_factory=list)
    tx_values: list[bytes] = field(default_factory=list)
    tx_times: list[int] = field(default_factory=list)
    label_keys: list[bytes] = field(default_factory=list)
    label_values: list[bytes] = field(default_factory=list)
    label_times: list[int] = field(default_factory=list)
    dead_letters: list[DeadLetter] = field(default_factory=list)
    #: Positions of the accepted rows in the table they came from (table imports only).
    accepted: list[int] = field(default_factory=list)

    def add_transaction(self, event: TransactionEvent, raw: bytes) -> None:
        self.tx_keys.append(event.card_id.encode())
        self.tx_values.append(raw)
        self.tx_times.append(event.event_time_ms)

    def add_label(self, event: LabelEvent) -> None:
        self.label_keys.append(event.card_id.encode())
        self.label_values.append(dumps(event.model_dump()))
        self.label_times.append(event.known_at_ms)

    def split_at(self, cut_ms: int) -> tuple[EventBatch, EventBatch]:
        """The events (transactions and labels) with Kafka timestamps before ``cut_ms``, and the others."""
        before, after = EventBatch(), EventBatch()
        for key, value, ts in zip(self.tx_keys, self.tx_values, self.tx_times, strict=True):
            part = before if ts < cut_ms else after
            part.tx_keys.append(key)
            part.tx_values.append(value)
            part.tx_times.append(ts)
        for key, value, ts in zip(self.label_keys, self.label_values, self.label_times, strict=True):
            part = before if ts < cut_ms else after
            part.label_keys.append(key)
            part.label_values.append(value)
            part.label_times.append(ts)
        return before, after


def dumps(obj: object) -> bytes:
    """JSON bytes of exactly their own size (orjson keeps a 4 KiB buffer behind each result)."""
    return memoryview(orjson.dumps(obj)).tobytes()


def label_for(event: TransactionEvent, label_delay_ms: int) -> LabelEvent:
    """The fraud confirmation of a fraudulent transaction, known ``label_delay_ms`` after it."""
    return LabelEvent(
        schema_version=SCHEMA_VERSION,
        tx_id=event.tx_id,
        card_id=event.card_id,
        terminal_id=event.terminal_id,
        tx_time_ms=event.event_time_ms,
        known_at_ms=event.event_time_ms + label_delay_ms,
        is_fraud=True,
    )


def _json_rows(frame: pd.DataFrame, tokens: pd.Series) -> Iterator[bytes]:
    """Transaction event JSON for each row of a clean canonical table."""
    columns = [
        frame[C.TX_ID].tolist(),
        tokens.tolist(),
        frame[C.TERMINAL_ID].tolist(),
        frame[C.AMOUNT].tolist(),
    ]
    columns.append(frame[C.EVENT_TIME].tolist())
    has_xy = C.TERMINAL_X in frame.columns and C.TERMINAL_Y in frame.columns
    if has_xy:
        xs, ys = frame[C.TERMINAL_X].tolist(), frame[C.TERMINAL_Y].tolist()
    for i, (tx_id, card, terminal, amount, when) in enumerate(zip(*columns, strict=True)):
        event = {
            "schema_version": SCHEMA_VERSION,
            "tx_id": tx_id,
            "card_id": card,
            "terminal_id": terminal,
            "amount": amount,
            "event_time_ms": when,
        }
        if has_xy and not (np.isnan(xs[i]) or np.isnan(ys[i])):
            event["terminal_x"], event["terminal_y"] = xs[i], ys[i]
        # orjson writes NaN/inf as null; the schema then rejects them like a producer's nulls.
        yield dumps(event)


def events_from_table(
    clean: CleanTable,
    source: str,
    token_key: bytes,
    label_delay_ms: int,
    max_bytes: int,
    clock: Clock | None = None,
) -> EventBatch:
    """Tokenise (card ids, and terminal ids a card number could be read in), build and validate the events
    of a clean table; labels for rows flagged as fraud.

    With a ``clock``, events dated too far ahead of it are dead letters (``future_event_time``)."""
    batch = EventBatch(dead_letters=list(clean.dead_letters))
    frame = clean.frame
    tokens = tokenise(frame[C.CARD_ID], token_key)
    flags = frame[C.IS_FRAUD].tolist() if C.IS_FRAUD in frame.columns else [0] * len(frame)
    rows = frame["source_row"].tolist()
    for position, (raw, flag, row) in enumerate(zip(_json_rows(frame, tokens), flags, rows, strict=True)):
        where = f"{source}:row {row}"
        parsed = parse_transaction(raw, where, max_bytes, clock, token_key)
        if isinstance(parsed, DeadLetter):
            batch.dead_letters.append(parsed)
        elif flag not in (0, 1):
            batch.dead_letters.append(
                DeadLetter(
                    raw=raw, source=where, reason=Reason.INVALID_VALUE, detail=f"is_fraud: {flag!r} not 0/1"
                )
            )
        else:
            batch.add_transaction(parsed, event_bytes(parsed, raw))
            batch.accepted.append(position)
            if flag == 1:
                batch.add_label(label_for(parsed, label_delay_ms))
    return batch


def events_from_jsonl(
    path: Path, max_bytes: int, clock: Clock | None = None, token_key: bytes | None = None
) -> EventBatch:
    """Validate each line of a JSON-lines file of transaction events (wire format: card ids already
    tokens); with ``token_key``, terminal ids a card number could be read in become terminal tokens
    (without, such events are dead letters)."""
    batch = EventBatch()
    for line_number, raw in read_jsonl(path):
        parsed = parse_transaction(raw, f"file:{path}:line {line_number}", max_bytes, clock, token_key)
        if isinstance(parsed, DeadLetter):
            batch.dead_letters.append(parsed)
        else:
            batch.add_transaction(parsed, event_bytes(parsed, raw))
    return batch


def events_from_file(
    path: Path,
    mapping: dict[str, str],
    token_key: bytes,
    label_delay_ms: int,
    max_bytes: int,
    clock: Clock | None = None,
) -> EventBatch:
    """Events of a CSV, Parquet or JSON-lines file (checked against ``clock``, if given)."""
    if path.suffix.lower() in JSONL_SUFFIXES:
        return events_from_jsonl(path, max_bytes, clock, token_key)
    source = f"file:{path}"
    return events_from_table(
        load_table(path, mapping, source), source, token_key, label_delay_ms, max_bytes, clock
    )


@dataclass
class IngestResult:
    """What one ingest run produced."""

    transactions: int
    labels: int
    dead_letters: DeadLetterSummary
    seconds: float
    delivery_errors: list[str]

    @property
    def events_per_second(self) -> float:
        return (self.transactions + self.labels) / self.seconds if self.seconds > 0 else 0.0


class _Delivery:
    def __init__(self) -> None:
        self.errors: list[str] = []

    def __call__(self, error: KafkaError | None, message: Message) -> None:
        if error is not None and len(self.errors) < 100:
            self.errors.append(f"{message.topic()}: {error}")


def _produce(
    producer: Producer,
    on_delivery: _Delivery,
    topic: str,
    value: bytes,
    key: bytes | None = None,
    timestamp: int = 0,
    headers: list[tuple[str, str | bytes | None]] | None = None,
) -> None:
    while True:
        try:
            producer.produce(
                topic, value=value, key=key, timestamp=timestamp, headers=headers, on_delivery=on_delivery
            )
            return
        except BufferError:  # local queue full: let deliveries drain
            producer.poll(0.05)


def produce_events(
    producer: Producer,
    topics: Topics,
    batch: EventBatch,
    speedup: float | None = None,
    on_progress: Callable[[int], None] | None = None,
    stop: threading.Event | None = None,
    paced_from_ms: int | None = None,
) -> IngestResult:
    """Produce dead letters, then transactions and labels merged in timestamp order.

    Args:
        producer: an idempotent producer (see ``infra.clients.Clients.producer``).
        topics: where to write.
        batch: validated events.
        speedup: None for as fast as possible, else replay event time this many times faster than real time.
        on_progress: callable taking the number of records produced since its last call.
        stop: once set, no more records are produced (those produced are flushed).
        paced_from_ms: with ``speedup``, records before this event time go as fast as possible (a backfill
            of history), the pacing starts there.
    """
    started = time.monotonic()
    delivery = _Delivery()
    summary = DeadLetterSummary()
    for letter in batch.dead_letters:
        value, headers = to_record(letter)
        _produce(producer, delivery, topic=topics.dead_letter, value=value, headers=headers)
        summary.add(letter)
    times = np.concatenate(
        [np.asarray(batch.tx_times, dtype=np.int64), np.asarray(batch.label_times, dtype=np.int64)]
    )
    n_tx = len(batch.tx_times)
    order = np.argsort(times, kind="stable")  # transactions before labels at equal times
    first_time = int(times[order[0]]) if len(order) else 0
    pace_from = first_time if paced_from_ms is None else paced_from_ms
    pace_started: float | None = None
    done_since_report = produced = produced_tx = 0
    for count, index in enumerate(order.tolist(), start=1):
        if stop is not None and stop.is_set():
            break
        ts = int(times[index])
        if speedup is not None and ts >= pace_from:
            if pace_started is None:
                pace_started = time.monotonic() - (ts - pace_from) / 1000 / speedup
            lag = (ts - pace_from) / 1000 / speedup - (time.monotonic() - pace_started)
            if lag > 0:
                producer.poll(0)
                if stop is None:
                    time.sleep(lag)
                elif stop.wait(lag):
                    break
        if index < n_tx:
            topic, key, value = topics.transactions, batch.tx_keys[index], batch.tx_values[index]
            produced_tx += 1
        else:
            label = index - n_tx
            topic, key, value = topics.labels, batch.label_keys[label], batch.label_values[label]
        _produce(producer, delivery, topic=topic, key=key, value=value, timestamp=ts)
        produced += 1
        done_since_report += 1
        if count % 10_000 == 0:
            producer.poll(0)
            if on_progress is not None:
                on_progress(done_since_report)
                done_since_report = 0
    remaining = producer.flush(60)
    if on_progress is not None and done_since_report:
        on_progress(done_since_report)
    if remaining:
        delivery.errors.append(f"{remaining} records still undelivered after 60 s")
    return IngestResult(
        transactions=produced_tx,
        labels=produced - produced_tx,
        dead_letters=summary,
        seconds=time.monotonic() - started,
        delivery_errors=delivery.errors,
    )
