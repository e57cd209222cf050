"""The pure feature core: per-card and per-terminal state and the vectorised steps that update it.

``card_step(state, batch)`` and ``terminal_step(state, tx_batch, label_batch)`` turn (state, events)
into (state, feature rows), for many cards or terminals at once, with numpy sorts and binary searches
(no Python loop per row or per key). The streaming job calls them once per micro-batch and group with
the state it kept; the batch path (``compute_features``) calls them once over a whole table with empty
state, so live and replay run the same code.

Exactness: counts are ints, amounts are summed in integer cents (``round(amount * 100)``) and every
float feature comes from one final float operation on ints. The results are therefore bit-for-bit the
same whether a stream is processed in one call or in any sequence of chunks with the state carried
between them, as long as events arrive in (event_time, tx_id) order, or behind the latest event time
seen by at most ``FeatureParams.allowed_lateness_ms`` (which only decides how much history is kept).

Delivery guarantee: none of its own. These are deterministic pure functions; exactly-once results
follow from the caller replaying the same input against the same checkpointed state.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, TypeAlias

import numpy as np
import numpy.typing as npt
import pandas as pd

from contracts.arrays import BoolArray, FloatArray, IntArray
from contracts.events import TxColumns
from features.definitions import (
    AMOUNT_CENTS,
    CARD_SECS_SINCE_PREV_TX,
    DAY_MS,
    DEFAULT_PARAMS,
    EVENT_TIME_MS,
    HOUR_MS,
    IS_NIGHT,
    IS_WEEKEND,
    KNOWN_AT_MS,
    LABEL_COLUMNS,
    SECOND_MS,
    TERMINAL_DAYS_SINCE_FIRST_FRAUD,
    TX_TIME_MS,
    UNUSUAL_AMOUNT_FACTOR,
    FeatureParams,
    card_amount_ratio_column,
    card_amount_zscore_column,
    card_avg_amount_column,
    card_nb_tx_column,
    card_nb_tx_hours_column,
    card_nb_unusual_column,
    card_prior_ratio_column,
    terminal_nb_fraud_column,
    terminal_nb_tx_column,
    terminal_risk_column,
)

#: Keys (card or terminal ids), one per row: an array, or a categorical of distinct keys and a code per row
#: (what the streaming job hands the core, so that no string is hashed per history row).
KeyArray: TypeAlias = npt.NDArray[Any] | pd.Categorical

#: Composite (segment, time) keys are built in int64 only below this bound; above it times are ranked.
_COMPOSITE_LIMIT = 2**62
#: 1970-01-01 was a Thursday: weekday (Monday = 0) of day number k is (k + 3) mod 7.
_EPOCH_WEEKDAY = 3
_LAST_NIGHT_HOUR = 6


# --- State --------------------------------------------------------------------------------------------


def _empty_keys() -> KeyArray:
    return np.empty(0, dtype=object)


def _empty_ints() -> IntArray:
    return np.empty(0, dtype=np.int64)


@dataclass(frozen=True, eq=False)
class CardState:
    """Per-card history that future transactions may still see.

    One entry per kept transaction (any order): the card key, event time, tx id and amount in cents.
    It keeps the transactions with event time > (latest event time seen) - (longest card window) -
    ``allowed_lateness_ms``, the latest taken over everything this state has seen (all its cards), so a
    card that goes quiet does not hold history for ever.
    """

    card_id: KeyArray
    event_time_ms: IntArray
    tx_id: IntArray
    amount_cents: IntArray

    @classmethod
    def empty(cls) -> CardState:
        """The state of a stream that has seen nothing yet."""
        return cls(_empty_keys(), _empty_ints(), _empty_ints(), _empty_ints())

    def __len__(self) -> int:
        return len(self.event_time_ms)

    def to_frame(self) -> pd.DataFrame:
        """The state as a frame (card_id, event_time_ms, tx_id, amount_cents) for Arrow/Spark state."""
        return pd.DataFrame(
            {
                TxColumns.CARD_ID: self.card_id,
                EVENT_TIME_MS: self.event_time_ms,
                TxColumns.TX_ID: self.tx_id,
                AMOUNT_CENTS: self.amount_cents,
            }
        )

    @classmethod
    def from_frame(cls, frame: pd.DataFrame) -> CardState:
        """Rebuild a state from ``to_frame()`` output (or any frame with those columns)."""
        return cls(
            card_id=frame[TxColumns.CARD_ID].to_numpy(),
            event_time_ms=frame[EVENT_TIME_MS].to_numpy(dtype=np.int64),
            tx_id=frame[TxColumns.TX_ID].to_numpy(dtype=np.int64),
            amount_cents=frame[AMOUNT_CENTS].to_numpy(dtype=np.int64),
        )


@dataclass(frozen=True, eq=False)
class TerminalState:
    """Per-terminal history: transaction times and fraud labels that future transactions may still see.

    Transactions (terminal key, event time) are kept while their event time is > (latest transaction
    event time seen) - (longest window + label delay + ``allowed_lateness_ms``). Labels (terminal key,
    tx id, tx time, known at, is_fraud) are kept, one per tx id (the first known), while their tx time
    is above the same bound; labels that say "not fraud" are kept too, so that a later duplicate for the
    same tx id cannot override them.
    """

    terminal_id: KeyArray
    event_time_ms: IntArray
    label_terminal_id: KeyArray
    label_tx_id: IntArray
    label_tx_time_ms: IntArray
    label_known_at_ms: IntArray
    label_is_fraud: BoolArray

    @classmethod
    def empty(cls) -> TerminalState:
        """The state of a stream that has seen nothing yet."""
        return cls(
            _empty_keys(),
            _empty_ints(),
            _empty_keys(),
            _empty_ints(),
            _empty_ints(),
            _empty_ints(),
            np.empty(0, dtype=bool),
        )

    def __len__(self) -> int:
        return len(self.event_time_ms) + len(self.label_tx_id)

    def to_frames(self) -> tuple[pd.DataFrame, pd.DataFrame]:
        """The state as two frames for Arrow/Spark state.

        Returns:
            (transactions: terminal_id, event_time_ms; labels: tx_id, terminal_id, tx_time_ms,
            known_at_ms, is_fraud).
        """
        transactions = pd.DataFrame(
            {TxColumns.TERMINAL_ID: self.terminal_id, EVENT_TIME_MS: self.event_time_ms}
        )
        labels = _label_frame(
            self.label_tx_id,
            self.label_terminal_id,
            self.label_tx_time_ms,
            self.label_known_at_ms,
            self.label_is_fraud,
        )
        return transactions, labels

    @classmethod
    def from_frames(cls, transactions: pd.DataFrame, labels: pd.DataFrame) -> TerminalState:
        """Rebuild a state from ``to_frames()`` output."""
        return cls(
            terminal_id=transactions[TxColumns.TERMINAL_ID].to_numpy(),
            event_time_ms=transactions[EVENT_TIME_MS].to_numpy(dtype=np.int64),
            label_terminal_id=labels[TxColumns.TERMINAL_ID].to_numpy(),
            label_tx_id=labels[TxColumns.TX_ID].to_numpy(dtype=np.int64),
            label_tx_time_ms=labels[TX_TIME_MS].to_numpy(dtype=np.int64),
            label_known_at_ms=labels[KNOWN_AT_MS].to_numpy(dtype=np.int64),
            label_is_fraud=labels[TxColumns.IS_FRAUD].to_numpy(dtype=bool),
        )


def _label_frame(
    tx_id: IntArray, terminal_id: KeyArray, tx_time: IntArray, known_at: IntArray, is_fraud: BoolArray
) -> pd.DataFrame:
    return pd.DataFrame(
        {
            TxColumns.TX_ID: tx_id,
            TxColumns.TERMINAL_ID: terminal_id,
            TX_TIME_MS: tx_time,
            KNOWN_AT_MS: known_at,
            TxColumns.IS_FRAUD: is_fraud,
        }
    )


# --- Vectorised helpers -------------------------------------------------------------------------------


class _Keyspace:
    """Maps (segment code, time) pairs to int64 keys that sort exactly like the pairs.

    Built from the times of the data; query times outside their range are clamped, which keeps every
    comparison with the data intact. A key is ``code * stride + offset``; when that could overflow
    int64, times are replaced by their rank among the data times (a query between two data times gets
    an even rank between their odd ones).
    """

    def __init__(self, times: IntArray, n_codes: int) -> None:
        self._unique: IntArray | None = None
        if len(times) == 0:
            self._low, self._high, self._stride = 0, 0, 3
            return
        self._low, self._high = int(times.min()), int(times.max())
        self._stride = self._high - self._low + 3
        if max(n_codes, 1) * self._stride >= _COMPOSITE_LIMIT:
            self._unique = np.unique(times)
            self._stride = 2 * len(self._unique) + 2

    def encode(self, codes: IntArray, times: IntArray) -> IntArray:
        """Composite keys of (code, time) pairs."""
        if self._unique is None:
            offset = np.clip(times, self._low - 1, self._high + 1) - (self._low - 1)
        else:
            rank = np.searchsorted(self._unique, times, side="left")
            found = np.take(self._unique, np.minimum(rank, len(self._unique) - 1)) == times
            offset = 2 * rank + found
        return codes * self._stride + offset


def _keys_of(column: pd.Series) -> KeyArray:
    return column.to_numpy()


def _batch_rows(batch: pd.DataFrame, key: str) -> tuple[KeyArray, IntArray, IntArray]:
    """A batch's keys (its ``key`` column), event times and tx ids."""
    times = batch[EVENT_TIME_MS].to_numpy(dtype=np.int64)
    return _keys_of(batch[key]), times, batch[TxColumns.TX_ID].to_numpy(dtype=np.int64)


def concat_keys(first: KeyArray, second: KeyArray) -> KeyArray:
    """The keys of both, as a categorical when either is one (its categories: the distinct keys of both)."""
    if len(first) == 0:
        return second
    if len(second) == 0:
        return first
    if isinstance(first, pd.Categorical) or isinstance(second, pd.Categorical):
        (codes_a, codes_b), keys = _codes_and_keys(first, second)
        return pd.Categorical.from_codes(np.concatenate([codes_a, codes_b]), categories=keys, validate=False)
    return np.concatenate([first, second])


def _codes_and_keys(*parts: KeyArray) -> tuple[list[IntArray], npt.NDArray[Any]]:
    """Codes of keys across arrays, -1 for a missing key, and the distinct keys. A categorical's keys are
    found once each, not per row."""
    tables = [
        part.categories.to_numpy(dtype=object) if isinstance(part, pd.Categorical) else part for part in parts
    ]
    sizes = [len(table) for table in tables]
    non_empty = [table for table in tables if len(table)]
    if not non_empty:
        return [_empty_ints() for _ in parts], _empty_keys()
    joined = non_empty[0] if len(non_empty) == 1 else np.concatenate(non_empty)
    table_codes, uniques = pd.factorize(joined)
    table_codes = table_codes.astype(np.int64, copy=False)
    bounds = np.cumsum([0, *sizes])
    codes = []
    for i, part in enumerate(parts):
        mine = table_codes[bounds[i] : bounds[i + 1]]
        if isinstance(part, pd.Categorical):
            rows = part.codes.astype(np.int64)
            mine = np.where(rows < 0, -1, mine[rows]) if (rows < 0).any() else mine[rows]
        codes.append(mine)
    return codes, np.asarray(uniques, dtype=object)


def _factorize(*parts: KeyArray) -> tuple[list[IntArray], int]:
    """Integer codes of keys across arrays (a missing key is a key of its own).

    Returns:
        The codes of each part, and the number of distinct keys.
    """
    codes, keys = _codes_and_keys(*parts)
    n_codes = len(keys)
    if any((part < 0).any() for part in codes):
        codes = [np.where(part < 0, n_codes, part) for part in codes]
        n_codes += 1
    return codes, n_codes


def _present_in(codes: IntArray, reference: IntArray, n_codes: int) -> BoolArray:
    """Which ``codes`` occur in ``reference``."""
    present = np.zeros(n_codes, dtype=bool)
    present[reference] = True
    return present[codes]


def _order_by(key: IntArray, tiebreak: IntArray) -> IntArray:
    """Indices that sort rows by (key, tiebreak): one fast sort, then a lexsort of the tied rows only."""
    order = np.argsort(key)
    sorted_key = key[order]
    tied = np.zeros(len(key), dtype=bool)
    same = sorted_key[1:] == sorted_key[:-1]
    tied[1:] |= same
    tied[:-1] |= same
    if tied.any():
        # The tied positions hold whole runs of equal keys in increasing key order, so sorting just
        # them by (key, tiebreak) puts every run back in its own place, now ordered by tiebreak.
        sub = order[tied]
        order[tied] = sub[np.lexsort((tiebreak[sub], key[sub]))]
    return order


def _unsort(values: npt.NDArray[Any], order: IntArray) -> npt.NDArray[Any]:
    """Values computed for rows taken in ``order``, put back in the rows' own order."""
    out = np.empty(len(order), dtype=values.dtype)
    out[order] = values
    return out


def _ratio(numerator: IntArray, denominator: IntArray, when_zero: float) -> FloatArray:
    """numerator / denominator in one float division, ``when_zero`` where the denominator is 0."""
    out = np.full(len(numerator), when_zero, dtype=np.float64)
    np.divide(numerator, denominator, out=out, where=denominator != 0)
    return out


# --- Time features ------------------------------------------------------------------------------------


def time_features(event_time_ms: npt.ArrayLike) -> pd.DataFrame:
    """``is_weekend`` (Saturday/Sunday UTC) and ``is_night`` (UTC hour <= 6) as 0/1 int64 columns."""
    times = np.asarray(event_time_ms, dtype=np.int64)
    days, ms_of_day = np.divmod(times, DAY_MS)
    weekday = (days + _EPOCH_WEEKDAY) % 7
    return pd.DataFrame(
        {
            IS_WEEKEND: (weekday >= 5).astype(np.int64),
            IS_NIGHT: (ms_of_day // HOUR_MS <= _LAST_NIGHT_HOUR).astype(np.int64),
        }
    )


# --- Card features ------------------------------------------------------------------------------------


def amount_to_cents(amount: npt.ArrayLike) -> IntArray:
    """Amounts rounded to integer cents (half to even, like Python's ``round``).

    Raises:
        ValueError: if an amount is not finite (validated events never are).
    """
    values = np.asarray(amount, dtype=np.float64)
    if not np.isfinite(values).all():
        raise ValueError("amounts must be finite")
    return np.rint(values * 100).astype(np.int64)


def card_step(
    state: CardState, batch: pd.DataFrame, params: FeatureParams = DEFAULT_PARAMS
) -> tuple[CardState, pd.DataFrame]:
    """Card features of a batch of transactions, and the state after it.

    Each batch row sees the state's and the batch's transactions of its card that are ordered at or
    before it in (event_time_ms, tx_id) order, within each window. A late row (older than rows already
    in state) gets the same formula over what is there.

    Args:
        state: history carried from previous calls (``CardState.empty()`` at the start).
        batch: columns tx_id (int64), card_id (str or int key), amount (float64), event_time_ms (int64);
            any number of cards, any row order.
        params: windows and allowed lateness.

    Returns:
        The pruned new state, and a frame with tx_id and ``params.card_feature_columns``, one row per
        batch row in the batch's row order (index 0..n-1).
    """
    batch_cards, batch_time, batch_tx_id = _batch_rows(batch, TxColumns.CARD_ID)
    batch_cents = amount_to_cents(batch[TxColumns.AMOUNT].to_numpy(dtype=np.float64))

    (batch_codes, state_codes), n_keys = _factorize(batch_cards, state.card_id)
    # The state rows of the batch's cards: all that matters now.
    seen = _present_in(state_codes, batch_codes, n_keys)
    n_seen = int(seen.sum())
    code = np.concatenate([state_codes[seen], batch_codes])
    time = np.concatenate([state.event_time_ms[seen], batch_time])
    cents = np.concatenate([state.amount_cents[seen], batch_cents])
    tx_id = np.concatenate([state.tx_id[seen], batch_tx_id])

    space = _Keyspace(time, n_keys)
    key = space.encode(code, time)
    order = _order_by(key, tx_id)
    key, time, cents = key[order], time[order], cents[order]
    pos = np.flatnonzero(order >= n_seen)  # sorted positions of the batch rows ...
    row = order[pos] - n_seen  # ... and their rows in the batch
    # Each batch row queries the windows that end at it: its card's code, its time, its amount.
    query_code, query_time, query_cents = code[order[pos]], time[pos], cents[pos]
    cum_cents = np.concatenate([[0], np.cumsum(cents)])
    # Squares wrap around int64 in the running sum; a window's difference is still exact (modulo 2**64)
    # while its own sum of squared cents stays below 2**63: amounts under about 30 million.
    cum_squares = np.concatenate([[0], np.cumsum(cents * cents)])
    upto = pos + 1  # rows [segment start, pos] are the card's rows ordered at or before the row

    def window(length_ms: int) -> tuple[IntArray, IntArray, IntArray]:
        first = np.searchsorted(key, space.encode(query_code, query_time - length_ms), side="right")
        return upto - first, cum_cents[upto] - cum_cents[first], cum_squares[upto] - cum_squares[first]

    columns: dict[str, npt.NDArray[Any]] = {}
    count = total = _empty_ints()
    prior_windows = set(params.prior_window_days)
    for days, length_ms in zip(params.window_days, params.windows_ms, strict=True):
        count, total, squares = window(length_ms)
        columns[card_nb_tx_column(days)] = count
        columns[card_avg_amount_column(days)] = total / (count * 100)
        if days in prior_windows:
            ratio, zscore = _against_prior(
                query_cents, count - 1, total - query_cents, squares - query_cents**2
            )
            columns[card_prior_ratio_column(days)] = ratio
            columns[card_amount_zscore_column(days)] = zscore
    longest_count, longest_total = count, total
    unusual = params.unusual_window_days
    first = np.searchsorted(key, space.encode(query_code, query_time - unusual * DAY_MS), side="right")
    columns[card_nb_unusual_column(unusual)] = _unusual_counts(
        cents, first, pos, longest_count - 1, longest_total - query_cents
    )
    columns[card_nb_tx_hours_column(params.short_window_hours)] = window(params.short_window_ms)[0]
    # The previous row is in the longest window iff that window holds more than the row itself.
    previous = np.maximum(pos - 1, 0)
    gap_ms = np.where(longest_count > 1, query_time - time[previous], params.longest_window_ms)
    columns[CARD_SECS_SINCE_PREV_TX] = gap_ms / SECOND_MS
    columns[card_amount_ratio_column(params.window_days[-1])] = _ratio(
        query_cents * longest_count, longest_total, when_zero=1.0
    )

    features = pd.DataFrame(
        {TxColumns.TX_ID: batch_tx_id}
        | {name: _unsort(columns[name], row) for name in params.card_feature_columns}
    )

    all_time = np.concatenate([state.event_time_ms, batch_time])
    keep = _recent(all_time, params.card_history_ms)
    new_state = CardState(
        card_id=concat_keys(state.card_id, batch_cards)[keep],
        event_time_ms=all_time[keep],
        tx_id=np.concatenate([state.tx_id, batch_tx_id])[keep],
        amount_cents=np.concatenate([state.amount_cents, batch_cents])[keep],
    )
    return new_state, features


def _against_prior(
    cents: IntArray, count: IntArray, total: IntArray, squares: IntArray
) -> tuple[FloatArray, FloatArray]:
    """The amount against the card's transactions before it in a window (``count`` of them, their sum and
    sum of squares in cents): amount / their mean (1.0 without one: none, or a mean of 0), and the amount's
    distance from their mean in their (population) standard deviations (0.0 with fewer than two, or all
    equal). Element-wise on ints, so the same ints give the same floats in any batch; the variance's
    numerator ``count * squares - total**2`` is summed in Python ints, exactly, whatever its size."""
    ratio = _ratio(cents * count, total, when_zero=1.0)
    zscore = np.zeros(len(cents), dtype=np.float64)
    some = np.flatnonzero(count > 1)
    n = count[some].astype(object)
    spread = (n * squares[some].astype(object) - total[some].astype(object) ** 2).astype(np.float64)
    varied = spread > 0
    rows = some[varied]
    zscore[rows] = (cents[rows] * count[rows] - total[rows]) / np.sqrt(spread[varied])
    return ratio, zscore


#: Up to this many amount comparisons in all, ``_unusual_counts`` compares each query's amounts one by one
#: (the usual case: a card's week times its rows of the batch); past it, :func:`_counts_above` counts
#: them, so that a card's burst in one batch costs n log n, not n².
_UNUSUAL_DIRECT = 1 << 22


def _unusual_counts(
    cents: IntArray, starts: IntArray, stops: IntArray, prior_count: IntArray, prior_total: IntArray
) -> IntArray:
    """Per query, how many of ``cents[starts[i]:stops[i]]`` are over :data:`UNUSUAL_AMOUNT_FACTOR` times
    the mean of its ``prior_count`` earlier amounts summing to ``prior_total`` (in integers: exact).

    A query whose range is not empty has earlier amounts (``prior_count`` > 0), and for integers
    ``a * count > F * total`` is ``a > floor(F * total / count)``: the same counts either way below."""
    lengths = stops - starts
    if int(lengths.sum()) > _UNUSUAL_DIRECT:
        thresholds = (UNUSUAL_AMOUNT_FACTOR * prior_total) // np.maximum(prior_count, 1)
        return _counts_above(cents, starts, stops, thresholds)
    owner = np.repeat(np.arange(len(starts)), lengths)
    within = np.arange(len(owner)) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    over = cents[starts[owner] + within] * prior_count[owner] > UNUSUAL_AMOUNT_FACTOR * prior_total[owner]
    return np.bincount(owner[over], minlength=len(starts)).astype(np.int64)


def _counts_above(values: IntArray, starts: IntArray, stops: IntArray, thresholds: IntArray) -> IntArray:
    """Per query, how many of ``values[starts[i]:stops[i]]`` are over ``thresholds[i]``, in O((n + queries)
    log n): as a segment tree does, each range is cut into aligned blocks of 2**k positions, at most two per
    level k, and a block's count is two binary searches in the values ordered by (block, rank of the value)
    at that level (each level's order merges the previous one's sorted halves)."""
    counts = np.zeros(len(starts), dtype=np.int64)
    if not len(values) or not len(starts):
        return counts
    distinct = np.unique(values)
    rank = np.searchsorted(distinct, values).astype(np.int64)
    least = np.searchsorted(distinct, thresholds, side="right")  # the first rank over each threshold
    width = len(distinct) + 1
    order = np.arange(len(values), dtype=np.int64)
    lo, hi = starts.astype(np.int64), stops.astype(np.int64)
    level = 0
    while (lo < hi).any():
        keys = (order >> level) * width + rank[order]
        if level:
            merged = np.argsort(keys, kind="stable")  # two sorted runs per block: a merge
            order, keys = order[merged], keys[merged]
        left = (lo < hi) & (lo & 1 == 1)
        counts[left] += _over_in_blocks(keys, lo[left], least[left], width)
        lo[left] += 1
        right = (lo < hi) & (hi & 1 == 1)
        hi[right] -= 1
        counts[right] += _over_in_blocks(keys, hi[right], least[right], width)
        lo >>= 1
        hi >>= 1
        level += 1
    return counts


def _over_in_blocks(keys: IntArray, blocks: IntArray, least: IntArray, width: int) -> IntArray:
    """How many values of each block rank at or past ``least`` (``keys``: block * width + rank, sorted)."""
    return np.searchsorted(keys, (blocks + 1) * width) - np.searchsorted(keys, blocks * width + least)


def card_windows(
    state: CardState, card_id: object, at_ms: int, params: FeatureParams = DEFAULT_PARAMS
) -> pd.DataFrame:
    """What the card windows of one card hold at event time ``at_ms``, as its state keeps them.

    The card's kept transactions with event time in (at_ms - window, at_ms], for the short window and each
    day window: the windows of ``card_step`` for a transaction of the card at ``at_ms``, without the
    transaction itself (its ``card_nb_tx_{n}d`` minus one; the mean is ``card_avg_amount_{n}d``'s, over
    those). Exact for ``at_ms`` at or after the newest event time the state has seen: the state keeps every
    transaction these windows can hold from there on.

    Returns:
        One row per window, the short window first: ``count_column`` and ``mean_column`` (the feature
        names of the window; the short window has no mean feature: None), ``window_ms``, ``nb_tx``,
        ``amount_cents`` (their sum) and ``avg_amount`` (their mean amount; NaN when there are none).
    """
    mine = state.card_id == card_id
    times, cents = state.event_time_ms[mine], state.amount_cents[mine]
    windows = [
        (card_nb_tx_hours_column(params.short_window_hours), None, params.short_window_ms),
        *(
            (card_nb_tx_column(days), card_avg_amount_column(days), length_ms)
            for days, length_ms in zip(params.window_days, params.windows_ms, strict=True)
        ),
    ]
    inside = [(times > at_ms - length_ms) & (times <= at_ms) for _, _, length_ms in windows]
    count = np.asarray([int(mask.sum()) for mask in inside], dtype=np.int64)
    total = np.asarray([int(cents[mask].sum()) for mask in inside], dtype=np.int64)
    return pd.DataFrame(
        {
            "count_column": [name for name, _, _ in windows],
            "mean_column": [name for _, name, _ in windows],
            "window_ms": [length_ms for _, _, length_ms in windows],
            "nb_tx": count,
            "amount_cents": total,
            "avg_amount": _ratio(total, count * 100, when_zero=math.nan),
        }
    )


def _recent(times: IntArray, history_ms: int) -> BoolArray:
    """Rows with time > latest time - history_ms (all rows when there are none)."""
    if len(times) == 0:
        return np.ones(0, dtype=bool)
    return times > int(times.max()) - history_ms


# --- Terminal features --------------------------------------------------------------------------------


def _first_known_labels(
    tx_id: IntArray,
    terminal_id: KeyArray,
    tx_time: IntArray,
    known_at: IntArray,
    is_fraud: BoolArray,
) -> tuple[IntArray, KeyArray, IntArray, IntArray, BoolArray]:
    """One label per tx id: the earliest known (on a tie, the one that says fraud)."""
    order = np.lexsort((~is_fraud, known_at, tx_id))
    sorted_id = tx_id[order]
    first = np.ones(len(order), dtype=bool)
    first[1:] = sorted_id[1:] != sorted_id[:-1]
    keep = order[first]
    return tx_id[keep], terminal_id[keep], tx_time[keep], known_at[keep], is_fraud[keep]


def terminal_step(
    state: TerminalState,
    tx_batch: pd.DataFrame,
    label_batch: pd.DataFrame | None = None,
    params: FeatureParams = DEFAULT_PARAMS,
) -> tuple[TerminalState, pd.DataFrame]:
    """Terminal features of a batch of transactions, and the state after it.

    A transaction of terminal T at time t counts T's transactions (state and batch) with event time in
    (t - (n + d), t - d]; a label contributes to its risk iff it is the first known label of its tx id,
    says fraud, has tx time in that window and is known by t. Per label that means t in
    [max(tx_time + d, known_at), tx_time + n + d): counted with sorted interval starts and ends. The
    order of events inside a batch does not matter.

    Args:
        state: history carried from previous calls (``TerminalState.empty()`` at the start).
        tx_batch: columns tx_id (int64), terminal_id (key), event_time_ms (int64).
        label_batch: columns tx_id, terminal_id, tx_time_ms, known_at_ms, is_fraud (``LABEL_COLUMNS``);
            ``None`` or empty when no label arrived. A label does not need its transaction to have been
            seen; duplicate labels of a tx id count once (the first known).
        params: windows, label delay d and allowed lateness.

    Returns:
        The pruned new state, and a frame with tx_id and ``params.terminal_feature_columns``, one row per
        batch row in the batch's row order (index 0..n-1).
    """
    batch_terminals, batch_time, batch_tx_id = _batch_rows(tx_batch, TxColumns.TERMINAL_ID)
    delay = params.label_delay_ms

    labels = (
        state.label_tx_id,
        state.label_terminal_id,
        state.label_tx_time_ms,
        state.label_known_at_ms,
        state.label_is_fraud,
    )
    if label_batch is not None and len(label_batch):
        labels = _first_known_labels(
            np.concatenate([state.label_tx_id, label_batch[TxColumns.TX_ID].to_numpy(dtype=np.int64)]),
            concat_keys(state.label_terminal_id, _keys_of(label_batch[TxColumns.TERMINAL_ID])),
            np.concatenate([state.label_tx_time_ms, label_batch[TX_TIME_MS].to_numpy(dtype=np.int64)]),
            np.concatenate([state.label_known_at_ms, label_batch[KNOWN_AT_MS].to_numpy(dtype=np.int64)]),
            np.concatenate([state.label_is_fraud, label_batch[TxColumns.IS_FRAUD].to_numpy(dtype=bool)]),
        )
    label_tx_id, label_terminals, label_tx_time, label_known_at, label_is_fraud = labels

    (batch_codes, state_codes, label_codes), n_keys = _factorize(
        batch_terminals, state.terminal_id, label_terminals
    )
    seen = _present_in(state_codes, batch_codes, n_keys)
    code = np.concatenate([state_codes[seen], batch_codes])
    time = np.concatenate([state.event_time_ms[seen], batch_time])
    space = _Keyspace(time, n_keys)
    key = np.sort(space.encode(code, time))
    # Queries in (terminal, time) order make every binary search below walk forward through memory.
    by_query = np.argsort(space.encode(batch_codes, batch_time))
    query_code, query_time = batch_codes[by_query], batch_time[by_query]

    def count_at_or_before(limit: IntArray) -> IntArray:
        return np.searchsorted(key, space.encode(query_code, limit), side="right").astype(np.int64)

    frauds = label_is_fraud & _present_in(label_codes, batch_codes, n_keys)
    fraud_codes, fraud_tx_time = label_codes[frauds], label_tx_time[frauds]
    start = np.maximum(fraud_tx_time + delay, label_known_at[frauds])
    ends = [np.maximum(fraud_tx_time + length_ms + delay, start) for length_ms in params.windows_ms]
    label_space = _Keyspace(np.concatenate([start, *ends]), n_keys)
    query = label_space.encode(query_code, query_time)
    started = np.searchsorted(np.sort(label_space.encode(fraud_codes, start)), query, side="right")

    upper = count_at_or_before(query_time - delay)
    columns: dict[str, npt.NDArray[Any]] = {TxColumns.TX_ID: batch_tx_id}
    for days, length_ms, end in zip(params.window_days, params.windows_ms, ends, strict=True):
        count = upper - count_at_or_before(query_time - delay - length_ms)
        ended = np.searchsorted(np.sort(label_space.encode(fraud_codes, end)), query, side="right")
        frauds_known = (started - ended).astype(np.int64)
        columns[terminal_nb_tx_column(days)] = _unsort(count, by_query)
        columns[terminal_risk_column(days)] = _unsort(_ratio(frauds_known, count, when_zero=0.0), by_query)
        columns[terminal_nb_fraud_column(days)] = _unsort(frauds_known, by_query)
    span_ms = params.longest_window_ms + delay
    first_ms = _earliest_active(fraud_codes, fraud_tx_time, start, ends[-1], n_keys, query_code, query_time)
    age_ms = np.where(first_ms >= 0, query_time - first_ms, span_ms)
    columns[TERMINAL_DAYS_SINCE_FIRST_FRAUD] = _unsort(age_ms / DAY_MS, by_query)
    features = pd.DataFrame(
        {name: columns[name] for name in (TxColumns.TX_ID, *params.terminal_feature_columns)}
    )

    all_time = np.concatenate([state.event_time_ms, batch_time])
    keep = _recent(all_time, params.terminal_history_ms)
    keep_label = np.ones(len(label_tx_id), dtype=bool)
    if len(all_time):
        keep_label = label_tx_time > int(all_time.max()) - params.terminal_history_ms
    new_state = TerminalState(
        terminal_id=concat_keys(state.terminal_id, batch_terminals)[keep],
        event_time_ms=all_time[keep],
        label_terminal_id=label_terminals[keep_label],
        label_tx_id=label_tx_id[keep_label],
        label_tx_time_ms=label_tx_time[keep_label],
        label_known_at_ms=label_known_at[keep_label],
        label_is_fraud=label_is_fraud[keep_label],
    )
    return new_state, features


def _earliest_active(
    codes: IntArray,
    tx_time: IntArray,
    start: IntArray,
    end: IntArray,
    n_keys: int,
    query_code: IntArray,
    query_time: IntArray,
) -> IntArray:
    """For each query (key code c, time t): the earliest tx time among the labels of c that count at t
    (start <= t < end), or -1 when none does.

    ``end - tx_time`` is the same for every label that can count (the window's length plus the delay; a
    label with end == start never counts), so the labels that count at t are those started by t with tx
    time above t - that length. Labels sorted by (code, tx time); each query walks from its first label
    with tx time in range to the first started one, skipping blocks of 2**k labels that start after t
    (their minimum start, precomputed for each k).
    """
    can = end > start
    if not can.any():
        return np.full(len(query_code), -1, dtype=np.int64)
    codes, tx_time, start = codes[can], tx_time[can], start[can]
    length_ms = int((end[can] - tx_time)[0])
    space = _Keyspace(np.concatenate([tx_time, query_time - length_ms]), n_keys)
    order = np.argsort(space.encode(codes, tx_time), kind="stable")
    codes, tx_time, start = codes[order], tx_time[order], start[order]
    n = len(order)
    pos = np.searchsorted(
        space.encode(codes, tx_time), space.encode(query_code, query_time - length_ms), "right"
    )
    # block_min[k][i] = min(start[i : i + 2**k]), clipped at the end.
    block_min = [start]
    while 2 ** len(block_min) <= n:
        half = 2 ** (len(block_min) - 1)
        previous = block_min[-1]
        block_min.append(np.minimum(previous[: len(previous) - half], previous[half:]))
    for k in range(len(block_min) - 1, -1, -1):
        level = block_min[k]
        inside = pos < len(level)
        skip = np.zeros(len(pos), dtype=bool)
        skip[inside] = level[pos[inside]] > query_time[inside]
        pos = pos + np.where(skip, 2**k, 0)
    found = pos < n
    at = np.minimum(pos, n - 1)
    found &= (codes[at] == query_code) & (start[at] <= query_time)
    return np.where(found, tx_time[at], -1)


# --- Batch (reference) path ---------------------------------------------------------------------------


def empty_labels() -> pd.DataFrame:
    """A label table without rows."""
    return _label_frame(_empty_ints(), _empty_keys(), _empty_ints(), _empty_ints(), np.empty(0, dtype=bool))


def labels_from_fraud_flags(transactions: pd.DataFrame, label_delay_ms: int) -> pd.DataFrame:
    """Labels for a table that carries a fraud column: one per fraudulent transaction.

    Args:
        transactions: columns tx_id, terminal_id, event_time_ms and is_fraud (bool or 0/1); card_id is
            copied when present.
        label_delay_ms: each label is known this long after its transaction.

    Returns:
        ``LABEL_COLUMNS`` (plus card_id when present), is_fraud True on every row.
    """
    fraud = transactions[transactions[TxColumns.IS_FRAUD].astype(bool)]
    tx_time = fraud[EVENT_TIME_MS].to_numpy(dtype=np.int64)
    labels = _label_frame(
        fraud[TxColumns.TX_ID].to_numpy(dtype=np.int64),
        _keys_of(fraud[TxColumns.TERMINAL_ID]),
        tx_time,
        tx_time + label_delay_ms,
        np.ones(len(fraud), dtype=bool),
    )
    if TxColumns.CARD_ID in fraud.columns:
        labels[TxColumns.CARD_ID] = _keys_of(fraud[TxColumns.CARD_ID])
    return labels


def with_event_time_ms(transactions: pd.DataFrame) -> pd.DataFrame:
    """The table with an int64 ``event_time_ms`` column, derived from a tz-aware ``event_time`` if needed.

    Raises:
        ValueError: if only a naive (timezone-less) ``event_time`` is there.
    """
    if EVENT_TIME_MS in transactions.columns:
        return transactions
    event_time = transactions[TxColumns.EVENT_TIME]
    if not isinstance(event_time.dtype, pd.DatetimeTZDtype):
        raise ValueError(f"{TxColumns.EVENT_TIME} must be a timezone-aware datetime column")
    ms = event_time.dt.tz_convert("UTC").dt.as_unit("ms").astype("int64")
    return transactions.assign(**{EVENT_TIME_MS: ms})


def compute_features(
    transactions: pd.DataFrame,
    labels: pd.DataFrame | None = None,
    params: FeatureParams = DEFAULT_PARAMS,
) -> pd.DataFrame:
    """Features of a whole table: the batch reference path, one ``card_step``/``terminal_step`` call each.

    Args:
        transactions: columns tx_id (int64), card_id, terminal_id, amount (float64), event_time_ms
            (int64, UTC ms; see ``with_event_time_ms`` for a tz-aware ``event_time`` column).
        labels: ``LABEL_COLUMNS`` (see ``labels_from_fraud_flags``); ``None`` when there are none.
        params: windows, label delay and lateness.

    Returns:
        tx_id then ``params.feature_columns``, one row per transaction, sorted by (event_time_ms, tx_id).
    """
    tx_id = transactions[TxColumns.TX_ID].to_numpy(dtype=np.int64)
    event_time = transactions[EVENT_TIME_MS].to_numpy(dtype=np.int64)
    order = _order_by(event_time, tx_id)
    # Keys become int codes here, in the table's own row order: hashing millions of strings is much
    # faster before they are shuffled into time order, and the steps accept int keys as they are.
    card_code, _ = pd.factorize(transactions[TxColumns.CARD_ID], use_na_sentinel=False)
    terminal_code, terminals = pd.factorize(transactions[TxColumns.TERMINAL_ID], use_na_sentinel=False)
    table = pd.DataFrame(
        {
            TxColumns.TX_ID: tx_id[order],
            TxColumns.CARD_ID: card_code.astype(np.int64)[order],
            TxColumns.TERMINAL_ID: terminal_code.astype(np.int64)[order],
            TxColumns.AMOUNT: transactions[TxColumns.AMOUNT].to_numpy(dtype=np.float64)[order],
            EVENT_TIME_MS: event_time[order],
        }
    )
    if labels is not None:
        # A label of a terminal without transactions here cannot count: they all share one spare code.
        label_terminal = pd.Index(terminals).get_indexer(labels[TxColumns.TERMINAL_ID])
        label_terminal[label_terminal < 0] = len(terminals)
        labels = labels.assign(**{TxColumns.TERMINAL_ID: label_terminal.astype(np.int64)})
    _, card = card_step(CardState.empty(), table, params)
    _, terminal = terminal_step(TerminalState.empty(), table, labels, params)
    times = time_features(table[EVENT_TIME_MS].to_numpy())
    joined = pd.concat([card, terminal.drop(columns=TxColumns.TX_ID), times], axis=1)
    return joined[[TxColumns.TX_ID, *params.feature_columns]]


__all__ = [
    "LABEL_COLUMNS",
    "CardState",
    "TerminalState",
    "amount_to_cents",
    "card_step",
    "card_windows",
    "compute_features",
    "empty_labels",
    "labels_from_fraud_flags",
    "terminal_step",
    "time_features",
    "with_event_time_ms",
]
