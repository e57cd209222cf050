"""Hand-computed cases for every feature of the core, boundaries included."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from features import core
from features.core import (
    CardState,
    TerminalState,
    amount_to_cents,
    card_step,
    card_windows,
    compute_features,
    empty_labels,
    labels_from_fraud_flags,
    terminal_step,
    time_features,
    with_event_time_ms,
)
from features.definitions import DAY_MS, FEATURE_COLUMNS, HOUR_MS, FeatureParams
from tests.support.reference import random_case

D = 7 * DAY_MS  # the default label delay
CAP_S = 2_592_000.0  # 30 days in seconds
PARAMS = FeatureParams()


def at(year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0, ms: int = 0) -> int:
    """UTC milliseconds of a calendar moment."""
    return int(datetime(year, month, day, hour, minute, second, tzinfo=UTC).timestamp()) * 1000 + ms


T = at(2024, 1, 17, 12)  # a Wednesday noon


def txs(*rows: tuple[int, str, str, float, int]) -> pd.DataFrame:
    """Transactions from (tx_id, card_id, terminal_id, amount, event_time_ms) tuples."""
    return pd.DataFrame(rows, columns=["tx_id", "card_id", "terminal_id", "amount", "event_time_ms"])


def labels(*rows: tuple[int, str, int, int, bool]) -> pd.DataFrame:
    """Labels from (tx_id, terminal_id, tx_time_ms, known_at_ms, is_fraud) tuples."""
    frame = pd.DataFrame(rows, columns=["tx_id", "terminal_id", "tx_time_ms", "known_at_ms", "is_fraud"])
    return frame.astype(
        {"tx_id": np.int64, "tx_time_ms": np.int64, "known_at_ms": np.int64, "is_fraud": bool}
    )


def card_features(batch: pd.DataFrame, state: CardState | None = None) -> pd.DataFrame:
    _, features = card_step(state or CardState.empty(), batch, PARAMS)
    return features.set_index("tx_id")


def terminal_features(batch: pd.DataFrame, label_batch: pd.DataFrame | None = None) -> pd.DataFrame:
    _, features = terminal_step(TerminalState.empty(), batch, label_batch, PARAMS)
    return features.set_index("tx_id")


# --- card windows -------------------------------------------------------------------------------------


def test_card_window_excludes_a_transaction_exactly_one_day_earlier() -> None:
    features = card_features(
        txs(
            (1, "A", "x", 100.0, T - DAY_MS),
            (2, "A", "x", 20.0, T - DAY_MS + 1),
            (3, "A", "x", 40.0, T),
            (4, "B", "x", 7.0, T),
        )
    )

    assert features.loc[3, "card_nb_tx_1d"] == 2
    assert features.loc[3, "card_avg_amount_1d"] == 30.0
    assert features.loc[3, "card_nb_tx_7d"] == 3
    assert features.loc[3, "card_avg_amount_7d"] == 160.0 / 3
    assert features.loc[3, "card_nb_tx_30d"] == 3
    assert features.loc[2, "card_nb_tx_1d"] == 2  # tx 1 is 1 day - 1 ms earlier
    assert features.loc[2, "card_avg_amount_1d"] == 60.0
    assert features.loc[1, "card_nb_tx_1d"] == 1
    assert features.loc[1, "card_avg_amount_1d"] == 100.0
    assert features.loc[4, "card_nb_tx_30d"] == 1  # another card


def test_card_windows_of_7_and_30_days_have_exclusive_lower_bounds() -> None:
    features = card_features(
        txs(
            (1, "A", "x", 1.0, T - 30 * DAY_MS),
            (2, "A", "x", 2.0, T - 30 * DAY_MS + 1),
            (3, "A", "x", 4.0, T - 7 * DAY_MS),
            (4, "A", "x", 8.0, T - 7 * DAY_MS + 1),
            (5, "A", "x", 16.0, T),
        )
    )

    assert features.loc[5, "card_nb_tx_7d"] == 2
    assert features.loc[5, "card_avg_amount_7d"] == 12.0
    assert features.loc[5, "card_nb_tx_30d"] == 4
    assert features.loc[5, "card_avg_amount_30d"] == 30.0 / 4


def test_same_millisecond_is_ordered_by_tx_id() -> None:
    features = card_features(txs((9, "A", "x", 10.0, T), (4, "A", "x", 30.0, T)))

    assert features.loc[4, "card_nb_tx_1d"] == 1
    assert features.loc[4, "card_avg_amount_1d"] == 30.0
    assert features.loc[4, "card_nb_tx_1h"] == 1
    assert features.loc[4, "card_secs_since_prev_tx"] == CAP_S
    assert features.loc[9, "card_nb_tx_1d"] == 2
    assert features.loc[9, "card_avg_amount_1d"] == 20.0
    assert features.loc[9, "card_nb_tx_1h"] == 2
    assert features.loc[9, "card_secs_since_prev_tx"] == 0.0
    assert features.loc[9, "card_amount_ratio_30d"] == 0.5


def test_one_hour_window() -> None:
    features = card_features(
        txs((1, "A", "x", 1.0, T - HOUR_MS), (2, "A", "x", 1.0, T - HOUR_MS + 1), (3, "A", "x", 1.0, T))
    )

    assert features.loc[3, "card_nb_tx_1h"] == 2
    assert features.loc[3, "card_nb_tx_1d"] == 3


def test_seconds_since_previous_transaction_and_its_cap() -> None:
    features = card_features(
        txs(
            (1, "A", "x", 1.0, T),
            (2, "A", "x", 1.0, T + 90_500),
            (3, "A", "x", 1.0, T + 90_500 + 45 * DAY_MS),  # previous one is older than 30 days
            (4, "A", "x", 1.0, T + 90_500 + 75 * DAY_MS - 1),  # 30 days - 1 ms after the previous
        )
    )

    assert features.loc[1, "card_secs_since_prev_tx"] == CAP_S  # first transaction of the card
    assert features.loc[2, "card_secs_since_prev_tx"] == 90.5
    assert features.loc[3, "card_secs_since_prev_tx"] == CAP_S
    assert features.loc[4, "card_secs_since_prev_tx"] == 2_591_999.999


def test_amount_ratio_to_the_30_day_mean() -> None:
    features = card_features(
        txs(
            (1, "A", "x", 10.0, T),
            (2, "A", "x", 30.0, T + 1),
            (3, "A", "x", 0.0, T + 2),
            (4, "Z", "x", 0.0, T),
            (5, "Z", "x", 0.0, T + 1),
        )
    )

    assert features.loc[1, "card_amount_ratio_30d"] == 1.0
    assert features.loc[2, "card_amount_ratio_30d"] == 1.5
    assert features.loc[3, "card_amount_ratio_30d"] == 0.0
    assert features.loc[4, "card_amount_ratio_30d"] == 1.0  # mean 0
    assert features.loc[5, "card_amount_ratio_30d"] == 1.0


def test_amount_against_the_cards_earlier_transactions() -> None:
    features = card_features(
        txs(
            (1, "A", "x", 10.0, T),
            (2, "A", "x", 30.0, T + 1),
            (3, "A", "x", 40.0, T + 2),
            (4, "A", "x", 100.0, T + 3),
            (5, "A", "x", 50.0, T + 7 * DAY_MS + 2),  # its 7-day window starts after tx 3
            (6, "B", "x", 5.0, T),
            (7, "B", "x", 5.0, T + 1),
            (8, "B", "x", 9.0, T + 2),
        )
    )

    ratio_7d, zscore_7d = features["card_prior_amount_ratio_7d"], features["card_amount_zscore_7d"]
    ratio_30d, zscore_30d = features["card_prior_amount_ratio_30d"], features["card_amount_zscore_30d"]
    assert (ratio_7d[1], zscore_7d[1]) == (1.0, 0.0)  # no earlier transaction
    assert (ratio_7d[2], zscore_7d[2]) == (3.0, 0.0)  # one: no spread
    assert (ratio_7d[3], zscore_7d[3]) == (2.0, 2.0)  # earlier 10 and 30: mean 20, deviation 10
    # Earlier 10, 30, 40: mean 80/3, variance 2600/3 - (80/3)^2 = 1400/9.
    assert ratio_7d[4] == pytest.approx(3.75)
    assert zscore_7d[4] == pytest.approx(220 / 1400**0.5)
    assert (ratio_7d[5], zscore_7d[5]) == (0.5, 0.0)  # only tx 4 is in (t - 7 d, t)
    assert ratio_30d[5] == pytest.approx(50 / 45)
    assert zscore_30d[5] == pytest.approx(5 / 1125**0.5)  # mean 45, variance 12600/4 - 45^2
    assert (ratio_7d[8], zscore_7d[8]) == (1.8, 0.0)  # earlier amounts all equal
    assert ratio_7d[4] == ratio_30d[4]
    assert zscore_7d[4] == zscore_30d[4]


def test_unusual_amounts_are_counted_over_the_last_7_days_against_the_30_day_mean() -> None:
    usual = [(i, "A", "x", 10.0, T - (8 + i) * DAY_MS) for i in range(1, 21)]  # 9 to 28 days before T
    features = card_features(
        txs(
            *usual,
            (21, "A", "x", 50.0, T),  # unusual, but nothing earlier in 7 days is
            (22, "A", "x", 60.0, T + 1),  # earlier mean 250/21: 50 is over 3 times it
            (23, "A", "x", 10.0, T + 2),  # earlier mean 310/22: 50 and 60 are
            (24, "A", "x", 10.0, T + 8 * DAY_MS),  # its 7 days start after tx 23
            (31, "B", "x", 10.0, T),
            (32, "B", "x", 40.0, T + 1),
            (33, "B", "x", 0.0, T + 2),  # earlier mean 25: 40 is not over 75
            (34, "B", "x", 0.0, T + 3),  # earlier mean 50/3: 40 is not over 50 (exactly)
            (35, "B", "x", 1.0, T + 4),  # earlier mean 12.5: 40 is over 37.5
        )
    )

    unusual = features["card_nb_unusual_7d"]
    assert unusual.loc[[1, 20, 21, 22, 23, 24]].tolist() == [0, 0, 0, 1, 2, 0]
    assert unusual.loc[[31, 32, 33, 34, 35]].tolist() == [0, 0, 0, 0, 1]


@pytest.mark.parametrize("direct", [0, 1 << 22])
def test_unusual_amounts_are_counted_alike_one_by_one_or_by_blocks(
    direct: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A burst of one card in one batch is counted by blocks (n log n) past a bound on the comparisons one
    by one (n²), to the same counts."""
    rng = np.random.default_rng(7)
    amounts = rng.choice([1.0, 10.0, 100.0], size=60, p=[0.45, 0.45, 0.1])
    batch = txs(*[(i, "A" if i % 3 else "B", "x", float(amount), T + i) for i, amount in enumerate(amounts)])
    expected = card_features(batch)["card_nb_unusual_7d"]
    assert expected.max() > 0
    monkeypatch.setattr(core, "_UNUSUAL_DIRECT", direct)
    assert card_features(batch)["card_nb_unusual_7d"].tolist() == expected.tolist()


@settings(max_examples=200, deadline=None)
@given(
    values=st.lists(st.integers(-50, 50), min_size=1, max_size=70),
    queries=st.lists(st.tuples(st.integers(0, 70), st.integers(0, 70), st.integers(-60, 60)), max_size=30),
)
def test_counts_above_a_threshold_in_ranges_are_those_counted_one_by_one(
    values: list[int], queries: list[tuple[int, int, int]]
) -> None:
    array, n = np.asarray(values, dtype=np.int64), len(values)
    ranges = [(min(a, b, n), min(max(a, b), n), t) for a, b, t in queries]
    starts, stops, thresholds = (np.asarray([r[i] for r in ranges], dtype=np.int64) for i in range(3))

    counts = core._counts_above(array, starts, stops, thresholds)

    assert counts.tolist() == [int((array[a:b] > t).sum()) for a, b, t in ranges]


def test_amounts_are_summed_in_cents() -> None:
    features = card_features(txs((1, "A", "x", 0.1, T), (2, "A", "x", 0.2, T + 1), (3, "A", "x", 0.3, T + 2)))

    # In floats 0.1 + 0.2 + 0.3 != 0.6; in cents 60 / 3 / 100 is exactly 0.2.
    assert features.loc[3, "card_avg_amount_1d"] == 0.2
    assert features.loc[3, "card_amount_ratio_30d"] == 1.5


def test_amount_to_cents_rounds_like_python() -> None:
    amounts = [1.005, 0.125, 2.675, 0.29, 999_999.99, 0.0]
    assert amount_to_cents(amounts).tolist() == [round(a * 100) for a in amounts]
    with pytest.raises(ValueError, match="finite"):
        amount_to_cents([1.0, float("nan")])


def test_late_row_sees_only_what_is_ordered_before_it() -> None:
    state, _ = card_step(CardState.empty(), txs((1, "A", "x", 10.0, T), (2, "A", "x", 20.0, T + HOUR_MS)))

    _, late = card_step(state, txs((3, "A", "x", 40.0, T + HOUR_MS // 2)))

    assert late["card_nb_tx_1d"].tolist() == [2]
    assert late["card_avg_amount_1d"].tolist() == [25.0]
    assert late["card_secs_since_prev_tx"].tolist() == [1800.0]


def test_card_state_is_pruned_to_the_longest_window() -> None:
    state, _ = card_step(
        CardState.empty(),
        txs(
            (1, "A", "x", 1.0, T - 30 * DAY_MS),
            (2, "B", "x", 1.0, T - 30 * DAY_MS + 1),
            (3, "C", "x", 1.0, T),
        ),
    )
    assert sorted(state.tx_id.tolist()) == [2, 3]


@pytest.mark.parametrize("seed", range(5))
def test_card_windows_hold_what_card_step_counts_for_the_cards_latest_transaction(seed: int) -> None:
    """At each card's latest transaction, the windows of its state are that transaction's card features."""
    transactions, _ = random_case(np.random.default_rng(seed), PARAMS)
    state, features = card_step(CardState.empty(), transactions, PARAMS)
    everything = CardState.from_frame(
        transactions.assign(amount_cents=amount_to_cents(transactions["amount"]))
    )
    ordered = transactions.assign(row=np.arange(len(transactions))).sort_values(["event_time_ms", "tx_id"])
    for card, last in ordered.groupby("card_id").tail(1).set_index("card_id")["row"].items():
        at_ms = int(transactions["event_time_ms"].iloc[last])
        windows = card_windows(everything, card, at_ms, PARAMS).set_index("count_column")
        want = features.iloc[last]
        for days in PARAMS.window_days:
            row = windows.loc[f"card_nb_tx_{days}d"]
            assert row["nb_tx"] == want[f"card_nb_tx_{days}d"]
            assert row["avg_amount"] == want[f"card_avg_amount_{days}d"]
            assert row["mean_column"] == f"card_avg_amount_{days}d"
        assert windows.loc["card_nb_tx_1h", "nb_tx"] == want["card_nb_tx_1h"]
        if at_ms >= int(transactions["event_time_ms"].max()):  # the pruned state keeps what it needs
            pd.testing.assert_frame_equal(
                card_windows(state, card, at_ms, PARAMS).set_index("count_column"), windows
            )


@pytest.mark.parametrize("seed", range(3))
def test_categorical_keys_give_what_their_strings_give(seed: int) -> None:
    """The streaming job hands the core each state's keys as a categorical (codes into the distinct keys, one
    of them unused here): the features and the state after a step are those of the same keys as strings."""
    transactions, label_rows = random_case(np.random.default_rng(seed), PARAMS)
    first, second = transactions.iloc[:200], transactions.iloc[200:].reset_index(drop=True)
    card_history, _ = card_step(CardState.empty(), first, PARAMS)
    terminals, _ = terminal_step(TerminalState.empty(), first, label_rows.iloc[:40], PARAMS)

    def categorical(keys: np.ndarray) -> pd.Categorical:
        return pd.Categorical(keys, categories=[*sorted(set(keys)), "unused"])

    as_categories = (
        replace(card_history, card_id=categorical(card_history.card_id)),
        replace(
            terminals,
            terminal_id=categorical(terminals.terminal_id),
            label_terminal_id=categorical(terminals.label_terminal_id),
        ),
    )
    label_rest = label_rows.iloc[40:].reset_index(drop=True)
    for cards, terms in ((card_history, terminals), as_categories):
        card_after, card_out = card_step(cards, second, PARAMS)
        terminal_after, terminal_out = terminal_step(terms, second, label_rest, PARAMS)
        if cards is card_history:
            want = (card_after, card_out, terminal_after, terminal_out)
            continue
        pd.testing.assert_frame_equal(card_out, want[1])
        pd.testing.assert_frame_equal(terminal_out, want[3])
        assert isinstance(card_after.card_id, pd.Categorical)
        pd.testing.assert_frame_equal(
            card_after.to_frame().astype({"card_id": object}), want[0].to_frame().astype({"card_id": object})
        )
        for got, expected in zip(terminal_after.to_frames(), want[2].to_frames(), strict=True):
            pd.testing.assert_frame_equal(
                got.astype({"terminal_id": object}), expected.astype({"terminal_id": object})
            )


def test_card_windows_of_a_quiet_card_are_empty() -> None:
    state, _ = card_step(CardState.empty(), txs((1, "A", "x", 10.0, T), (2, "B", "x", 20.0, T + 2 * DAY_MS)))

    windows = card_windows(state, "A", T + 2 * DAY_MS, PARAMS).set_index("count_column")

    assert windows["nb_tx"].tolist() == [0, 0, 1, 1]
    assert windows["amount_cents"].tolist() == [0, 0, 1000, 1000]
    assert np.isnan(windows.loc["card_nb_tx_1d", "avg_amount"])
    assert windows.loc["card_nb_tx_7d", "avg_amount"] == 10.0
    assert windows["window_ms"].tolist() == [HOUR_MS, DAY_MS, 7 * DAY_MS, 30 * DAY_MS]
    assert card_windows(state, "C", T, PARAMS)["nb_tx"].tolist() == [0, 0, 0, 0]


def test_card_output_follows_the_batch_row_order_and_int_keys_work() -> None:
    batch = txs(*[(i, f"c{i % 3}", "x", float(i), T + (7 - i) * 1000) for i in range(8)])
    by_str = card_step(CardState.empty(), batch)[1]
    by_int = card_step(CardState.empty(), batch.assign(card_id=batch["card_id"].str[1:].astype(np.int64)))[1]

    assert by_str["tx_id"].tolist() == batch["tx_id"].tolist()
    assert by_str.index.tolist() == list(range(8))
    pd.testing.assert_frame_equal(by_int, by_str)
    assert by_str.loc[0, "card_nb_tx_1d"] == 3  # tx 0 is the latest of card c0 (tx 0, 3, 6)


def test_empty_batches() -> None:
    empty = txs()
    state, card = card_step(CardState.empty(), empty)
    assert len(card) == 0
    assert list(card.columns) == ["tx_id", *PARAMS.card_feature_columns]
    assert len(state) == 0
    terminal_state, terminal = terminal_step(TerminalState.empty(), empty, empty_labels())
    assert list(terminal.columns) == ["tx_id", *PARAMS.terminal_feature_columns]
    assert len(terminal_state) == 0


# --- terminal windows ---------------------------------------------------------------------------------


def test_terminal_window_ends_the_label_delay_before_the_transaction() -> None:
    features = terminal_features(
        txs(
            (1, "a", "X", 1.0, T - D),  # upper bound t - d: included
            (2, "b", "X", 1.0, T - D + 1),  # after t - d: excluded
            (3, "c", "X", 1.0, T - D - DAY_MS),  # lower bound of 1d: excluded; in 7d
            (4, "e", "X", 1.0, T - D - DAY_MS + 1),
            (5, "f", "X", 1.0, T - D - 30 * DAY_MS),  # lower bound of 30d: excluded
            (6, "g", "X", 1.0, T - D - 30 * DAY_MS + 1),
            (7, "h", "Y", 1.0, T - D),  # another terminal
            (8, "q", "X", 1.0, T),
        )
    )

    assert features.loc[8, ["terminal_nb_tx_1d", "terminal_nb_tx_7d", "terminal_nb_tx_30d"]].tolist() == [
        2,
        3,
        4,
    ]
    assert features.loc[8, ["terminal_risk_1d", "terminal_risk_7d", "terminal_risk_30d"]].tolist() == [
        0,
        0,
        0,
    ]


def test_terminal_risk_counts_labels_known_by_the_transaction_time() -> None:
    batch = txs(
        (1, "a", "X", 1.0, T - D),
        (3, "c", "X", 1.0, T - D - DAY_MS),
        (4, "e", "X", 1.0, T - D - DAY_MS + 1),
        (6, "g", "X", 1.0, T - D - 30 * DAY_MS + 1),
        (8, "q", "X", 1.0, T),
    )
    label_batch = labels(
        (1, "X", T - D, T, True),  # known exactly at t: counts
        (4, "X", T - D - DAY_MS + 1, T + 1, True),  # known 1 ms after t: does not
        (3, "X", T - D - DAY_MS, T - DAY_MS, True),  # known after the default delay: counts in 7d
        (6, "X", T - D - 30 * DAY_MS + 1, T - 20 * DAY_MS, False),  # not fraud
    )

    features = terminal_features(batch, label_batch)

    assert features.loc[8, "terminal_risk_1d"] == 1 / 2
    assert features.loc[8, "terminal_risk_7d"] == 2 / 3
    assert features.loc[8, "terminal_risk_30d"] == 2 / 4
    frauds = ["terminal_nb_fraud_1d", "terminal_nb_fraud_7d", "terminal_nb_fraud_30d"]
    assert features.loc[8, frauds].tolist() == [1, 2, 2]  # the counts behind those shares


def test_days_since_the_terminals_first_known_fraud() -> None:
    batch = txs((8, "q", "X", 1.0, T), (9, "r", "X", 1.0, T + 2), (10, "s", "Y", 1.0, T))
    label_batch = labels(
        (1, "X", T - D - 20 * DAY_MS, T - 20 * DAY_MS, True),  # 27 days before t, known
        (2, "X", T - D - 25 * DAY_MS, T + 1, True),  # earlier, but known only after tx 8
        (3, "X", T - D - 30 * DAY_MS, T - 29 * DAY_MS, True),  # on the window's open lower bound
        (4, "X", T - D - 29 * DAY_MS, T - 28 * DAY_MS, False),  # not fraud
    )

    features = terminal_features(batch, label_batch)["terminal_days_since_first_fraud"]

    assert features[8] == 27.0
    assert features[9] == (32 * DAY_MS + 2) / DAY_MS  # label 2 is known by then
    assert features[10] == 37.0  # none: the window plus the delay


def test_terminal_risk_is_zero_without_transactions() -> None:
    features = terminal_features(txs((1, "a", "X", 1.0, T)), labels((0, "X", T - D - 1, T - 5, True)))

    nb_tx_and_risk = [f"terminal_{kind}_{days}d" for days in (1, 7, 30) for kind in ("nb_tx", "risk")]
    assert features.loc[1, nb_tx_and_risk].tolist() == [0, 0.0, 0, 0.0, 0, 0.0]
    # The known fraud counts, whether or not its transaction was seen.
    assert features.loc[1, ["terminal_nb_fraud_1d", "terminal_nb_fraud_7d"]].tolist() == [1, 1]


def test_duplicate_labels_count_once_and_the_first_known_decides() -> None:
    batch = txs((1, "a", "X", 1.0, T - D - 5), (2, "b", "X", 1.0, T - D - 6), (8, "q", "X", 1.0, T))
    label_batch = labels(
        (1, "X", T - D - 5, T - 10, True),
        (1, "X", T - D - 5, T - 3, True),  # duplicate: counts once
        (2, "X", T - D - 6, T - 5, False),  # first known: not fraud ...
        (2, "X", T - D - 6, T - 1, True),  # ... so this later one is ignored
    )

    features = terminal_features(batch, label_batch)

    assert features.loc[8, "terminal_nb_tx_1d"] == 2
    assert features.loc[8, "terminal_risk_1d"] == 1 / 2


def test_label_may_arrive_before_its_transaction() -> None:
    params = PARAMS
    fraud = labels((1, "X", T - D - 5, T - D, True))
    state, _ = terminal_step(TerminalState.empty(), txs(), fraud, params)  # no transaction yet
    state, _ = terminal_step(state, txs((1, "a", "X", 1.0, T - D - 5)), None, params)
    state, features = terminal_step(state, txs((8, "q", "X", 1.0, T)), None, params)

    assert features["terminal_risk_1d"].tolist() == [1.0]
    assert len(state.label_tx_id) == 1


def test_terminal_state_keeps_labels_and_transactions_within_reach() -> None:
    state, _ = terminal_step(
        TerminalState.empty(),
        txs(
            (1, "a", "X", 1.0, T - 37 * DAY_MS),
            (2, "b", "X", 1.0, T - 37 * DAY_MS + 1),
            (3, "c", "Y", 1.0, T),
        ),
        labels((1, "X", T - 37 * DAY_MS, T - 30 * DAY_MS, True), (2, "X", T - 37 * DAY_MS + 1, T, True)),
    )

    assert state.event_time_ms.tolist() == [T - 37 * DAY_MS + 1, T]
    assert state.label_tx_id.tolist() == [2]


def test_terminal_output_follows_the_batch_row_order() -> None:
    batch = txs(*[(i, "a", f"t{i % 2}", 1.0, T + (9 - i) * DAY_MS) for i in range(10)])
    _, features = terminal_step(TerminalState.empty(), batch, None, PARAMS)

    assert features["tx_id"].tolist() == list(range(10))
    assert features.loc[0, "terminal_nb_tx_7d"] == 1  # t0 at T + 9d sees t0's tx 8 at T + 1d only


# --- time features ------------------------------------------------------------------------------------


def test_weekend_and_night() -> None:
    times = [
        at(2024, 1, 19, 23, 59, 59, 999),  # Friday
        at(2024, 1, 20),  # Saturday
        at(2024, 1, 21, 23, 59, 59, 999),  # Sunday
        at(2024, 1, 22),  # Monday
        at(2024, 1, 22, 6, 59, 59, 999),
        at(2024, 1, 22, 7),
        at(1999, 12, 31, 12),  # a Friday before 2000, still right
    ]

    features = time_features(np.array(times))

    assert features["is_weekend"].tolist() == [0, 1, 1, 0, 0, 0, 0]
    assert features["is_night"].tolist() == [0, 1, 0, 1, 1, 0, 0]
    assert features["is_night"].dtype == np.int64


# --- batch path -----------------------------------------------------------------------------------------


def test_compute_features_sorts_by_event_time_then_tx_id() -> None:
    table = txs((5, "A", "X", 10.0, T), (2, "A", "X", 30.0, T), (1, "B", "Y", 5.0, T - 1))
    table["is_fraud"] = [False, True, False]

    features = compute_features(table, labels_from_fraud_flags(table, D), PARAMS)

    assert list(features.columns) == ["tx_id", *FEATURE_COLUMNS]
    assert features["tx_id"].tolist() == [1, 2, 5]
    assert features.index.tolist() == [0, 1, 2]
    assert features["card_nb_tx_1d"].tolist() == [1, 1, 2]
    assert features["card_avg_amount_1d"].tolist() == [5.0, 30.0, 20.0]


def test_compute_features_without_labels_and_with_foreign_labels() -> None:
    table = txs((1, "A", "X", 10.0, T - D), (2, "A", "X", 10.0, T))
    foreign = labels((99, "elsewhere", T - D, T - D, True))

    without = compute_features(table, None, PARAMS)
    with_foreign = compute_features(table, foreign, PARAMS)

    pd.testing.assert_frame_equal(without, with_foreign)
    assert without["terminal_nb_tx_1d"].tolist() == [0, 1]
    assert without["terminal_risk_1d"].tolist() == [0.0, 0.0]


def test_labels_from_fraud_flags() -> None:
    table = txs((1, "A", "X", 1.0, T), (2, "B", "Y", 1.0, T + 5))
    table["is_fraud"] = [0, 1]

    result = labels_from_fraud_flags(table, D)

    assert result.to_dict("records") == [
        {
            "tx_id": 2,
            "terminal_id": "Y",
            "tx_time_ms": T + 5,
            "known_at_ms": T + 5 + D,
            "is_fraud": True,
            "card_id": "B",
        }
    ]


def test_with_event_time_ms_from_an_aware_datetime() -> None:
    table = pd.DataFrame(
        {"event_time": pd.to_datetime([T, T + 1], unit="ms", utc=True).tz_convert("Europe/Paris")}
    )

    assert with_event_time_ms(table)["event_time_ms"].tolist() == [T, T + 1]
    with pytest.raises(ValueError, match="timezone-aware"):
        with_event_time_ms(pd.DataFrame({"event_time": pd.to_datetime([T], unit="ms")}))
