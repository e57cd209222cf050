"""Reads of the lookup store: an alert, a card's alerts and what is known of it, the recent alerts of all
cards; stored hashes back into records (a member whose alert hash has expired is skipped)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from contracts.records import AlertRecord, ScoreRecord
from contracts.redis_keys import (
    JSON_FIELDS,
    alert_key,
    card_alerts_key,
    card_features_key,
    card_score_key,
    recent_alerts_key,
)

#: Integer fields of the alert and score hashes (Redis returns text).
_INT_FIELDS = ("schema_version", "tx_id", "event_time_ms", "scored_at_ms", "model_version")


def get_alert(client: Any, tx_id: int, prefix: str = "") -> AlertRecord | None:
    """The stored alert of a transaction, or None (no alert, or expired)."""
    return _alert_from_hash(client.hgetall(alert_key(tx_id, prefix)))


def card_alerts(client: Any, card_id: str, prefix: str = "", limit: int = 100) -> list[AlertRecord]:
    """A card's stored alerts, newest (by event time) first."""
    tx_ids = client.zrevrange(card_alerts_key(card_id, prefix), 0, limit - 1)
    return _alerts_of(client, tx_ids, prefix)


def recent_alerts(
    client: Any, prefix: str = "", limit: int = 50, after_ms: int | None = None
) -> list[AlertRecord]:
    """The newest alerts of all cards, newest (by event time) first; only later than ``after_ms`` if given."""
    low = "-inf" if after_ms is None else f"({after_ms}"
    tx_ids = client.zrevrangebyscore(recent_alerts_key(prefix), "+inf", low, start=0, num=limit)
    return _alerts_of(client, tx_ids, prefix)


def card_known(client: Any, card_id: str, prefix: str = "") -> bool:
    """Whether anything (features, a score or alerts) is stored for the card."""
    keys = (
        card_features_key(card_id, prefix),
        card_score_key(card_id, prefix),
        card_alerts_key(card_id, prefix),
    )
    return int(client.exists(*keys)) > 0


def card_summary(client: Any, card_id: str, prefix: str = "", limit: int = 20) -> dict[str, Any]:
    """What is known about a card: latest features, latest score and newest alerts.

    Returns ``{"card_id", "features", "score", "alerts"}``: ``features`` is None or ``{"tx_id",
    "event_time_ms", "terminal_id", "amount", "late", "values": {feature: value}}`` (from the feature
    job's ``card_features_key``), ``score`` a :class:`ScoreRecord` or None, ``alerts`` newest first.
    """
    pipe = client.pipeline(transaction=False)
    pipe.hgetall(card_features_key(card_id, prefix))
    pipe.hgetall(card_score_key(card_id, prefix))
    raw_features, raw_score = pipe.execute()
    score = None
    if raw_score:
        score = ScoreRecord.model_validate({**_decode_hash(raw_score), "card_id": card_id})
    return {
        "card_id": card_id,
        "features": _features_from_hash(raw_features) if raw_features else None,
        "score": score,
        "alerts": card_alerts(client, card_id, prefix, limit),
    }


def _text(value: bytes | str) -> str:
    """Redis replies are bytes, or str from a client made with ``decode_responses=True``."""
    return value.decode() if isinstance(value, bytes) else value


def _decode_hash(raw: Mapping[Any, Any]) -> dict[str, Any]:
    decoded: dict[str, Any] = {}
    for key, value in raw.items():
        name = _text(key)
        if name in JSON_FIELDS:
            decoded[name] = orjson.loads(value)
        elif name in _INT_FIELDS:
            decoded[name] = int(value)
        else:
            decoded[name] = _text(value)
    return decoded


def _alert_from_hash(raw: Mapping[Any, Any]) -> AlertRecord | None:
    return AlertRecord.model_validate(_decode_hash(raw)) if raw else None


def _alerts_of(client: Any, tx_ids: list[Any], prefix: str) -> list[AlertRecord]:
    """The alerts of these tx ids in order, skipping any whose hash has expired."""
    if not tx_ids:
        return []
    pipe = client.pipeline(transaction=False)
    for tx_id in tx_ids:
        pipe.hgetall(alert_key(int(tx_id), prefix))
    return [alert for alert in map(_alert_from_hash, pipe.execute()) if alert is not None]


#: Fields of the feature job's ``card:{card_id}:features`` hash that describe the transaction, not a feature.
_FEATURE_HASH_META = ("tx_id", "event_time_ms", "terminal_id", "amount", "late")


def _features_from_hash(raw: Mapping[Any, Any]) -> dict[str, Any]:
    fields = {_text(key): _text(value) for key, value in raw.items()}
    return {
        "tx_id": int(fields.get("tx_id", 0)),
        "event_time_ms": int(fields.get("event_time_ms", 0)),
        "terminal_id": fields.get("terminal_id", ""),
        "amount": float(fields["amount"]) if fields.get("amount") else None,
        "late": fields.get("late") == "1",
        "values": {
            name: float(value) if value != "" else None
            for name, value in sorted(fields.items())
            if name not in _FEATURE_HASH_META
        },
    }
