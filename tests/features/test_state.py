"""State carried between calls: chunking invariance, allowed lateness, pruning and serialisation."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from contracts.events import TxColumns
from features.core import CardState, TerminalState, card_step, compute_features, terminal_step
from features.definitions import DAY_MS, EVENT_TIME_MS, KNOWN_AT_MS, TX_TIME_MS, FeatureParams
from tests.support.reference import random_case


def through_arrow(frame: pd.DataFrame) -> pd.DataFrame:
    """What the Spark wrapper does with a state frame: Arrow out, Arrow back in."""
    return pa.Table.from_pandas(frame, preserve_index=False).to_pandas()


def run_chunked(
    transactions: pd.DataFrame, labels: pd.DataFrame, params: FeatureParams, cuts: list[int]
) -> tuple[pd.DataFrame, pd.DataFrame, list[tuple[CardState, TerminalState]]]:
    """Feed ``transactions`` (in their row order) as chunks cut at ``cuts``, carrying the state.

    Each label goes with the first chunk by the end of which the latest event time seen has reached its
    known_at, so every transaction that may see it gets it in time (labels that no transaction may see
    go with the last chunk).

    Returns:
        Card features and terminal features sorted by tx_id, and the states after every chunk.
    """
    chunks = np.split(np.arange(len(transactions)), cuts)
    seen_until = np.maximum.accumulate(
        [int(transactions[EVENT_TIME_MS].iloc[chunk].max()) if len(chunk) else 0 for chunk in chunks]
    )
    label_chunk = np.minimum(
        np.searchsorted(seen_until, labels[KNOWN_AT_MS].to_numpy(), side="left"), len(chunks) - 1
    )
    card_state, terminal_state = CardState.empty(), TerminalState.empty()
    card_parts, terminal_parts, states = [], [], []
    for index, chunk in enumerate(chunks):
        batch = transactions.iloc[chunk]
        card_state = CardState.from_frame(through_arrow(card_state.to_frame()))
        tx_frame, label_frame = terminal_state.to_frames()
        terminal_state = TerminalState.from_frames(through_arrow(tx_frame), through_arrow(label_frame))
        card_state, card = card_step(card_state, batch, params)
        terminal_state, terminal = terminal_step(terminal_state, batch, labels[label_chunk == index], params)
        card_parts.append(card)
        terminal_parts.append(terminal)
        states.append((card_state, terminal_state))

    def joined(parts: list[pd.DataFrame]) -> pd.DataFrame:
        return pd.concat(parts).sort_values(TxColumns.TX_ID).reset_index(drop=True)

    return joined(card_parts), joined(terminal_parts), states


def in_event_order(transactions: pd.DataFrame) -> pd.DataFrame:
    return transactions.sort_values([EVENT_TIME_MS, TxColumns.TX_ID]).reset_index(drop=True)


def random_cuts(rng: np.random.Generator, n: int, n_chunks: int) -> list[int]:
    return sorted(int(cut) for cut in rng.integers(0, n + 1, n_chunks - 1))


@pytest.mark.parametrize("seed", range(5))
def test_chunks_in_event_order_give_exactly_the_one_call_result(seed: int) -> None:
    rng = np.random.default_rng(100 + seed)
    params = FeatureParams(label_delay_ms=int(rng.choice([0, DAY_MS, 7 * DAY_MS])))
    transactions, labels = random_case(rng, params, n=600, n_cards=5, n_terminals=4, span_days=90)
    transactions = in_event_order(transactions)

    one_card, one_terminal, _ = run_chunked(transactions, labels, params, cuts=[])
    card, terminal, _ = run_chunked(transactions, labels, params, random_cuts(rng, len(transactions), 25))

    pd.testing.assert_frame_equal(card, one_card, check_exact=True)
    pd.testing.assert_frame_equal(terminal, one_terminal, check_exact=True)
    batch = compute_features(transactions, labels, params).sort_values(TxColumns.TX_ID)
    pd.testing.assert_frame_equal(
        card, batch[card.columns].reset_index(drop=True), check_exact=True, check_like=True
    )


def test_single_row_chunks_split_every_tie() -> None:
    rng = np.random.default_rng(7)
    params = FeatureParams()
    transactions, labels = random_case(rng, params, n=250)
    transactions = in_event_order(transactions)

    one_card, one_terminal, _ = run_chunked(transactions, labels, params, cuts=[])
    card, terminal, _ = run_chunked(transactions, labels, params, list(range(1, len(transactions))))

    pd.testing.assert_frame_equal(card, one_card, check_exact=True)
    pd.testing.assert_frame_equal(terminal, one_terminal, check_exact=True)


def late_arrivals(
    rng: np.random.Generator, transactions: pd.DataFrame, allowed_lateness_ms: int
) -> pd.DataFrame:
    """Rows in an arrival order where each row is at most ``allowed_lateness_ms`` behind the latest seen."""
    arrival = transactions[EVENT_TIME_MS].to_numpy() + rng.integers(
        0, allowed_lateness_ms + 1, len(transactions)
    )
    return transactions.iloc[np.argsort(arrival, kind="stable")].reset_index(drop=True)


@pytest.mark.parametrize("seed", range(3))
def test_pruning_keeps_everything_a_row_within_the_lateness_needs(seed: int) -> None:
    """Rows arrive up to 2 days late; the pruned state must give what unbounded history gives."""
    rng = np.random.default_rng(200 + seed)
    lateness = 2 * DAY_MS
    params = FeatureParams(allowed_lateness_ms=lateness, label_delay_ms=3 * DAY_MS)
    transactions, labels = random_case(rng, params, n=600, n_cards=3, n_terminals=3, span_days=150)
    arriving = late_arrivals(rng, transactions, lateness)
    cuts = random_cuts(rng, len(arriving), 40)

    card, terminal, states = run_chunked(arriving, labels, params, cuts)
    unbounded = params.model_copy(update={"allowed_lateness_ms": 10_000 * DAY_MS})
    full_card, full_terminal, full_states = run_chunked(arriving, labels, unbounded, cuts)

    pd.testing.assert_frame_equal(card, full_card, check_exact=True)
    pd.testing.assert_frame_equal(terminal, full_terminal, check_exact=True)
    assert len(states[-1][0]) < len(full_states[-1][0])
    assert len(states[-1][1]) < len(full_states[-1][1])
    # The same late input with no allowed lateness loses history that some late row needed.
    no_lateness = params.model_copy(update={"allowed_lateness_ms": 0})
    short_card, _, _ = run_chunked(arriving, labels, no_lateness, cuts)
    assert not short_card.equals(full_card)


def test_state_holds_exactly_the_history_within_reach() -> None:
    """A long input: after every chunk the state is exactly the rows newer than the horizon."""
    rng = np.random.default_rng(3)
    params = FeatureParams(allowed_lateness_ms=DAY_MS // 2)
    n = 3000
    transactions, labels = random_case(rng, params, n=n, n_cards=20, n_terminals=10, span_days=365)
    transactions = in_event_order(transactions)
    cuts = list(range(60, n, 60))

    _, _, states = run_chunked(transactions, labels, params, cuts)

    times = transactions[EVENT_TIME_MS].to_numpy()
    first_labels = labels.sort_values([KNOWN_AT_MS, TxColumns.IS_FRAUD], ascending=[True, False])
    first_labels = first_labels.drop_duplicates(TxColumns.TX_ID)
    for end, (card_state, terminal_state) in zip([*cuts, n], states, strict=True):
        latest = int(times[:end].max())
        card_horizon = latest - params.card_history_ms
        terminal_horizon = latest - params.terminal_history_ms
        assert len(card_state) == int((times[:end] > card_horizon).sum())
        assert card_state.event_time_ms.min() > card_horizon
        assert len(terminal_state.event_time_ms) == int((times[:end] > terminal_horizon).sum())
        if len(terminal_state.label_tx_id):
            assert terminal_state.label_tx_time_ms.min() > terminal_horizon
        assert len(np.unique(terminal_state.label_tx_id)) == len(terminal_state.label_tx_id)
    # Bounded: about 30.5 of 365 days of card history and 37.5 days of terminal history.
    assert max(len(card) for card, _ in states) < n * 45 / 365
    assert max(len(terminal.event_time_ms) for _, terminal in states) < n * 55 / 365
    assert len(states[-1][1].label_tx_id) < len(first_labels) * 55 / 365


def test_state_round_trips_through_frames() -> None:
    rng = np.random.default_rng(5)
    params = FeatureParams()
    transactions, labels = random_case(rng, params, n=100)
    card_state, _ = card_step(CardState.empty(), transactions, params)
    terminal_state, _ = terminal_step(TerminalState.empty(), transactions, labels, params)

    card_frame = card_state.to_frame()
    assert list(card_frame.columns) == ["card_id", "event_time_ms", "tx_id", "amount_cents"]
    pd.testing.assert_frame_equal(CardState.from_frame(card_frame).to_frame(), card_frame)
    tx_frame, label_frame = terminal_state.to_frames()
    assert list(tx_frame.columns) == ["terminal_id", "event_time_ms"]
    assert list(label_frame.columns) == ["tx_id", "terminal_id", TX_TIME_MS, KNOWN_AT_MS, "is_fraud"]
    again = TerminalState.from_frames(tx_frame, label_frame).to_frames()
    pd.testing.assert_frame_equal(again[0], tx_frame)
    pd.testing.assert_frame_equal(again[1], label_frame)
    assert len(CardState.empty()) == 0
    assert len(TerminalState.empty()) == 0
