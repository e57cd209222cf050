"""Ingest into the real broker: every good record delivered once, every bad one dead-lettered with its reason."""

from collections import Counter
from pathlib import Path

import orjson
import pandas as pd

from contracts.events import DAY_MS, LabelEvent, Reason, TransactionEvent, TxColumns, from_message
from contracts.privacy import mask_card_numbers_bytes
from contracts.settings import Settings
from fraud.demo import BAD_EVENTS_FILE
from infra.clients import Clients
from infra.kafka.log import read_topic, topic_counts
from ingest.deadletter import summarise_topic
from ingest.files import clean_table
from ingest.produce import events_from_file, events_from_table, produce_events
from ingest.simulator import SimulatorConfig, simulate
from ingest.tokens import card_token

C = TxColumns


def ingest_file(
    settings: Settings, clients: Clients, path: Path, mapping: dict[str, str] | None = None
) -> None:
    batch = events_from_file(
        path, mapping or {}, settings.token_key.get_secret_value().encode(), 7 * DAY_MS, 16_384
    )
    result = produce_events(clients.producer(), settings.topics, batch)
    assert result.delivery_errors == []


def test_simulated_transactions_and_labels_arrive_once_keyed_by_card(
    settings: Settings, clients: Clients
) -> None:
    frame = simulate(SimulatorConfig(customers=200, terminals=400, days=20, seed=3))
    key = settings.token_key.get_secret_value().encode()
    batch = events_from_table(clean_table(frame, "sim"), "sim", key, 7 * DAY_MS, settings.max_event_bytes)
    result = produce_events(clients.producer(), settings.topics, batch)
    assert result.transactions == len(frame)

    seen: Counter[int] = Counter()
    per_card_partition: dict[str, set[int | None]] = {}
    expected = frame.set_index(C.TX_ID)
    for message in read_topic(clients, settings.topics.transactions):
        event = TransactionEvent.model_validate_json(message.value() or b"")
        seen[event.tx_id] += 1
        row = expected.loc[event.tx_id]
        assert message.key() == event.card_id.encode() == card_token(str(row[C.CARD_ID]), key).encode()
        assert message.timestamp()[1] == event.event_time_ms == row[C.EVENT_TIME].value // 1_000_000
        assert event.amount == row[C.AMOUNT]
        per_card_partition.setdefault(event.card_id, set()).add(message.partition())
    assert set(seen) == set(frame[C.TX_ID])
    assert max(seen.values()) == 1, "a transaction was delivered twice"
    assert all(len(parts) == 1 for parts in per_card_partition.values()), "a card spans partitions"

    frauds = frame[frame[C.IS_FRAUD] == 1]
    labels = [
        LabelEvent.model_validate_json(m.value() or b"") for m in read_topic(clients, settings.topics.labels)
    ]
    assert sorted(label.tx_id for label in labels) == sorted(frauds[C.TX_ID])
    assert all(label.known_at_ms - label.tx_time_ms == 7 * DAY_MS for label in labels)
    assert topic_counts(clients, [settings.topics.dead_letter]) == {settings.topics.dead_letter: 0}


def test_every_kind_of_bad_input_is_dead_lettered_and_good_records_delivered(
    settings: Settings, clients: Clients, tmp_path: Path
) -> None:
    good_lines = [1, 5, 13]  # tx ids 9000000001, 9000000005, 9000000013 in the example file
    ingest_file(settings, clients, BAD_EVENTS_FILE)
    csv = tmp_path / "handbook.csv"
    csv.write_text(
        "TRANSACTION_ID,TX_DATETIME,CUSTOMER_ID,TERMINAL_ID,TX_AMOUNT,TX_FRAUD\n"
        "100,2018-04-01 00:00:31,596,3156,57.16,0\n"
        "101,2018-04-01 00:02:10,596,3412,-81.51,0\n"
        "102,2018-04-01 00:03:10,597,,81.51,0\n"
        "103,yesterday,597,1,81.51,0\n"
        "104,2018-04-01 00:07:56,2,1365,146.00,1\n"
    )
    ingest_file(
        settings,
        clients,
        csv,
        {
            "TRANSACTION_ID": "tx_id",
            "TX_DATETIME": "event_time",
            "CUSTOMER_ID": "card_id",
            "TERMINAL_ID": "terminal_id",
            "TX_AMOUNT": "amount",
            "TX_FRAUD": "is_fraud",
        },
    )

    tx_ids = [
        orjson.loads(m.value() or b"")["tx_id"] for m in read_topic(clients, settings.topics.transactions)
    ]
    assert sorted(tx_ids) == sorted([9_000_000_000 + n for n in good_lines] + [100, 104])
    labels = [orjson.loads(m.value() or b"")["tx_id"] for m in read_topic(clients, settings.topics.labels)]
    assert labels == [104]

    letters = [from_message(m) for m in read_topic(clients, settings.topics.dead_letter)]
    by_source = {letter.source.rsplit("/", 1)[-1]: letter for letter in letters}
    expected = {
        "bad_events.jsonl:line 2": Reason.MALFORMED_JSON,
        "bad_events.jsonl:line 3": Reason.NOT_AN_OBJECT,
        "bad_events.jsonl:line 4": Reason.MISSING_FIELD,
        "bad_events.jsonl:line 5": Reason.WRONG_TYPE,
        "bad_events.jsonl:line 7": Reason.INVALID_VALUE,  # negative amount
        "bad_events.jsonl:line 8": Reason.INVALID_VALUE,  # non-finite amount
        "bad_events.jsonl:line 9": Reason.UNKNOWN_SCHEMA_VERSION,
        "bad_events.jsonl:line 10": Reason.UNEXPECTED_FIELD,
        "bad_events.jsonl:line 11": Reason.INVALID_VALUE,  # raw card number instead of a token
        "bad_events.jsonl:line 12": Reason.INVALID_VALUE,  # absurd event time
        "bad_events.jsonl:line 13": Reason.OVERSIZED,
        "handbook.csv:row 2": Reason.INVALID_VALUE,
        "handbook.csv:row 3": Reason.MISSING_FIELD,
        "handbook.csv:row 4": Reason.WRONG_TYPE,
    }
    assert {source: letter.reason for source, letter in by_source.items()} == expected
    assert len(letters) == len(expected), "a bad record was dead-lettered twice"
    originals = (BAD_EVENTS_FILE).read_bytes().splitlines()
    for source, letter in by_source.items():
        if source.startswith("bad_events.jsonl"):
            line = int(source.rsplit(" ", 1)[1])
            assert letter.raw == mask_card_numbers_bytes(originals[line - 1]), f"{source}: original not kept"
        assert letter.detail
    assert "finite" in by_source["bad_events.jsonl:line 8"].detail
    card = by_source["bad_events.jsonl:line 11"]
    assert b'"card_id":"************1111"' in card.raw, "the card number is masked but for its last digits"
    assert "4111111111111111" not in card.raw.decode() + card.detail

    summary = summarise_topic(clients, settings.topics.dead_letter)
    assert summary.total == len(expected)
    assert summary.by_reason[Reason.INVALID_VALUE.value] == 5


def test_paced_replay_follows_event_time(settings: Settings, clients: Clients) -> None:
    """Three events one simulated hour apart, replayed 3,600x faster, take about two seconds."""
    import time

    t0 = 1_522_540_800_000
    frame = pd.DataFrame(
        {
            C.TX_ID: [1, 2, 3],
            C.CARD_ID: [1, 1, 2],
            C.TERMINAL_ID: [1, 2, 3],
            C.AMOUNT: [1.0, 2.0, 3.0],
            C.EVENT_TIME: [t0, t0 + 3_600_000, t0 + 7_200_000],
        }
    )
    batch = events_from_table(clean_table(frame, "s"), "s", b"k", DAY_MS, 16_384)
    started = time.monotonic()
    result = produce_events(clients.producer(), settings.topics, batch, speedup=3600)
    elapsed = time.monotonic() - started
    assert result.transactions == 3
    assert 1.9 <= elapsed < 4.0
