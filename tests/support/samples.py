"""Sample events, records and simulated worlds shared across the tests."""

from __future__ import annotations

import datetime as dt
from typing import Any

from features.definitions import DAY_MS, FEATURE_COLUMNS
from ingest.simulator import SimulatorConfig
from ingest.tokens import card_token

#: A card token (of card "42" under key "k") and a valid transaction event of that card.
TOKEN = card_token("42", b"k")
GOOD = {
    "schema_version": 1,
    "tx_id": 17,
    "card_id": TOKEN,
    "terminal_id": "T-9",
    "amount": 57.25,
    "event_time_ms": 1_523_750_400_000,
}
#: A valid feature record: the transaction ``GOOD`` with coordinates, not late, a value for every feature.
FEATURE: dict[str, Any] = {
    **GOOD,
    "terminal_x": 1.5,
    "terminal_y": None,
    "late": False,
    "features": {name: float(i) / 3 for i, name in enumerate(FEATURE_COLUMNS)},
}

#: 45 days from 2018-04-01: 30 days of feature history, then train 7 / delay 7 / test 7 would not fit,
#: so the tests' default split starts after 24 days (short history is fine for tests).
SMALL = SimulatorConfig(customers=300, terminals=600, days=45, start=dt.date(2018, 4, 1), seed=3)
#: Labels known a week after their transactions.
LABEL_DELAY_MS = 7 * DAY_MS
