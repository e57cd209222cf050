"""Synthetic card transactions with labelled fraud, after the fraud-detection handbook's simulator.

This follows the generative process of Le Borgne et al., "Reproducible Machine Learning for Credit
Card Fraud Detection - Practical Handbook", section 3.2, so that models trained and evaluated on its
output compare with the literature:

- customers live at ``(x, y) ~ U(0, 100)^2`` (the square grows beyond the handbook's 10,000 terminals, see
  below) with a mean amount ``~ U(5, 100)`` (standard deviation
  half the mean) and a mean number of transactions per day ``~ U(0, 4)``;
- terminals live at ``(x, y) ~ U(0, 100)^2``; a customer uses the terminals strictly within
  ``radius`` of home, and a customer with none in reach makes no transactions;
- per customer and day, ``Poisson(mean)`` transactions; time of day ``int(N(43200, 20000))`` seconds,
  kept only strictly inside ``(0, 86400)``; amount ``N(mean, std)``, a negative draw redrawn from
  ``U(0, 2 * mean)``, rounded to cents; the terminal uniformly among the customer's terminals;
- fraud, applied in this order, a later scenario overriding an earlier one: (1) every amount above
  220; (2) each day two terminals are compromised and all their transactions on that day and the
  next 27 are fraud; (3) each day three customers are compromised and ``int(n / 3)`` of their ``n``
  transactions on that day and the next 13, chosen at random, have their amount multiplied by 5 and
  are fraud.

Beyond the handbook's 10,000 terminals the square's side grows with the square root of the terminals, so
that terminals stay as dense as in its run and a customer reaches about as many (78 at radius 5, fewer
near the square's edges): at a fixed side, each customer would reach a share of every terminal, and
200,000 customers among 400,000 terminals would make 600 million reachable pairs.

As in the handbook, scenario 3 draws for overlapping windows are applied one day after the other, so
a transaction selected twice is multiplied twice. The handbook's compromise loop stops one day short
(``range(max day)``); here compromises are drawn on every simulated day, which adds a handful of frauds
on the last day. Unlike the handbook, which seeds the global numpy
and ``random`` states per customer and per day, one ``numpy.random.SeedSequence`` spawns an
independent generator per phase: the same seed gives the same transactions, but not the handbook's
exact rows. The work is vectorised with numpy; the only Python loop runs once per simulated day.

Delivery guarantee: none (this module produces a table, nothing is sent). The output is a pure
function of the configuration, and :func:`write_parquet` writes it byte-for-byte reproducibly, so a
replay of the same seed gives exactly the same events.
"""

from __future__ import annotations

import datetime as dt
import pathlib
from dataclasses import dataclass
from typing import Self

import numpy as np
import numpy.typing as npt
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import BaseModel, ConfigDict, Field, model_validator

from contracts.arrays import FloatArray, IntArray
from contracts.events import MAX_EVENT_TIME_MS, MIN_EVENT_TIME_MS, TxColumns

#: Side of the square (in the handbook's arbitrary distance unit) where customers and terminals live, up to
#: the handbook's number of terminals; beyond, it grows so that terminals stay as dense.
AREA_SIZE = 100.0
HANDBOOK_TERMINALS = 10_000
SECONDS_PER_DAY = 86_400
#: Time of day is ``int(N(TIME_MEAN_S, TIME_STD_S))`` seconds.
TIME_MEAN_S = 43_200.0
TIME_STD_S = 20_000.0
#: Scenario 1: every amount strictly above this is fraud.
SCENARIO1_AMOUNT = 220.0
#: Scenario 2: compromised terminals per day and the length of their compromise, in days.
SCENARIO2_TERMINALS_PER_DAY = 2
SCENARIO2_DAYS = 28
#: Scenario 3: compromised customers per day, the length of their compromise in days, the share of
#: their transactions that are fraud and the factor applied to those transactions' amounts.
SCENARIO3_CUSTOMERS_PER_DAY = 3
SCENARIO3_DAYS = 14
SCENARIO3_SHARE_DIVISOR = 3
SCENARIO3_AMOUNT_FACTOR = 5.0

# Phases, each with its own generator spawned from the seed, so that e.g. the profiles do not
# depend on the number of simulated days, nor the compromise draws on the transactions.
_PHASE_CUSTOMERS, _PHASE_TERMINALS, _PHASE_TRANSACTIONS, _PHASE_COMPROMISES, _PHASE_SCENARIO3_PICKS = range(5)
_PHASES = 5
_MAX_CELLS_PER_AXIS = 1 << 16
#: Customers whose candidate terminals are looked at together (their pairs' arrays stay small: 1M customers
#: at once held about 225M pairs, several GiB).
_REACH_CHUNK = 1 << 15


class SimulatorConfig(BaseModel):
    """Size, period, reach and seed of a simulation; the defaults are the handbook's run."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    customers: int = Field(default=5000, ge=1, description="Number of customers (cards).")
    terminals: int = Field(default=HANDBOOK_TERMINALS, ge=1, description="Number of terminals.")
    days: int = Field(default=183, ge=1, description="Number of simulated days.")
    start: dt.date = Field(default=dt.date(2018, 4, 1), description="First simulated day (UTC).")
    radius: float = Field(
        default=5.0, gt=0, allow_inf_nan=False, description="A customer's reach to terminals."
    )
    seed: int = Field(default=0, ge=0, description="Seed of the whole simulation.")

    @property
    def area_size(self) -> float:
        """Side of the square where customers and terminals live (see the module docstring)."""
        return AREA_SIZE * max(1.0, (self.terminals / HANDBOOK_TERMINALS) ** 0.5)

    @model_validator(mode="after")
    def _period_is_sane(self) -> Self:
        start_ms = _start_ms(self.start)
        end_ms = start_ms + self.days * SECONDS_PER_DAY * 1000
        if start_ms < MIN_EVENT_TIME_MS or end_ms > MAX_EVENT_TIME_MS:
            raise ValueError("the simulated period must lie within 2000-01-01 .. 2100-01-01 UTC")
        return self


@dataclass(frozen=True, eq=False)
class Profiles:
    """Customer and terminal profiles, and which terminals each customer can reach.

    Attributes:
        customer_xy: Home of each customer, shape ``(customers, 2)``.
        mean_amount: Mean transaction amount of each customer.
        std_amount: Standard deviation of each customer's amounts (half the mean).
        mean_tx_per_day: Mean number of transactions per day of each customer.
        terminal_xy: Location of each terminal, shape ``(terminals, 2)``.
        reach_indptr: CSR row pointers: customer ``c`` reaches
            ``reach_indices[reach_indptr[c]:reach_indptr[c + 1]]``.
        reach_indices: Reachable terminal ids, ascending within each customer.
    """

    customer_xy: FloatArray
    mean_amount: FloatArray
    std_amount: FloatArray
    mean_tx_per_day: FloatArray
    terminal_xy: FloatArray
    reach_indptr: IntArray
    reach_indices: IntArray

    @property
    def reach_counts(self) -> IntArray:
        """Number of terminals each customer can reach."""
        return np.diff(self.reach_indptr)


@dataclass(frozen=True, eq=False)
class Compromises:
    """The daily compromise draws of fraud scenarios 2 and 3.

    Attributes:
        terminals: Terminals compromised on each day, shape ``(days, 2)`` (fewer columns when there
            are fewer terminals).
        customers: Customers compromised on each day, shape ``(days, 3)`` (idem).
    """

    terminals: IntArray
    customers: IntArray


def _start_ms(start: dt.date) -> int:
    midnight = dt.datetime(start.year, start.month, start.day, tzinfo=dt.UTC)
    return int(midnight.timestamp()) * 1000


def _phase_rngs(seed: int) -> list[np.random.Generator]:
    return [np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(_PHASES)]


def _expand_ranges(starts: IntArray, counts: IntArray) -> tuple[IntArray, IntArray]:
    """Flatten the ranges ``[starts[i], starts[i] + counts[i])``: returns (owner index, position)."""
    owner = np.repeat(np.arange(len(starts), dtype=np.int64), counts)
    first = np.cumsum(counts) - counts
    positions = np.arange(int(counts.sum()), dtype=np.int64) - np.repeat(first, counts)
    return owner, positions + np.repeat(starts, counts)


def _reachable_terminals(
    customer_xy: FloatArray, terminal_xy: FloatArray, radius: float, area_size: float
) -> tuple[IntArray, IntArray]:
    """Terminals strictly within ``radius`` of each customer, as CSR (indptr, indices).

    Terminals are bucketed in a grid of cells of side ``radius`` (at least), so only the 3 x 3 cells around a
    customer are candidates: memory grows with the number of candidate pairs, not customers x
    terminals.
    """
    # A cell at least as wide as the radius; capped in number so that cell keys cannot overflow.
    side = max(radius, area_size / _MAX_CELLS_PER_AXIS)
    n_cells = int(np.ceil(area_size / side)) + 1
    stride = n_cells + 2  # cell coordinates are shifted by one, so a -1 neighbour never wraps.

    def cells(xy: FloatArray) -> tuple[IntArray, IntArray]:
        ij = np.clip(np.floor(xy / side).astype(np.int64), -1, n_cells) + 1
        return ij[:, 0], ij[:, 1]

    tx_cell, ty_cell = cells(terminal_xy)
    order = np.argsort(tx_cell * stride + ty_cell, kind="stable")
    sorted_keys = (tx_cell * stride + ty_cell)[order]
    cx_cell, cy_cell = cells(customer_xy)
    terminal_x, terminal_y = terminal_xy[:, 0], terminal_xy[:, 1]

    owners: list[IntArray] = []
    terminals: list[IntArray] = []
    for first in range(0, len(customer_xy), _REACH_CHUNK):
        chunk = slice(first, first + _REACH_CHUNK)
        customer_x, customer_y = customer_xy[chunk, 0], customer_xy[chunk, 1]
        for dx in (-1, 0, 1):
            for dy in (-1, 0, 1):
                keys = (cx_cell[chunk] + dx) * stride + (cy_cell[chunk] + dy)
                lo = np.searchsorted(sorted_keys, keys, side="left").astype(np.int64)
                hi = np.searchsorted(sorted_keys, keys, side="right").astype(np.int64)
                owner, position = _expand_ranges(lo, hi - lo)
                candidate = order[position]
                x = customer_x[owner] - terminal_x[candidate]
                y = customer_y[owner] - terminal_y[candidate]
                within = np.sqrt(x * x + y * y) < radius
                owners.append(owner[within] + first)
                terminals.append(candidate[within])

    owner = np.concatenate(owners)
    terminal = np.concatenate(terminals)
    by_customer = np.lexsort((terminal, owner))
    indptr = np.zeros(len(customer_xy) + 1, dtype=np.int64)
    np.cumsum(np.bincount(owner, minlength=len(customer_xy)), out=indptr[1:])
    return indptr, terminal[by_customer].astype(np.int64)


def simulate_profiles(config: SimulatorConfig) -> Profiles:
    """Draw the customer and terminal profiles of a simulation (the same ones :func:`simulate` uses)."""
    rngs = _phase_rngs(config.seed)
    customer_rng = rngs[_PHASE_CUSTOMERS]
    customer_xy = customer_rng.uniform(0.0, config.area_size, size=(config.customers, 2))
    mean_amount = customer_rng.uniform(5.0, 100.0, size=config.customers)
    mean_tx_per_day = customer_rng.uniform(0.0, 4.0, size=config.customers)
    terminal_xy = rngs[_PHASE_TERMINALS].uniform(0.0, config.area_size, size=(config.terminals, 2))
    indptr, indices = _reachable_terminals(customer_xy, terminal_xy, config.radius, config.area_size)
    return Profiles(
        customer_xy=customer_xy,
        mean_amount=mean_amount,
        std_amount=mean_amount / 2.0,
        mean_tx_per_day=mean_tx_per_day,
        terminal_xy=terminal_xy,
        reach_indptr=indptr,
        reach_indices=indices,
    )


def simulate_compromises(config: SimulatorConfig) -> Compromises:
    """Draw the terminals (scenario 2) and customers (scenario 3) compromised on each day."""
    rng = _phase_rngs(config.seed)[_PHASE_COMPROMISES]
    n_terminals = min(SCENARIO2_TERMINALS_PER_DAY, config.terminals)
    n_customers = min(SCENARIO3_CUSTOMERS_PER_DAY, config.customers)
    terminals = np.empty((config.days, n_terminals), dtype=np.int64)
    customers = np.empty((config.days, n_customers), dtype=np.int64)
    for day in range(config.days):
        terminals[day] = rng.choice(config.terminals, size=n_terminals, replace=False)
        customers[day] = rng.choice(config.customers, size=n_customers, replace=False)
    return Compromises(terminals=terminals, customers=customers)


def _scenario2_mask(
    terminal: IntArray, day: IntArray, terminals_by_day: IntArray, days: int
) -> npt.NDArray[np.bool_]:
    """Whether each transaction's terminal was compromised on its day or one of the 27 before."""
    draw_day = np.repeat(np.arange(len(terminals_by_day), dtype=np.int64), terminals_by_day.shape[1])
    draw_keys = np.sort(terminals_by_day.ravel() * days + draw_day)
    tx_keys = terminal * days + day
    latest = np.searchsorted(draw_keys, tx_keys, side="right") - 1
    found = latest >= 0
    latest_key = draw_keys[np.maximum(latest, 0)]
    same_terminal = latest_key // days == terminal
    recent = day - latest_key % days < SCENARIO2_DAYS
    return found & same_terminal & recent


@dataclass(frozen=True, eq=False)
class _Draws:
    """Legitimate transactions, laid out by customer, then day, then draw order."""

    customer: IntArray
    day: IntArray
    second: IntArray
    amount: FloatArray
    terminal: IntArray


def _draw_transactions(config: SimulatorConfig, profiles: Profiles, rng: np.random.Generator) -> _Draws:
    """Draw every customer's transactions of every day (before any fraud)."""
    days = config.days
    per_day = rng.poisson(profiles.mean_tx_per_day[:, None], size=(config.customers, days))
    per_day[profiles.reach_counts == 0] = 0
    slot = np.repeat(np.arange(per_day.size, dtype=np.int64), per_day.ravel())
    customer, day = np.divmod(slot, days)

    second = np.trunc(rng.normal(TIME_MEAN_S, TIME_STD_S, size=slot.size)).astype(np.int64)
    kept = (second > 0) & (second < SECONDS_PER_DAY)
    customer, day, second = customer[kept], day[kept], second[kept]

    mean = profiles.mean_amount[customer]
    amount = rng.normal(mean, profiles.std_amount[customer])
    negative = amount < 0
    amount[negative] = rng.uniform(0.0, 2.0 * mean[negative])

    offset = rng.integers(0, profiles.reach_counts[customer])
    terminal = profiles.reach_indices[profiles.reach_indptr[customer] + offset]
    return _Draws(customer=customer, day=day, second=second, amount=np.round(amount, 2), terminal=terminal)


def _add_frauds(
    config: SimulatorConfig, compromises: Compromises, draws: _Draws, rng: np.random.Generator
) -> npt.NDArray[np.int8]:
    """Apply fraud scenarios 1, 2 and 3 in order; returns the scenario of each draw.

    Scenario 3 multiplies the chosen amounts in ``draws.amount`` in place.
    """
    days = config.days
    amount = draws.amount
    scenario = np.where(amount > SCENARIO1_AMOUNT, 1, 0).astype(np.int8)
    scenario[_scenario2_mask(draws.terminal, draws.day, compromises.terminals, days)] = 2

    # Draws are customer-major and day-ordered: a customer's days d..d+13 are one contiguous range.
    customer_day = draws.customer * days + draws.day
    for draw_day, victims in enumerate(compromises.customers):
        last_day = min(draw_day + SCENARIO3_DAYS, days)
        lo = np.searchsorted(customer_day, victims * days + draw_day, side="left").astype(np.int64)
        hi = np.searchsorted(customer_day, victims * days + last_day, side="left").astype(np.int64)
        _, rows = _expand_ranges(lo, hi - lo)
        picks = rng.choice(rows.size, size=rows.size // SCENARIO3_SHARE_DIVISOR, replace=False)
        chosen = rows[picks]
        amount[chosen] = np.round(amount[chosen] * SCENARIO3_AMOUNT_FACTOR, 2)
        scenario[chosen] = 3
    return scenario


def simulate(config: SimulatorConfig) -> pd.DataFrame:
    """Simulate transactions with fraud labels, one row per transaction in event-time order.

    Returns:
        A frame with the :class:`~contracts.events.TxColumns` columns: ``tx_id`` (int64, 0..N-1 in
        event-time order; ties broken by card, then draw order), ``card_id`` and ``terminal_id``
        (int64), ``amount`` (float64, cents), ``event_time`` (datetime64[ms, UTC]), ``is_fraud`` and
        ``fraud_scenario`` (int8; scenario 0 is legitimate), ``terminal_x`` and ``terminal_y``.
    """
    profiles = simulate_profiles(config)
    rngs = _phase_rngs(config.seed)
    draws = _draw_transactions(config, profiles, rngs[_PHASE_TRANSACTIONS])
    scenario = _add_frauds(config, simulate_compromises(config), draws, rngs[_PHASE_SCENARIO3_PICKS])

    event_ms = _start_ms(config.start) + (draws.day * SECONDS_PER_DAY + draws.second) * 1000
    # Stable: draws are customer-major, so equal times stay ordered by customer, then draw order.
    order = np.argsort(event_ms, kind="stable")
    terminal = draws.terminal[order]
    scenario = scenario[order]
    event_time = pd.DatetimeIndex(event_ms[order].astype("datetime64[ms]")).tz_localize("UTC")
    return pd.DataFrame(
        {
            TxColumns.TX_ID: np.arange(order.size, dtype=np.int64),
            TxColumns.CARD_ID: draws.customer[order],
            TxColumns.TERMINAL_ID: terminal,
            TxColumns.AMOUNT: draws.amount[order],
            TxColumns.EVENT_TIME: event_time,
            TxColumns.IS_FRAUD: (scenario > 0).astype(np.int8),
            TxColumns.FRAUD_SCENARIO: scenario,
            TxColumns.TERMINAL_X: profiles.terminal_xy[terminal, 0],
            TxColumns.TERMINAL_Y: profiles.terminal_xy[terminal, 1],
        }
    )


def write_parquet(frame: pd.DataFrame, path: pathlib.Path) -> None:
    """Write a simulated frame as parquet, byte-identical for an identical frame.

    No pandas index and no pandas metadata (which records library versions) are written; compression
    and row-group size are fixed.
    """
    table = pa.Table.from_pandas(frame, preserve_index=False)
    table = table.replace_schema_metadata(None)
    pq.write_table(
        table,
        path,
        compression="zstd",
        compression_level=3,
        row_group_size=1 << 20,
        use_dictionary=True,
        write_statistics=True,
        version="2.6",
    )
