"""Alerts and scores in a real Valkey server: idempotent writes, set-if-newer scores, retention, reads."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pytest
import redis

from contracts.records import ScoreRecord
from contracts.redis_keys import (
    alert_key,
    card_alerts_key,
    card_features_key,
    card_score_key,
    recent_alerts_key,
)
from features.job import LatestFeaturesToRedis
from infra.arrow_json import json_objects
from infra.embedded.stack import StackInfo
from infra.redis.connection import RedisTarget
from infra.redis.reads import card_alerts, card_known, card_summary, get_alert, recent_alerts
from infra.redis.store import set_latest, write_alerts, write_score_values, write_scores
from infra.spark.kafka_sink.records import newest_per_key
from tests.support.factories import CARD_A, CARD_B, T0_MS, make_alert, make_score

DAY_S = 86_400
RETENTION_S = 7 * DAY_S


@pytest.fixture
def client(stack: StackInfo) -> Iterator[Any]:
    client = redis.Redis.from_url(stack.redis_url)
    yield client
    client.close()


@pytest.fixture
def prefix() -> str:
    return f"test-{uuid.uuid4().hex[:10]}:"


def dump(client: Any, prefix: str) -> dict[str, Any]:
    """Every key under ``prefix`` with its content (TTLs aside)."""
    state: dict[str, Any] = {}
    for key in sorted(client.scan_iter(match=f"{prefix}*", count=1000)):
        kind = client.type(key)
        state[key.decode()] = (
            client.hgetall(key) if kind == b"hash" else client.zrange(key, 0, -1, withscores=True)
        )
    return state


def test_alerts_are_written_once_and_read_back_in_event_time_order(client: Any, prefix: str) -> None:
    alerts = [make_alert(3), make_alert(1), make_alert(2, card_id=CARD_B), make_alert(4, card_id=CARD_B)]
    assert write_alerts(client, alerts, prefix, RETENTION_S) == 4
    state = dump(client, prefix)
    assert set(state) == {
        *(alert_key(a.tx_id, prefix) for a in alerts),
        card_alerts_key(CARD_A, prefix),
        card_alerts_key(CARD_B, prefix),
        recent_alerts_key(prefix),
    }

    # The same batch again (a re-run after a crash), and a part of it: nothing changes.
    assert write_alerts(client, alerts, prefix, RETENTION_S) == 0
    assert write_alerts(client, alerts[1:3], prefix, RETENTION_S) == 0
    assert dump(client, prefix) == state

    assert get_alert(client, 2, prefix) == alerts[2]
    assert get_alert(client, 99, prefix) is None
    assert [a.tx_id for a in card_alerts(client, CARD_A, prefix, limit=10)] == [3, 1]
    assert [a.tx_id for a in card_alerts(client, CARD_B, prefix, limit=1)] == [4]
    assert [a.tx_id for a in recent_alerts(client, prefix, limit=10)] == [4, 3, 2, 1]
    assert [a.tx_id for a in recent_alerts(client, prefix, limit=2)] == [4, 3]
    after = alerts[2].event_time_ms  # tx 2: only later event times
    assert [a.tx_id for a in recent_alerts(client, prefix, limit=10, after_ms=after)] == [4, 3]
    assert recent_alerts(client, prefix, limit=10, after_ms=alerts[3].event_time_ms) == []
    assert write_alerts(client, [], prefix, RETENTION_S) == 0


def test_retention_expires_hashes_and_trims_sets_by_event_time(client: Any, prefix: str) -> None:
    """Alerts 10 and 6 days before the newest: with a 7-day retention the older leaves the sets."""
    newest = make_alert(1, event_time_ms=T0_MS + 30 * DAY_S * 1000)
    old = make_alert(2, event_time_ms=newest.event_time_ms - 10 * DAY_S * 1000)
    recent = make_alert(3, event_time_ms=newest.event_time_ms - 6 * DAY_S * 1000)
    write_alerts(client, [newest], prefix, RETENTION_S)
    write_alerts(client, [old, recent], prefix, RETENTION_S)

    assert [a.tx_id for a in card_alerts(client, CARD_A, prefix)] == [1, 3]
    assert [a.tx_id for a in recent_alerts(client, prefix)] == [1, 3]
    for key in (alert_key(1, prefix), card_alerts_key(CARD_A, prefix), recent_alerts_key(prefix)):
        assert RETENTION_S - 5 <= client.ttl(key) <= RETENTION_S
    # The trimmed alert's own hash lives until it expires.
    assert get_alert(client, 2, prefix) == old

    # An alert hash that expired before its set member is skipped on read.
    client.delete(alert_key(3, prefix))
    assert [a.tx_id for a in card_alerts(client, CARD_A, prefix)] == [1]
    assert [a.tx_id for a in recent_alerts(client, prefix)] == [1]


def test_recent_alerts_keep_only_the_newest(client: Any, prefix: str) -> None:
    write_alerts(client, [make_alert(i) for i in range(1, 6)], prefix, RETENTION_S, recent_max=3)
    write_alerts(client, [make_alert(0)], prefix, RETENTION_S, recent_max=3)  # older than all kept
    assert client.zcard(recent_alerts_key(prefix)) == 3
    assert [a.tx_id for a in recent_alerts(client, prefix)] == [5, 4, 3]
    assert len(card_alerts(client, CARD_A, prefix)) == 6  # per-card sets are bounded by retention only


def test_latest_score_is_set_if_newer_and_idempotent(client: Any, prefix: str) -> None:
    first, second = make_score(10), make_score(11, score=0.2, alert=False)
    same_ms = make_score(12, event_time_ms=second.event_time_ms, score=0.3, alert=False)
    other_card = make_score(5, card_id=CARD_B)

    assert write_scores(client, [second, first, other_card], prefix, RETENTION_S) == 2
    state = dump(client, prefix)
    # The same batch again: the same records are rewritten with the same values.
    assert write_scores(client, [second, first, other_card], prefix, RETENTION_S) == 2
    assert dump(client, prefix) == state
    assert write_scores(client, [first], prefix, RETENTION_S) == 0  # older: ignored
    assert dump(client, prefix) == state
    assert card_summary(client, CARD_A, prefix)["score"] == second

    # Same event time: the higher tx id is the newer.
    assert write_scores(client, [same_ms], prefix, RETENTION_S) == 1
    assert card_summary(client, CARD_A, prefix)["score"] == same_ms
    assert card_summary(client, CARD_B, prefix)["score"] == other_card
    assert RETENTION_S - 5 <= client.ttl(card_score_key(CARD_A, prefix)) <= RETENTION_S


def test_latest_values_of_many_keys_are_set_in_slices_and_only_if_newer(client: Any, prefix: str) -> None:
    cards = [f"{i:032x}" for i in range(1_234)]  # more than one script call's slice

    def records(time_ms: int, tx_id: int) -> list[tuple[str, int, int, dict[str, object]]]:
        return [
            (card_features_key(card, prefix), time_ms, tx_id, {"n": i, "ratio": i / 7, "empty": None})
            for i, card in enumerate(cards)
        ]

    assert set_latest(client, records(T0_MS, 5), RETENTION_S) == len(cards)
    assert set_latest(client, records(T0_MS, 4), RETENTION_S) == 0  # same time, lower tx id: older
    assert set_latest(client, records(T0_MS - 1, 9), RETENTION_S) == 0
    assert set_latest(client, [], RETENTION_S) == 0
    stored = client.hgetall(card_features_key(cards[1_000], prefix))
    assert stored == {
        b"event_time_ms": str(T0_MS).encode(),
        b"tx_id": b"5",
        b"n": b"1000",
        b"ratio": repr(1000 / 7).encode(),
        b"empty": b"",
    }
    assert set_latest(client, records(T0_MS + 1, 1), RETENTION_S) == len(cards)
    assert client.hget(card_features_key(cards[-1], prefix), "tx_id") == b"1"
    assert RETENTION_S - 5 <= client.ttl(card_features_key(cards[-1], prefix)) <= RETENTION_S


def test_card_summary_combines_features_score_and_alerts(client: Any, prefix: str) -> None:
    unknown = "f" * 32
    assert not card_known(client, unknown, prefix)
    assert card_summary(client, unknown, prefix) == {
        "card_id": unknown,
        "features": None,
        "score": None,
        "alerts": [],
    }
    # What the feature job writes (features/job.py): transaction fields, `late`, feature values.
    set_latest(
        client,
        [
            (
                card_features_key(CARD_A, prefix),
                T0_MS + 2000,
                2,
                {
                    "terminal_id": "3156",
                    "amount": 250.5,
                    "late": 0,
                    "card_nb_tx_1d": 3.0,
                    "terminal_risk_7d": None,
                },
            )
        ],
        RETENTION_S,
    )
    assert card_known(client, CARD_A, prefix)
    write_scores(client, [make_score(2)], prefix, RETENTION_S)
    write_alerts(client, [make_alert(1), make_alert(2)], prefix, RETENTION_S)

    summary = card_summary(client, CARD_A, prefix, limit=1)
    assert summary["features"] == {
        "tx_id": 2,
        "event_time_ms": T0_MS + 2000,
        "terminal_id": "3156",
        "amount": 250.5,
        "late": False,
        "values": {"card_nb_tx_1d": 3.0, "terminal_risk_7d": None},
    }
    assert summary["score"] == make_score(2)
    assert summary["alerts"] == [make_alert(2)]


def test_writes_need_a_positive_retention(client: Any, prefix: str) -> None:
    with pytest.raises(ValueError, match="retention"):
        write_alerts(client, [make_alert()], prefix, 0)
    with pytest.raises(ValueError, match="retention"):
        write_scores(client, [make_score()], prefix, 0)


def test_reads_work_with_a_decoding_client(stack: StackInfo, client: Any, prefix: str) -> None:
    """A client made with decode_responses=True (str replies) reads the same records."""
    write_alerts(client, [make_alert(1), make_alert(2)], prefix, RETENTION_S)
    write_scores(client, [make_score(2)], prefix, RETENTION_S)
    text_client = redis.Redis.from_url(stack.redis_url, decode_responses=True)
    try:
        assert card_summary(text_client, CARD_A, prefix) == card_summary(client, CARD_A, prefix)
        assert recent_alerts(text_client, prefix) == [make_alert(2), make_alert(1)]
    finally:
        text_client.close()


def test_the_feature_jobs_hook_stores_each_cards_newest_record_as_set_latest_does(
    client: Any, prefix: str, stack: StackInfo
) -> None:
    """LatestFeaturesToRedis reads and writes its records column by column; what it stores is what the
    record-by-record way stores (each card's newest record by Kafka time, then event time and tx id, parsed
    with orjson and written with set_latest), byte for byte: numbers of every magnitude, nulls, odd text."""
    rng = np.random.default_rng(5)
    n, cards = 3_000, [f"{i:032x}" for i in range(700)]
    card_of = rng.choice(cards, n)
    event_time = T0_MS + rng.integers(0, 50, n) * 1000  # many ties
    kafka_time = event_time + rng.integers(0, 2, n)
    magnitudes = 10 ** rng.uniform(-12, 20, n) * rng.choice([-1, 1], n)
    terminals = np.array(["3156", 'quote"d', "back\\slash", "ünï €", "tab\tx"])[rng.integers(0, 5, n)]
    values = json_objects(
        [
            ("schema_version", 1),
            ("tx_id", pa.array(rng.permutation(n) + 10_000)),
            ("card_id", pa.array(card_of)),
            ("terminal_id", pa.array(terminals)),
            ("amount", pa.array(np.round(rng.random(n) * 200, 2))),
            ("event_time_ms", pa.array(event_time)),
            ("terminal_x", pa.array([None] * n, pa.float64())),
            ("late", pa.array(rng.random(n) < 0.1)),
            (
                "features",
                [
                    ("card_nb_tx_1d", pa.array(rng.integers(0, 40, n))),
                    ("card_avg_amount_1d", pa.array(magnitudes)),
                    ("terminal_risk_7d", pa.array(np.where(rng.random(n) < 0.2, np.nan, rng.random(n)))),
                    ("whole", pa.array(np.round(rng.random(n) * 100))),
                ],
            ),
        ]
    )
    batch = pa.RecordBatch.from_pydict(
        {
            "topic": ["features"] * n,
            "key": [c.encode() for c in card_of],
            "value": values,
            "timestamp_ms": kafka_time,
        }
    )
    other = f"{prefix}reference:"
    LatestFeaturesToRedis(RedisTarget(stack.redis_url, prefix, RETENTION_S), "features")([batch])
    latest: dict[str, dict[str, Any]] = {}
    for value in newest_per_key([batch], "features"):
        record = orjson.loads(value)
        known = latest.get(record["card_id"])
        if known is None or (record["event_time_ms"], record["tx_id"]) > (
            known["event_time_ms"],
            known["tx_id"],
        ):
            latest[record["card_id"]] = record
    rows = [
        (
            card_features_key(card, other),
            r["event_time_ms"],
            r["tx_id"],
            {"terminal_id": r["terminal_id"], "amount": r["amount"], "late": int(r["late"]), **r["features"]},
        )
        for card, r in latest.items()
    ]
    assert set_latest(client, rows, RETENTION_S) == len(latest) == len(set(card_of))
    got = {key.removeprefix(prefix): value for key, value in dump(client, prefix).items() if other not in key}
    want = {key.removeprefix(other): value for key, value in dump(client, other).items()}
    assert got == want
    assert any(b"e-" in stored[b"card_avg_amount_1d"] for stored in got.values()), (
        "no tiny number: a weak check"
    )


def test_score_records_read_column_by_column_are_stored_as_write_scores_stores_them(
    client: Any, prefix: str
) -> None:
    """write_score_values (the scoring jobs' hook) against write_scores of the validated records, byte for
    byte: whole amounts and scores (0 and 1), tiny and huge numbers, ties, odd terminal ids."""
    rng = np.random.default_rng(6)
    n, cards = 2_000, [f"{i:032x}" for i in range(500)]
    card_of = rng.choice(cards, n)
    event_time = T0_MS + rng.integers(0, 40, n) * 1000
    scores = np.where(rng.random(n) < 0.2, rng.integers(0, 2, n).astype(float), 10 ** rng.uniform(-9, 0, n))
    values = json_objects(
        [
            ("schema_version", 1),
            ("tx_id", pa.array(rng.permutation(n) + 1)),
            ("card_id", pa.array(card_of)),
            ("terminal_id", pa.array(np.array(["3156", 'q"t', "ünï"])[rng.integers(0, 3, n)])),
            (
                "amount",
                pa.array(np.where(rng.random(n) < 0.3, np.round(rng.random(n) * 100), rng.random(n) * 1e7)),
            ),
            ("event_time_ms", pa.array(event_time)),
            ("scored_at_ms", pa.array(event_time + 40)),
            ("score", pa.array(scores)),
            ("threshold", 0.5),
            ("model_name", "fraud-detector"),
            ("model_version", 3),
            ("alert", pa.array(scores >= 0.5)),
        ]
    )
    batch = pa.RecordBatch.from_pydict(
        {
            "topic": ["scores"] * n,
            "key": [c.encode() for c in card_of],
            "value": values,
            "timestamp_ms": event_time,
        }
    )
    newest = newest_per_key([batch], "scores")
    other = f"{prefix}reference:"
    assert write_score_values(client, newest, prefix, RETENTION_S) == len(set(card_of))
    records = [ScoreRecord.model_validate_json(value) for value in newest]
    assert write_scores(client, records, other, RETENTION_S) == len(set(card_of))
    got = {key.removeprefix(prefix): value for key, value in dump(client, prefix).items() if other not in key}
    want = {key.removeprefix(other): value for key, value in dump(client, other).items()}
    assert got == want
    assert any(stored[b"amount"].endswith(b".0") for stored in got.values()), "no whole amount: a weak check"

    # An int written as a float (the pipeline's scores once carried 1.525135586e+12), which the model takes:
    # validated one by one, stored alike.
    value = orjson.dumps(make_score(7).model_dump() | {"event_time_ms": float(T0_MS + 7000)})
    floated, validated = f"{prefix}floated:", f"{prefix}validated:"
    assert write_score_values(client, [value], floated, RETENTION_S) == 1
    assert write_scores(client, [ScoreRecord.model_validate_json(value)], validated, RETENTION_S) == 1
    got = {key.removeprefix(floated): value for key, value in dump(client, floated).items()}
    assert got == {key.removeprefix(validated): value for key, value in dump(client, validated).items()}
