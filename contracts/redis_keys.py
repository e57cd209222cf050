"""The Redis keys the jobs write and alert consumers read, defined once: every key (each behind the job's
prefix, ``contracts.settings.redis_prefix``) and which fields of a stored record are JSON text."""

from __future__ import annotations

#: Fields of an alert hash stored as JSON text; the others are plain Redis strings.
JSON_FIELDS = ("features", "top_features", "contributions", "base_margin")


def stats_key(prefix: str = "") -> str:
    """Hash of the writers' counts (``<writer>:write_failures``)."""
    return f"{prefix}stats:redis"


def card_features_key(card_id: str, prefix: str = "") -> str:
    """Hash with the latest features of a card."""
    return f"{prefix}card:{card_id}:features"


def alert_key(tx_id: int, prefix: str = "") -> str:
    """Hash with the fields of one alert."""
    return f"{prefix}alert:{tx_id}"


def card_alerts_key(card_id: str, prefix: str = "") -> str:
    """Sorted set of a card's alerts: member tx_id, score event_time_ms."""
    return f"{prefix}card:{card_id}:alerts"


def card_score_key(card_id: str, prefix: str = "") -> str:
    """Hash with the latest score of a card (newest by (event_time_ms, tx_id))."""
    return f"{prefix}card:{card_id}:score"


def recent_alerts_key(prefix: str = "") -> str:
    """Sorted set of the newest alerts of all cards (tx_id by event_time_ms), bounded in size."""
    return f"{prefix}alerts:recent"
