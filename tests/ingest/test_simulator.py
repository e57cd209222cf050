"""Unit tests of the handbook transaction simulator: determinism, structure, and its statistics.

The statistical checks compare the default (handbook-sized) run with expectations computed from the
generative process, conditional on the drawn profiles; the bounds are about five standard deviations
wide, so they hold for any seed in practice yet fail for a wrong rate, window or share.
"""

from __future__ import annotations

import datetime as dt
import math
import pathlib
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np
import numpy.typing as npt
import pandas as pd
import pydantic
import pytest

from contracts.events import TxColumns
from ingest.simulator import (
    Compromises,
    Profiles,
    SimulatorConfig,
    simulate,
    simulate_compromises,
    simulate_profiles,
    write_parquet,
)

SMALL = SimulatorConfig(customers=300, terminals=600, days=20, seed=7)
_NORMAL = NormalDist()
#: P(0 < int(X) < 86400) for X ~ N(43200, 20000): int() truncates, so X must lie in [1, 86400).
P_TIME_KEPT = _NORMAL.cdf((86_400 - 43_200) / 20_000) - _NORMAL.cdf((1 - 43_200) / 20_000)
#: amount / mean is 1 + Z / 2 for Z >= -2, else U(0, 2): its mean is 1 + phi(2) / 2 and its second
#: moment 1.25 Phi(2) + phi(2) / 2 + Phi(-2) * 4 / 3.
_PHI2 = math.exp(-2) / math.sqrt(2 * math.pi)
AMOUNT_RATIO_MEAN = 1 + _PHI2 / 2
AMOUNT_RATIO_STD = math.sqrt(
    1.25 * _NORMAL.cdf(2) + _PHI2 / 2 + _NORMAL.cdf(-2) * 4 / 3 - AMOUNT_RATIO_MEAN**2
)


@dataclass(frozen=True)
class Run:
    config: SimulatorConfig
    frame: pd.DataFrame
    profiles: Profiles
    compromises: Compromises
    day: npt.NDArray[np.int64]


@pytest.fixture(scope="module")
def run() -> Run:
    config = SimulatorConfig()
    frame = simulate(config)
    start = pd.Timestamp(config.start, tz="UTC")
    day = ((frame[TxColumns.EVENT_TIME] - start) // pd.Timedelta(days=1)).to_numpy(np.int64)
    return Run(config, frame, simulate_profiles(config), simulate_compromises(config), day)


def _rates(run: Run) -> npt.NDArray[np.float64]:
    """Expected transactions per day of each customer (zero without a terminal in reach)."""
    rate = run.profiles.mean_tx_per_day * P_TIME_KEPT
    return np.where(run.profiles.reach_counts > 0, rate, 0.0)


def _event_ms(frame: pd.DataFrame) -> npt.NDArray[np.int64]:
    """Event times as UTC epoch milliseconds."""
    naive = frame[TxColumns.EVENT_TIME].dt.tz_convert(None).to_numpy()
    return naive.astype("datetime64[ms]").astype(np.int64)


def _assert_near(observed: float, expected: float, sigma: float, what: str) -> None:
    assert abs(observed - expected) < 5 * sigma, f"{what}: {observed} vs expected {expected} +- {sigma}"


# --- configuration ------------------------------------------------------------------------------


def test_config_defaults_are_the_handbook_run() -> None:
    config = SimulatorConfig()
    assert (config.customers, config.terminals, config.days) == (5000, 10000, 183)
    assert (config.start, config.radius, config.seed) == (dt.date(2018, 4, 1), 5.0, 0)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"customers": 0},
        {"terminals": -1},
        {"days": 0},
        {"radius": 0.0},
        {"radius": float("nan")},
        {"seed": -1},
        {"start": dt.date(1999, 12, 31)},
        {"start": dt.date(2099, 12, 1), "days": 40},
        {"customer": 10},
    ],
)
def test_config_rejects_invalid_values(kwargs: dict[str, object]) -> None:
    with pytest.raises(pydantic.ValidationError):
        SimulatorConfig.model_validate(kwargs)


def test_config_is_frozen() -> None:
    with pytest.raises(pydantic.ValidationError):
        SimulatorConfig().days = 3  # type: ignore[misc]


# --- determinism and output format --------------------------------------------------------------


def test_same_seed_gives_byte_identical_parquet(tmp_path: pathlib.Path) -> None:
    first, second = tmp_path / "first.parquet", tmp_path / "second.parquet"
    write_parquet(simulate(SMALL), first)
    write_parquet(simulate(SMALL), second)
    assert first.read_bytes() == second.read_bytes()


def test_different_seed_gives_different_output(tmp_path: pathlib.Path) -> None:
    first, second = tmp_path / "first.parquet", tmp_path / "second.parquet"
    write_parquet(simulate(SMALL), first)
    write_parquet(simulate(SMALL.model_copy(update={"seed": 8})), second)
    assert first.read_bytes() != second.read_bytes()


def test_parquet_round_trips_without_pandas_metadata(tmp_path: pathlib.Path) -> None:
    import pyarrow.parquet as pq

    frame = simulate(SMALL)
    path = tmp_path / "tx.parquet"
    write_parquet(frame, path)
    assert pq.read_schema(path).metadata is None or b"pandas" not in pq.read_schema(path).metadata
    pd.testing.assert_frame_equal(pd.read_parquet(path), frame)


def test_profiles_do_not_depend_on_the_number_of_days() -> None:
    short = simulate_profiles(SMALL.model_copy(update={"days": 1}))
    long = simulate_profiles(SMALL)
    assert np.array_equal(short.customer_xy, long.customer_xy)
    assert np.array_equal(short.reach_indices, long.reach_indices)


# --- structure ----------------------------------------------------------------------------------


def test_columns_and_dtypes(run: Run) -> None:
    expected = {
        TxColumns.TX_ID: "int64",
        TxColumns.CARD_ID: "int64",
        TxColumns.TERMINAL_ID: "int64",
        TxColumns.AMOUNT: "float64",
        TxColumns.EVENT_TIME: "datetime64[ms, UTC]",
        TxColumns.IS_FRAUD: "int8",
        TxColumns.FRAUD_SCENARIO: "int8",
        TxColumns.TERMINAL_X: "float64",
        TxColumns.TERMINAL_Y: "float64",
    }
    assert {name: str(dtype) for name, dtype in run.frame.dtypes.items()} == expected
    assert isinstance(run.frame.index, pd.RangeIndex)


def test_tx_ids_follow_event_time_with_deterministic_ties(run: Run) -> None:
    frame = run.frame
    assert np.array_equal(frame[TxColumns.TX_ID].to_numpy(), np.arange(len(frame)))
    time = _event_ms(frame)
    assert np.all(np.diff(time) >= 0)
    tied = np.diff(time) == 0
    assert tied.any(), "a run this size has transactions in the same second"
    assert np.all(np.diff(frame[TxColumns.CARD_ID].to_numpy())[tied] >= 0), "ties not broken by card"


def test_times_lie_inside_the_simulated_days(run: Run) -> None:
    event_ms = _event_ms(run.frame)
    seconds = (event_ms // 1000) % 86_400
    assert run.day.min() == 0
    assert run.day.max() == run.config.days - 1
    assert seconds.min() > 0
    assert np.all(event_ms % 1000 == 0)
    # Time of day ~ N(43200, 20000), truncated symmetrically: the mean stays at noon.
    _assert_near(float(seconds.mean()), 43_200.0, 20_000 / math.sqrt(len(seconds)), "time of day")


def test_amounts_are_non_negative_whole_cents(run: Run) -> None:
    amount = run.frame[TxColumns.AMOUNT].to_numpy()
    assert amount.min() >= 0
    cents = amount * 100
    assert np.all(np.abs(cents - np.round(cents)) < 1e-6)


def test_terminals_are_strictly_within_reach(run: Run) -> None:
    frame, profiles = run.frame, run.profiles
    card = frame[TxColumns.CARD_ID].to_numpy()
    terminal = frame[TxColumns.TERMINAL_ID].to_numpy()
    terminal_xy = frame[[TxColumns.TERMINAL_X, TxColumns.TERMINAL_Y]].to_numpy()
    assert np.array_equal(terminal_xy, profiles.terminal_xy[terminal])
    distance = np.sqrt(np.sum(np.square(profiles.customer_xy[card] - terminal_xy), axis=1))
    assert distance.max() < run.config.radius


@pytest.mark.parametrize(
    "config",
    [
        SimulatorConfig(customers=200, terminals=700, radius=7.5, seed=3),
        SimulatorConfig(customers=300, terminals=40_000, seed=4),  # on a square of side 200
    ],
)
def test_reachability_matches_brute_force_distances(config: SimulatorConfig) -> None:
    profiles = simulate_profiles(config)
    assert profiles.terminal_xy.max() > 0.75 * config.area_size
    for customer in range(config.customers):
        diff = profiles.customer_xy[customer] - profiles.terminal_xy
        expected = np.flatnonzero(np.sqrt(np.sum(np.square(diff), axis=1)) < config.radius)
        reached = profiles.reach_indices[
            profiles.reach_indptr[customer] : profiles.reach_indptr[customer + 1]
        ]
        assert np.array_equal(reached, expected)


def test_more_terminals_than_the_handbooks_keep_its_reach_per_customer() -> None:
    """Terminals stay as dense as in the handbook's run: a customer reaches about as many, not a share of all."""
    assert SimulatorConfig().area_size == 100.0 and SimulatorConfig(terminals=4000).area_size == 100.0
    assert SimulatorConfig(terminals=40_000).area_size == 200.0
    handbook = simulate_profiles(SimulatorConfig(customers=2000))
    grown = simulate_profiles(SimulatorConfig(customers=8000, terminals=160_000))
    handbook_reach, grown_reach = handbook.reach_counts.mean(), grown.reach_counts.mean()
    # pi * 5^2 / 100^2 of 10,000 terminals (78.5), less at the square's edges: 75 and 77 with these seeds.
    assert 65 < handbook_reach < 80 and abs(grown_reach - handbook_reach) < 0.05 * handbook_reach


def test_customers_without_terminals_in_reach_make_no_transactions() -> None:
    config = SimulatorConfig(customers=400, terminals=100, days=10, radius=3.0, seed=1)
    profiles = simulate_profiles(config)
    unreachable = np.flatnonzero(profiles.reach_counts == 0)
    assert unreachable.size > 100
    assert not np.isin(simulate(config)[TxColumns.CARD_ID].to_numpy(), unreachable).any()


# --- statistics of the process (default, handbook-sized run) ------------------------------------


def test_transaction_counts_match_the_poisson_rates(run: Run) -> None:
    rates = _rates(run)
    days = run.config.days
    expected_total = days * rates.sum()
    _assert_near(len(run.frame), expected_total, math.sqrt(expected_total), "transactions")
    per_day = np.bincount(run.day, minlength=days)
    assert np.all(np.abs(per_day - rates.sum()) < 6 * math.sqrt(rates.sum())), "a day is off"
    # Per card, counts are Poisson(days * rate): Pearson's statistic has mean k and sd sqrt(2k).
    per_card = np.bincount(run.frame[TxColumns.CARD_ID].to_numpy(), minlength=run.config.customers)
    active = rates > 0
    pearson = float(np.sum((per_card[active] - days * rates[active]) ** 2 / (days * rates[active])))
    _assert_near(pearson, float(active.sum()), math.sqrt(2 * active.sum()), "per-card dispersion")


def test_terminals_are_chosen_uniformly_in_reach(run: Run) -> None:
    counts = run.frame.groupby([TxColumns.CARD_ID, TxColumns.TERMINAL_ID]).size()
    card = counts.index.get_level_values(0).to_numpy()
    n_card = np.bincount(card, weights=counts.to_numpy(), minlength=run.config.customers)
    k_card = run.profiles.reach_counts.astype(np.float64)
    # Pearson's statistic of a uniform multinomial over k terminals: sum O^2 * k / n - n, mean k - 1.
    squares = np.bincount(card, weights=counts.to_numpy() ** 2, minlength=run.config.customers)
    used = n_card > 0
    pearson = float(np.sum(squares[used] * k_card[used] / n_card[used] - n_card[used]))
    dof = float(np.sum(k_card[used] - 1))
    _assert_near(pearson, dof, math.sqrt(2 * dof), "terminal choice")


def test_amounts_follow_each_customers_profile(run: Run) -> None:
    frame = run.frame
    legit_amount = frame[TxColumns.FRAUD_SCENARIO].to_numpy() != 3
    card = frame[TxColumns.CARD_ID].to_numpy()[legit_amount]
    ratio = frame[TxColumns.AMOUNT].to_numpy()[legit_amount] / run.profiles.mean_amount[card]
    sigma = AMOUNT_RATIO_STD / math.sqrt(ratio.size)
    _assert_near(float(ratio.mean()), AMOUNT_RATIO_MEAN, sigma, "amount / mean")
    _assert_near(float(ratio.std()), AMOUNT_RATIO_STD, 2 * sigma, "amount / mean spread")


def test_fraud_labels_are_consistent(run: Run) -> None:
    scenario = run.frame[TxColumns.FRAUD_SCENARIO].to_numpy()
    assert set(np.unique(scenario)) == {0, 1, 2, 3}
    assert np.array_equal(run.frame[TxColumns.IS_FRAUD].to_numpy(), (scenario > 0).astype(np.int8))


def test_scenario1_is_every_amount_above_220(run: Run) -> None:
    scenario = run.frame[TxColumns.FRAUD_SCENARIO].to_numpy()
    large = run.frame[TxColumns.AMOUNT].to_numpy() > 220
    assert large[scenario == 1].all()
    # Outside scenario 3 (which multiplies amounts) a large amount is always fraud, scenario 1 or 2.
    assert np.isin(scenario[large & (scenario != 3)], [1, 2]).all()
    # Expected count of original amounts above 220 (rounded to cents), less those scenario 3 took.
    mean = run.profiles.mean_amount
    above = np.array([1 - _NORMAL.cdf((220.005 - m) / (m / 2)) for m in mean])
    expected = run.config.days * float(np.sum(_rates(run) * above)) * (1 - np.mean(scenario == 3))
    _assert_near(float(np.sum(large & (scenario != 3))), expected, math.sqrt(expected), "scenario 1")


def _scenario2_expected_mask(run: Run) -> npt.NDArray[np.bool_]:
    days = run.config.days
    compromised = np.zeros((run.config.terminals, days + 28), dtype=np.bool_)
    for day, terminals in enumerate(run.compromises.terminals):
        compromised[terminals, day : day + 28] = True
    return compromised[run.frame[TxColumns.TERMINAL_ID].to_numpy(), run.day]


def test_scenario2_is_every_transaction_on_a_terminal_compromised_in_the_last_28_days(run: Run) -> None:
    draws = run.compromises.terminals
    assert draws.shape == (run.config.days, 2)
    assert np.all(draws[:, 0] != draws[:, 1])
    scenario = run.frame[TxColumns.FRAUD_SCENARIO].to_numpy()
    on_compromised = _scenario2_expected_mask(run)
    assert np.array_equal(scenario == 2, on_compromised & (scenario != 3))
    # Each terminal is drawn with probability 2 / T a day, so the expected count does not depend on
    # how busy the terminals are: daily rate * sum over days of P(compromised in the window).
    window = np.minimum(28, np.arange(run.config.days) + 1)
    p_compromised = 1 - (1 - 2 / run.config.terminals) ** window
    expected = _rates(run).sum() * float(p_compromised.sum())
    # Busier and quieter terminals make the spread about 2 %; 10 % is five times that.
    assert abs(on_compromised.sum() / expected - 1) < 0.10


def test_scenario3_is_a_third_of_compromised_customers_transactions(run: Run) -> None:
    frame, days = run.frame, run.config.days
    draws = run.compromises.customers
    assert draws.shape == (days, 3)
    assert all(len(set(row)) == 3 for row in draws.tolist())
    card = frame[TxColumns.CARD_ID].to_numpy()
    key = card * days + run.day
    order = np.argsort(key, kind="stable")
    sorted_key = key[order]
    draw_day = np.repeat(np.arange(days), draws.shape[1])
    lo = np.searchsorted(sorted_key, draws.ravel() * days + draw_day)
    hi = np.searchsorted(sorted_key, draws.ravel() * days + np.minimum(draw_day + 14, days))
    in_window = np.zeros(len(frame), dtype=np.bool_)
    cover = np.zeros(len(frame) + 1, dtype=np.int64)
    np.add.at(cover, lo, 1)
    np.add.at(cover, hi, -1)
    in_window[order] = np.cumsum(cover[:-1]) > 0

    scenario3 = frame[TxColumns.FRAUD_SCENARIO].to_numpy() == 3
    assert not (scenario3 & ~in_window).any(), "scenario 3 outside a compromised card's 14 days"
    n_per_day = np.bincount(draw_day, weights=hi - lo, minlength=days)
    selections = float(np.sum(n_per_day // 3))
    # Distinct frauds fall short of the selections only where one card's windows overlap.
    assert 0.95 * selections <= scenario3.sum() <= selections
    assert 0.31 < scenario3.sum() / n_per_day.sum() <= 1 / 3
    # Their amounts are the customer's usual amounts times five: the median ratio is near 1.
    ratio = frame[TxColumns.AMOUNT].to_numpy()[scenario3] / (5 * run.profiles.mean_amount[card[scenario3]])
    assert 0.96 < float(np.median(ratio)) < 1.07


def test_fraud_shares_are_in_the_handbook_region(run: Run) -> None:
    scenario = run.frame[TxColumns.FRAUD_SCENARIO].to_numpy()
    counts = np.bincount(scenario, minlength=4)
    share = counts[1:].sum() / len(scenario)
    # Expected about 0.83 % (seed-to-seed spread about 0.01 percentage point).
    assert 0.0075 < share < 0.0092
    assert counts[2] > counts[3] > counts[1], "handbook order: scenario 2, then 3, then 1"
    # Scenario 3: a third of 3 customers' ~14-day transactions a day, less int() rounding.
    window = np.minimum(14, run.config.days - np.arange(run.config.days))
    expected3 = float(np.sum((3 * _rates(run).mean() * window - 1) / 3))
    assert abs(counts[3] / expected3 - 1) < 0.12
