"""The peers' job: per-card count and mean amount over 1, 7 and 30 days of event time.

The project's card features by their definitions (``features/definitions.py``): for a transaction at t,
the card's transactions with event time in (t - n days, t], those at t ordered at or before it by tx id,
the transaction itself included; amounts summed in integer cents (rounded half to even), the mean as
cents / (count * 100). Every peer calls :func:`step` with the card's history as three plain lists (event
times, tx ids, cents, in (event time, tx id) order), which each keeps in its own kind of state.

Standard library only: the peers run this in virtualenvs of their own, without the project. It also holds
the options every peer takes (:func:`peer_parser`).
"""

from __future__ import annotations

import argparse
from typing import Any

DAY_MS = 86_400_000
WINDOW_DAYS = (1, 7, 30)
LONGEST_MS = WINDOW_DAYS[-1] * DAY_MS
#: The output's feature names, as the project's feature records name them.
COUNT_NAMES = tuple(f"card_nb_tx_{days}d" for days in WINDOW_DAYS)
MEAN_NAMES = tuple(f"card_avg_amount_{days}d" for days in WINDOW_DAYS)

History = list[list[int]]


def new_history() -> History:
    """An empty card history: event times, tx ids, cents."""
    return [[], [], []]


def step(history: History, event_time_ms: int, tx_id: int, amount: float) -> dict[str, Any]:
    """Add a transaction to its card's ``history`` (in place) and return its features.

    Out-of-order transactions are placed in order and see what is there (as the project's state does);
    history older than the longest window before the newest transaction is dropped.
    """
    times, ids, cents = history
    pos = len(times)
    while pos and (
        times[pos - 1] > event_time_ms or (times[pos - 1] == event_time_ms and ids[pos - 1] > tx_id)
    ):
        pos -= 1
    times.insert(pos, event_time_ms)
    ids.insert(pos, tx_id)
    cents.insert(pos, round(amount * 100))

    features: dict[str, Any] = {}
    count = total = 0
    j = pos
    for days, count_name, mean_name in zip(WINDOW_DAYS, COUNT_NAMES, MEAN_NAMES, strict=True):
        start = event_time_ms - days * DAY_MS
        while j >= 0 and times[j] > start:
            total += cents[j]
            count += 1
            j -= 1
        features[count_name] = count
        features[mean_name] = total / (count * 100)

    horizon = times[-1] - LONGEST_MS
    old = 0
    while times[old] <= horizon:
        old += 1
    if old:
        del times[:old], ids[:old], cents[:old]
    return features


def output(event: dict[str, Any], features: dict[str, Any]) -> dict[str, Any]:
    """The output record of a transaction event: its ids and event time, and its features (shaped like
    the project's feature records, so one reader reads every system's output)."""
    return {
        "tx_id": event["tx_id"],
        "card_id": event["card_id"],
        "event_time_ms": event["event_time_ms"],
        "features": features,
    }


def process(history: History, event: dict[str, Any]) -> dict[str, Any]:
    """:func:`step` for a transaction event as produced to the transactions topic; its output record."""
    return output(event, step(history, event["event_time_ms"], event["tx_id"], event["amount"]))


def peer_parser(doc: str | None) -> argparse.ArgumentParser:
    """A peer's argument parser (its docstring as help) with the options every peer takes: the broker, the
    input and output topics. Each peer's Kafka clients keep their library's defaults (lingers, fetch waits)."""
    parser = argparse.ArgumentParser(description=doc)
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--input", required=True, help="transactions topic")
    parser.add_argument("--output", required=True, help="output topic")
    return parser
