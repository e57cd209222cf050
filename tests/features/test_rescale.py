"""Re-keying the feature job's state into another layout: every card's history and waiting events, every
terminal's transactions and labels, land in the bucket the new layout routes them to, none lost or
repeated; every new card bucket gets the highest frontier."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import fields

import numpy as np
import pandas as pd

from features.buckets import card_bucket, terminal_buckets
from features.core import CardState, TerminalState
from features.rescale import rekey_cards, rekey_terminals
from features.rows import CARD_BUCKET, KIND, RowKind, decoded_fields, frame_of
from features.stages import CardBucket
from infra.kafka.offsets import NO_FRONTIER

T0 = 1_522_540_800_000
CARDS = [f"{i:08x}" + "ab" * 12 for i in range(0, 40 * 7919, 7919)]  # tokens: hex, spread over buckets
TERMINALS = [str(i) for i in range(30)]


def pending_of(cards: list[str], first_tx: int, bucket: int) -> pd.DataFrame:
    """Waiting events: a transaction and a label of each card."""
    n = len(cards)
    return frame_of(
        decoded_fields(),
        {
            KIND: [RowKind.TX, RowKind.LABEL] * n,
            "tx_id": np.repeat(np.arange(first_tx, first_tx + n), 2),
            "card_id": np.repeat(np.asarray(cards, dtype=object), 2),
            "terminal_id": np.repeat(np.asarray(TERMINALS[:n], dtype=object), 2),
            "event_time_ms": np.full(2 * n, T0 + 5_000),
            CARD_BUCKET: np.full(2 * n, bucket, dtype=np.int32),
        },
        2 * n,
    )


def layout_of_cards(count: int, frontiers: list[int]) -> list[CardBucket]:
    """``count`` card buckets holding CARDS as ``card_bucket`` routes them: three transactions each in
    history, two events waiting."""
    buckets = []
    for b in range(count):
        mine = [card for card in CARDS if card_bucket(card, count) == b]
        rows = np.repeat(np.asarray(mine, dtype=object), 3)
        tx_ids = np.asarray([CARDS.index(card) * 10 + k for card in mine for k in range(3)], dtype=np.int64)
        history = CardState(rows, T0 + tx_ids, tx_ids, tx_ids * 100)
        buckets.append(CardBucket(history, pending_of(mine, 10_000 + 100 * b, b), frontiers[b]))
    return buckets


def test_cards_land_in_their_new_buckets_none_lost_or_repeated() -> None:
    old = layout_of_cards(6, [T0 + 1_000] * 6)
    for count in (12, 3, 4, 1):
        new = rekey_cards(old, count)
        assert sorted(new) == list(range(count)), "every new bucket has a state (it needs its frontier)"
        for b, bucket in new.items():
            assert all(card_bucket(card, count) == b for card in bucket.history.card_id)
            assert all(card_bucket(card, count) == b for card in bucket.pending["card_id"])
            assert (bucket.pending[CARD_BUCKET] == b).all()
        assert history_rows(new.values()) == history_rows(old)
        waiting = pd.concat([b.pending for b in old]).drop(columns=CARD_BUCKET)
        rekeyed = pd.concat([b.pending for b in new.values()]).drop(columns=CARD_BUCKET)
        key = ["tx_id", KIND]
        pd.testing.assert_frame_equal(
            rekeyed.sort_values(key, ignore_index=True), waiting.sort_values(key, ignore_index=True)
        )


def history_rows(buckets: Iterable[CardBucket]) -> list[tuple[object, ...]]:
    """Every history entry of the buckets (card, event time, tx id, amount), sorted."""
    return sorted(
        entry
        for bucket in buckets
        for entry in zip(*(getattr(bucket.history, f.name) for f in fields(CardState)), strict=True)
    )


def test_every_new_card_bucket_gets_the_highest_frontier() -> None:
    """After a final micro-batch the old buckets' frontiers may differ: the highest keeps every event that
    one of them would judge late a late event, and releases no event behind a card's released history."""
    frontiers = [T0 + 1_000 + 7 * b for b in range(6)]
    new = rekey_cards(layout_of_cards(6, frontiers), 4)
    assert {bucket.frontier_ms for bucket in new.values()} == {max(frontiers)}
    assert rekey_cards([], 3)[2].frontier_ms == NO_FRONTIER


def terminal_state(terminals: list[str], offset: int) -> TerminalState:
    ids = np.asarray(terminals, dtype=object)
    tx_ids = np.arange(offset, offset + len(terminals), dtype=np.int64)
    return TerminalState(
        np.repeat(ids, 2),
        np.repeat(T0 + tx_ids, 2),
        ids,
        tx_ids,
        T0 + tx_ids,
        T0 + tx_ids + 7,
        tx_ids % 2 == 0,
    )


def test_terminals_land_in_their_new_buckets_none_lost_or_repeated() -> None:
    routed = terminal_buckets(pd.Series(TERMINALS), 6)
    old = [
        terminal_state([t for t, b in zip(TERMINALS, routed, strict=True) if b == k], 100 * k)
        for k in range(6)
    ]
    for count in (12, 3):
        new = rekey_terminals(old, count)
        for b, state in new.items():
            assert len(state), "empty buckets are left out"
            assert (terminal_buckets(pd.Series(state.terminal_id), count) == b).all()
            assert (terminal_buckets(pd.Series(state.label_terminal_id), count) == b).all()
        for name in ("terminal_id", "event_time_ms", "label_tx_id", "label_is_fraud", "label_known_at_ms"):
            before = sorted(np.concatenate([getattr(s, name) for s in old]).tolist())
            after = sorted(np.concatenate([getattr(s, name) for s in new.values()]).tolist())
            assert after == before, name
    assert rekey_terminals([], 3) == {}
