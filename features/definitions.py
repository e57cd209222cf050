"""Features declared once: their names, parameters and specs.

Each feature is a :class:`FeatureSpec` (name, dtype, window, meaning) of :attr:`FeatureParams.specs`. The
streaming job's row schemas, the batch output, the feature records, the models' feature columns and the
documentation's feature table derive from the specs; nothing else spells a feature. Each is computed once,
in ``features.core``. Adding a feature is its spec here, its computation in the core, and its test.

All times are UTC milliseconds. The default parameters reproduce the features of Le Borgne et al.,
"Reproducible Machine Learning for Credit Card Fraud Detection - Practical Handbook", plus a few extras.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from contracts.events import DAY_MS, HOUR_MS, TxColumns

SECOND_MS = 1_000

# --- Input columns of the feature core besides ``TxColumns`` (names as in the wire events) -------------

#: Event time of a transaction in UTC milliseconds (``TransactionEvent.event_time_ms``).
EVENT_TIME_MS = "event_time_ms"
#: Event time of the labelled transaction (``LabelEvent.tx_time_ms``).
TX_TIME_MS = "tx_time_ms"
#: When the label became known (``LabelEvent.known_at_ms``).
KNOWN_AT_MS = "known_at_ms"
#: Amount in integer cents, as kept in the per-card state.
AMOUNT_CENTS = "amount_cents"

#: Columns of a label table (``LabelEvent`` fields that the terminal features use).
LABEL_COLUMNS = (TxColumns.TX_ID, TxColumns.TERMINAL_ID, TX_TIME_MS, KNOWN_AT_MS, TxColumns.IS_FRAUD)


# --- Feature names ----------------------------------------------------------------------------------


def card_nb_tx_column(days: int) -> str:
    """Name of the card's number of transactions in the last ``days`` days (the transaction included)."""
    return f"card_nb_tx_{days}d"


def card_avg_amount_column(days: int) -> str:
    """Name of the card's mean amount over the last ``days`` days (the transaction included)."""
    return f"card_avg_amount_{days}d"


def terminal_nb_tx_column(days: int) -> str:
    """Name of the terminal's number of transactions in the ``days``-day window ending a label delay ago."""
    return f"terminal_nb_tx_{days}d"


def terminal_risk_column(days: int) -> str:
    """Name of the share of known frauds among the terminal's transactions of that delayed window."""
    return f"terminal_risk_{days}d"


def card_nb_tx_hours_column(hours: int) -> str:
    """Name of the card's number of transactions in the last ``hours`` hours (the transaction included)."""
    return f"card_nb_tx_{hours}h"


def card_amount_ratio_column(days: int) -> str:
    """Name of the amount divided by the card's mean amount over the last ``days`` days."""
    return f"card_amount_ratio_{days}d"


def card_amount_zscore_column(days: int) -> str:
    """Name of how many standard deviations the amount lies from the card's mean of the ``days`` days before
    the transaction (the transaction excluded)."""
    return f"card_amount_zscore_{days}d"


def card_prior_ratio_column(days: int) -> str:
    """Name of the amount divided by the card's mean of the ``days`` days before it (the transaction
    excluded)."""
    return f"card_prior_amount_ratio_{days}d"


def card_nb_unusual_column(days: int) -> str:
    """Name of the card's number of unusual amounts (:data:`UNUSUAL_AMOUNT_FACTOR`) in the ``days`` days
    before the transaction (the transaction excluded)."""
    return f"card_nb_unusual_{days}d"


#: An amount is unusual for a card past this many times the mean amount of its earlier transactions in the
#: longest window; ``card_nb_unusual_*`` counts them over this many days (at most the longest window).
UNUSUAL_AMOUNT_FACTOR = 3
UNUSUAL_WINDOW_DAYS = 7


def terminal_nb_fraud_column(days: int) -> str:
    """Name of the terminal's number of known frauds in the ``days``-day window ending a label delay ago."""
    return f"terminal_nb_fraud_{days}d"


#: 1 on Saturday and Sunday (UTC), else 0.
IS_WEEKEND = "is_weekend"
#: 1 when the UTC hour of day is <= 6 (06:59:59.999 is night, 07:00 is not), else 0.
IS_NIGHT = "is_night"
#: Seconds since the card's previous transaction in (event_time, tx_id) order. Capped at the longest card
#: window (30 days = 2,592,000 s): a first transaction, or one whose predecessor is that old, gets the cap.
CARD_SECS_SINCE_PREV_TX = "card_secs_since_prev_tx"
#: Days from the tx time of the terminal's earliest known fraud in its longest delayed window to the
#: transaction (the window's length plus the delay, 37 days, when there is none): how long a compromise
#: has been going on.
TERMINAL_DAYS_SINCE_FIRST_FRAUD = "terminal_days_since_first_fraud"
#: Amount / card_avg_amount_30d (1.0 when that mean is 0).
CARD_AMOUNT_RATIO_30D = card_amount_ratio_column(30)

# --- Specs: each feature declared once ----------------------------------------------------------------


@dataclass(frozen=True)
class FeatureSpec:
    """One feature, declared once: the stream's row schema, the batch output, the models' columns and the
    documentation's feature table are all derived from these."""

    name: str
    #: What it describes: the card, the terminal, or the transaction's time.
    entity: Literal["card", "terminal", "time"]
    dtype: Literal["int64", "float64"]
    #: The window of event time it covers, as people say it ("" when it has none).
    window: str
    meaning: str
    #: One of the 15 model inputs of the handbook (the ``handbook`` feature set).
    handbook: bool = False


def _days(ms: int) -> str:
    days = ms / DAY_MS
    return f"{days:g} d"


# --- Parameters -------------------------------------------------------------------------------------

PositiveInt = Annotated[int, Field(gt=0)]
NonNegativeInt = Annotated[int, Field(ge=0)]


class FeatureParams(BaseModel):
    """Windows, label delay and allowed lateness of the features.

    The column names follow the windows (``card_nb_tx_{n}d`` …); with the defaults they are exactly
    ``FEATURE_COLUMNS``.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    window_days: tuple[PositiveInt, ...] = Field(
        default=(1, 7, 30), description="Card and terminal windows in days, strictly increasing."
    )
    short_window_hours: PositiveInt = Field(default=1, description="The card's short (burst) window.")
    label_delay_ms: NonNegativeInt = Field(
        default=7 * DAY_MS, description="Delay d: terminal windows end d before the transaction."
    )
    allowed_lateness_ms: NonNegativeInt = Field(
        default=0,
        description="How far behind the latest event time seen an event may still arrive; only decides "
        "how much history the state keeps.",
    )

    @field_validator("window_days")
    @classmethod
    def _increasing(cls, value: tuple[int, ...]) -> tuple[int, ...]:
        if not value:
            raise ValueError("at least one window is needed")
        if any(b <= a for a, b in pairwise(value)):
            raise ValueError("windows must be strictly increasing")
        return value

    @property
    def windows_ms(self) -> tuple[int, ...]:
        """The day windows in milliseconds."""
        return tuple(days * DAY_MS for days in self.window_days)

    @property
    def longest_window_ms(self) -> int:
        """The longest day window in milliseconds (also the cap of ``card_secs_since_prev_tx``)."""
        return self.window_days[-1] * DAY_MS

    @property
    def short_window_ms(self) -> int:
        """The short card window in milliseconds."""
        return self.short_window_hours * HOUR_MS

    @property
    def prior_window_days(self) -> tuple[int, ...]:
        """The card windows whose history before a transaction measures its amount: all but the shortest
        (a day holds too few transactions to give a card's usual amount)."""
        return self.window_days[1:]

    @property
    def unusual_window_days(self) -> int:
        """The days over which ``card_nb_unusual_*`` counts a card's unusual amounts."""
        return min(UNUSUAL_WINDOW_DAYS, self.window_days[-1])

    @property
    def card_span_ms(self) -> int:
        """How far back in event time the card features look: their longest window."""
        return max(self.longest_window_ms, self.short_window_ms)

    @property
    def terminal_span_ms(self) -> int:
        """How far back in event time the terminal features look: their longest window plus the delay."""
        return self.longest_window_ms + self.label_delay_ms

    @property
    def card_history_ms(self) -> int:
        """How far behind the latest event time the card state must keep transactions."""
        return self.card_span_ms + self.allowed_lateness_ms

    @property
    def terminal_history_ms(self) -> int:
        """How far behind the latest event time the terminal state must keep transactions and labels."""
        return self.terminal_span_ms + self.allowed_lateness_ms

    @property
    def specs(self) -> tuple[FeatureSpec, ...]:
        """Every feature for these parameters, in the canonical order of the feature rows."""
        handbook = set(self.window_days) <= {1, 7, 30}
        delay = _days(self.label_delay_ms)
        card_windows = [
            spec
            for days in self.window_days
            for spec in (
                FeatureSpec(
                    card_nb_tx_column(days),
                    "card",
                    "int64",
                    f"{days} d",
                    f"the card's transactions with event time in (t - {days} d, t], the transaction included "
                    "(same millisecond: ordered by tx id)",
                    handbook,
                ),
                FeatureSpec(
                    card_avg_amount_column(days),
                    "card",
                    "float64",
                    f"{days} d",
                    "the mean amount of those transactions (never empty: the transaction is one)",
                    handbook,
                ),
            )
        ]
        terminal_windows = [
            spec
            for days in self.window_days
            for spec in (
                FeatureSpec(
                    terminal_nb_tx_column(days),
                    "terminal",
                    "int64",
                    f"{days} d, {delay} before",
                    f"the terminal's transactions in the {days}-day window that ends one label delay before "
                    f"t: (t - {_days(days * DAY_MS + self.label_delay_ms)}, t - {delay}]",
                    handbook,
                ),
                FeatureSpec(
                    terminal_risk_column(days),
                    "terminal",
                    "float64",
                    f"{days} d, {delay} before",
                    "the share of those whose fraud label was known by t (0 when there are none)",
                    handbook,
                ),
            )
        ]
        time = [
            FeatureSpec(IS_WEEKEND, "time", "int64", "", "1 on Saturday and Sunday (UTC), else 0", handbook),
            FeatureSpec(
                IS_NIGHT, "time", "int64", "", "1 when the UTC hour of day is <= 6, else 0", handbook
            ),
        ]
        longest = self.window_days[-1]
        card_more = [
            FeatureSpec(
                card_nb_tx_hours_column(self.short_window_hours),
                "card",
                "int64",
                f"{self.short_window_hours} h",
                f"the card's transactions in (t - {self.short_window_hours} h, t]: bursts",
            ),
            FeatureSpec(
                CARD_SECS_SINCE_PREV_TX,
                "card",
                "float64",
                f"{longest} d",
                f"seconds since the card's previous transaction, capped at {longest} d (also for a first one)",
            ),
            FeatureSpec(
                card_amount_ratio_column(longest),
                "card",
                "float64",
                f"{longest} d",
                f"the amount / the card's {longest}-day mean amount (1.0 when that mean is 0)",
            ),
        ]
        card_prior = [
            spec
            for days in self.prior_window_days
            for spec in (
                FeatureSpec(
                    card_prior_ratio_column(days),
                    "card",
                    "float64",
                    f"{days} d",
                    f"the amount / the mean amount of the card's earlier transactions in (t - {days} d, t], the "
                    "transaction excluded, so a run of large amounts does not hide in its own mean (1.0 "
                    "when there are none or their mean is 0)",
                ),
                FeatureSpec(
                    card_amount_zscore_column(days),
                    "card",
                    "float64",
                    f"{days} d",
                    "(the amount - the mean of those earlier transactions) / their standard deviation "
                    "(population); 0.0 when there are fewer than two or all are equal",
                ),
            )
        ]
        unusual = self.unusual_window_days
        card_unusual = FeatureSpec(
            card_nb_unusual_column(unusual),
            "card",
            "int64",
            f"{unusual} d, {longest} d",
            f"the number of the card's earlier transactions in (t - {unusual} d, t], the transaction excluded, "
            f"whose amount is over {UNUSUAL_AMOUNT_FACTOR} times the mean amount of its earlier transactions in "
            f"(t - {longest} d, t]: a card spending far above its usual amounts again and again",
        )
        terminal_frauds = [
            FeatureSpec(
                terminal_nb_fraud_column(days),
                "terminal",
                "int64",
                f"{days} d, {delay} before",
                f"the number of known frauds among the terminal's transactions of `{terminal_nb_tx_column(days)}`'s "
                "window (labels known by t): a count, where the risk is a share",
            )
            for days in self.window_days
        ]
        span = _days(self.longest_window_ms + self.label_delay_ms)
        terminal_frauds.append(
            FeatureSpec(
                TERMINAL_DAYS_SINCE_FIRST_FRAUD,
                "terminal",
                "float64",
                f"{longest} d, {delay} before",
                f"days from the earliest known fraud among the terminal's transactions of "
                f"`{terminal_nb_tx_column(longest)}`'s window to t ({span} when there is none): how long a "
                "compromise has been going on",
            )
        )
        return (
            *card_windows,
            *terminal_windows,
            *time,
            *card_more,
            *card_prior,
            card_unusual,
            *terminal_frauds,
        )

    @property
    def feature_columns(self) -> tuple[str, ...]:
        """Every feature column for these parameters, in canonical order."""
        return tuple(spec.name for spec in self.specs)

    @property
    def card_feature_columns(self) -> tuple[str, ...]:
        """Columns produced by ``card_step`` (besides tx_id), in canonical order."""
        return tuple(spec.name for spec in self.specs if spec.entity == "card")

    @property
    def terminal_feature_columns(self) -> tuple[str, ...]:
        """Columns produced by ``terminal_step`` (besides tx_id), in canonical order."""
        return tuple(spec.name for spec in self.specs if spec.entity == "terminal")

    def spec(self, name: str) -> FeatureSpec:
        """The spec of one feature column."""
        for spec in self.specs:
            if spec.name == name:
                return spec
        raise KeyError(name)


#: The handbook's parameters: windows of 1, 7 and 30 days, a 7-day label delay, no lateness.
DEFAULT_PARAMS = FeatureParams()
#: Every feature with the handbook's parameters, in the canonical order of the feature rows.
FEATURE_COLUMNS: tuple[str, ...] = DEFAULT_PARAMS.feature_columns


def handbook_columns(specs: tuple[FeatureSpec, ...]) -> tuple[str, ...]:
    """The handbook's model inputs, in its order: the amount, the time flags, card and terminal features."""
    order = {"time": 0, "card": 1, "terminal": 2}
    chosen = sorted((spec for spec in specs if spec.handbook), key=lambda spec: order[spec.entity])
    return (TxColumns.AMOUNT, *(spec.name for spec in chosen))


#: The 15 model inputs of the handbook, in its order.
HANDBOOK_FEATURES: tuple[str, ...] = handbook_columns(DEFAULT_PARAMS.specs)


def feature_table(params: FeatureParams = DEFAULT_PARAMS) -> str:
    """The features as a Markdown table (the documentation's, generated: ``python -m features.definitions``)."""
    rows = ["| column | type | window | meaning |", "| --- | --- | --- | --- |"]
    for spec in params.specs:
        window = spec.window or "-"
        rows.append(f"| `{spec.name}` | {spec.dtype} | {window} | {spec.meaning} |")
    return "\n".join(rows)


if __name__ == "__main__":
    print(feature_table())
