"""The champion-challenger comparison: paired metrics, bootstrap intervals, McNemar, overlap and the gate."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from models.comparison import (
    ALERT_RECALL,
    ALERTS_PER_DAY,
    BUDGET_ALERT_PRECISION,
    CARD_ID,
    DAY,
    LABEL,
    ROC_AUC,
    SCORE_A,
    SCORE_B,
    TX_ID,
    Comparison,
    ComparisonError,
    compare,
    decide,
    mcnemar,
    metric_names,
)
from models.metrics import (
    alert_metrics,
    average_precision,
    card_precision_at_k,
    roc_auc,
    threshold_for_budget,
)

K = 20
BOOT = 100
DAYS = 7


def _frame(seed: int = 0, rows: int = 3000, cards: int = 400) -> pd.DataFrame:
    """Transactions over ``DAYS`` days; 5% of the cards are compromised and half their transactions are
    frauds. A separates frauds well; B has A's scores shuffled (no skill)."""
    rng = np.random.default_rng(seed)
    card = rng.integers(0, cards, rows)
    compromised = rng.random(cards) < 0.05
    label = (compromised[card] & (rng.random(rows) < 0.5)).astype(np.int64)
    good = 1 / (1 + np.exp(-(3 * label + rng.normal(0, 1, rows) - 3)))
    return pd.DataFrame(
        {
            TX_ID: np.arange(rows),
            CARD_ID: [f"card{c:04d}" for c in card],
            DAY: rng.integers(0, DAYS, rows),
            LABEL: label,
            SCORE_A: good,
            SCORE_B: rng.permutation(good),
        }
    )


def _swapped(frame: pd.DataFrame) -> pd.DataFrame:
    return frame.rename(columns={SCORE_A: SCORE_B, SCORE_B: SCORE_A})


@pytest.fixture(scope="module")
def frame() -> pd.DataFrame:
    return _frame()


@pytest.fixture(scope="module")
def worse_b(frame: pd.DataFrame) -> Comparison:
    return compare(frame, 0.5, 0.5, top_k=K, n_boot=BOOT, seed=0)


def test_data_checks(frame: pd.DataFrame) -> None:
    assert frame[TX_ID].is_unique
    assert set(frame[LABEL].unique()) == {0, 1}
    assert frame.groupby(DAY)[LABEL].sum().min() > 0


def test_a_challenger_without_skill_loses_auc_under_both_resamplings_and_is_refused(
    worse_b: Comparison,
) -> None:
    auc = worse_b.difference(ROC_AUC)
    assert auc.a > 0.9
    assert auc.b == pytest.approx(0.5, abs=0.05)
    assert auc.diff < -0.3
    assert auc.days.high < 0
    assert auc.cards.high < 0
    assert auc.days.replicates == auc.cards.replicates == BOOT
    assert worse_b.metric_names == metric_names(K)
    decision = decide(worse_b, ROC_AUC, max_precision_drop=0.02)
    assert not decision.promote
    assert decision.reason.startswith("keep A: ")
    assert "\n" not in decision.reason


def test_swapping_a_and_b_promotes_and_mirrors_every_difference(
    frame: pd.DataFrame, worse_b: Comparison
) -> None:
    """With the same budget and seed, the draws are the same: each difference and interval is mirrored."""
    budget = worse_b.alerts_per_day_budget
    better_b = compare(_swapped(frame), 0.5, 0.5, top_k=K, alerts_per_day=budget, n_boot=BOOT, seed=0)
    decision = decide(better_b, ROC_AUC, max_precision_drop=0.02)
    assert decision.promote, decision.reason
    assert decision.reason.startswith("promote B: ")
    for before in worse_b.differences:
        after = better_b.difference(before.metric)
        assert after.diff == pytest.approx(-before.diff, abs=1e-12)
        assert after.days.low == pytest.approx(-before.days.high, abs=1e-12)
        assert after.cards.low == pytest.approx(-before.cards.high, abs=1e-12)


def test_the_gate_also_needs_the_precision_at_equal_budget(frame: pd.DataFrame) -> None:
    """B alerts more at its own lower threshold (recall up beyond doubt), but puts 40 genuine
    transactions above every fraud: at the equal budget its precision falls."""
    genuine = frame.index[frame[LABEL] == 0][:40]
    noisy_b = frame.assign(**{SCORE_B: frame[SCORE_A]})
    noisy_b.loc[genuine, SCORE_B] = 0.999
    result = compare(noisy_b, 0.5, 0.2, top_k=K, n_boot=BOOT)
    recall = result.difference(ALERT_RECALL)
    assert recall.days.low > 0 and recall.cards.low > 0
    drop = result.difference(BUDGET_ALERT_PRECISION).diff
    assert drop < -0.05
    refused = decide(result, ALERT_RECALL, max_precision_drop=0.02)
    assert not refused.promote
    assert refused.reason == f"keep A: {BUDGET_ALERT_PRECISION} B - A {drop:+.4f} falls more than 0.02"
    assert decide(result, ALERT_RECALL, max_precision_drop=-drop + 0.01).promote


def test_the_gate_refuses_unknown_and_volume_metrics(worse_b: Comparison) -> None:
    with pytest.raises(ComparisonError, match="unknown metric"):
        decide(worse_b, "auc", 0.02)
    with pytest.raises(ComparisonError, match="volume"):
        decide(worse_b, ALERTS_PER_DAY, 0.02)
    with pytest.raises(ComparisonError):
        decide(worse_b, ROC_AUC, -0.01)


def test_same_seed_same_numbers_other_seed_other_intervals(frame: pd.DataFrame, worse_b: Comparison) -> None:
    again = compare(frame, 0.5, 0.5, top_k=K, n_boot=BOOT, seed=0)
    assert again == worse_b
    assert again.to_dict() == worse_b.to_dict()
    other = compare(frame, 0.5, 0.5, top_k=K, n_boot=BOOT, seed=1)
    assert [d.diff for d in other.differences] == [d.diff for d in worse_b.differences]
    assert other.difference(ROC_AUC).days != worse_b.difference(ROC_AUC).days
    assert other.difference(ROC_AUC).cards != worse_b.difference(ROC_AUC).cards


def test_point_estimates_are_the_metric_functions(frame: pd.DataFrame, worse_b: Comparison) -> None:
    y, scores = frame[LABEL], frame[SCORE_A]
    a = worse_b.a
    assert a.roc_auc == roc_auc(y, scores)
    assert a.average_precision == average_precision(y, scores)
    assert a.card_precision == card_precision_at_k(frame[CARD_ID], frame[DAY], y, scores, K)
    assert a.alerts == alert_metrics(y, scores, 0.5, DAYS)
    # The default budget is A's alerts per day at its own threshold.
    assert worse_b.alerts_per_day_budget == a.alerts.alerts_per_day


def _resampled_differences(frame: pd.DataFrame, budget: float) -> dict[str, float]:
    """B - A of every metric recomputed with the metric functions on an explicitly resampled frame."""
    values = []
    for score in (SCORE_A, SCORE_B):
        y, s = frame[LABEL].to_numpy(), frame[score].to_numpy()
        own = alert_metrics(y, s, 0.5, DAYS)
        at_budget = alert_metrics(y, s, threshold_for_budget(s, DAYS, budget), DAYS)
        cards = card_precision_at_k(frame[CARD_ID], frame[DAY], y, s, K)
        values.append(
            dict(
                zip(
                    metric_names(K),
                    (
                        roc_auc(y, s),
                        average_precision(y, s),
                        cards.mean,
                        own.precision,
                        own.recall,
                        own.alerts_per_day,
                        at_budget.precision,
                        at_budget.recall,
                    ),
                    strict=True,
                )
            )
        )
    return {name: values[1][name] - values[0][name] for name in values[0]}


def test_each_replicate_recomputes_every_metric_on_the_resample() -> None:
    """With one replicate, both intervals collapse to that replicate's differences; redraw the same days
    and cards from the seed (days first, then cards) and recompute everything on the resampled rows.

    Drawn days repeat whole days (card precision: the drawn days' values); drawn cards repeat whole cards,
    each copy a distinct card (card precision recomputed, ties between copies at the cut of k)."""
    frame = _frame(seed=3, rows=1500, cards=150)
    frame[SCORE_A] = frame[SCORE_A].round(2)  # ties, within and across the drawn copies
    result = compare(frame, 0.5, 0.5, top_k=K, alerts_per_day=8.0, n_boot=1, seed=11)
    cards = np.array(sorted(frame[CARD_ID].unique()))
    rng = np.random.default_rng(11)
    drawn_days = rng.integers(0, DAYS, size=(1, DAYS))[0]
    drawn_cards = rng.integers(0, len(cards), size=(1, len(cards)))[0]

    by_day = pd.concat([frame[frame[DAY] == day] for day in drawn_days], ignore_index=True)
    expected_days = _resampled_differences(by_day, 8.0)
    per_day = np.subtract(result.b.card_precision.per_day, result.a.card_precision.per_day)
    expected_days[metric_names(K)[2]] = float(per_day[drawn_days].mean())

    copies = pd.Series(drawn_cards).value_counts()
    by_card = pd.concat(
        [
            frame[frame[CARD_ID] == cards[code]].assign(**{CARD_ID: f"{cards[code]}#{copy}"})
            for code, times in copies.items()
            for copy in range(times)
        ],
        ignore_index=True,
    )
    expected_cards = _resampled_differences(by_card, 8.0)

    for d in result.differences:
        assert d.days.low == d.days.high == pytest.approx(expected_days[d.metric], abs=1e-12), d.metric
        assert d.cards.low == d.cards.high == pytest.approx(expected_cards[d.metric], abs=1e-12), d.metric


def _tiny() -> pd.DataFrame:
    rows = [
        # label, A, B: thresholds are 0.5
        (1, 0.9, 0.9),  # both alert, both right
        (1, 0.9, 0.1),  # A right, B wrong
        (1, 0.8, 0.2),  # A right, B wrong
        (0, 0.1, 0.7),  # A right, B wrong
        (0, 0.2, 0.6),  # A right, B wrong
        (0, 0.9, 0.1),  # A wrong, B right
        (0, 0.1, 0.1),  # neither alerts, both right
        (1, 0.2, 0.3),  # neither alerts, both wrong
    ]
    label, a, b = zip(*rows, strict=True)
    return pd.DataFrame(
        {
            TX_ID: range(len(rows)),
            CARD_ID: [f"c{i}" for i in range(len(rows))],
            DAY: [0, 0, 0, 0, 1, 1, 1, 1],
            LABEL: label,
            SCORE_A: a,
            SCORE_B: b,
        }
    )


def test_mcnemar_on_a_hand_made_frame() -> None:
    result = compare(_tiny(), 0.5, 0.5, top_k=2, n_boot=10).mcnemar
    assert (result.a_only_correct, result.b_only_correct) == (4, 1)
    assert result.statistic == pytest.approx((4 - 1 - 1) ** 2 / 5)
    assert result.exact
    # Two-sided exact binomial: P(X <= 1) for X ~ Bin(5, 1/2), doubled: 2 * 6 / 32.
    assert result.p_value == pytest.approx(12 / 32)


def test_mcnemar_uses_the_chi_squared_tail_with_many_discordant_transactions() -> None:
    # 30 transactions only A gets right (B alerts on genuine ones), 10 only B gets right.
    y = np.array([0] * 30 + [1] * 10)
    alerts_a = np.array([False] * 30 + [False] * 10)
    alerts_b = np.array([True] * 30 + [True] * 10)
    result = mcnemar(y, alerts_a, alerts_b)
    assert (result.a_only_correct, result.b_only_correct) == (30, 10)
    assert not result.exact
    assert result.statistic == pytest.approx((20 - 1) ** 2 / 40)
    assert result.p_value == pytest.approx(math.erfc(math.sqrt(result.statistic / 2)))
    assert result.p_value == pytest.approx(stats.chi2.sf(9.025, 1))


def test_mcnemar_without_discordant_transactions() -> None:
    result = mcnemar([0, 1], [False, True], [False, True])
    assert (result.statistic, result.p_value) == (0.0, 1.0)


def test_agreement_counts_by_hand() -> None:
    result = compare(_tiny(), 0.5, 0.5, top_k=2, n_boot=10).agreement
    # A alerts rows 0, 1, 2, 5; B alerts rows 0, 3, 4.
    assert (result.both, result.a_only, result.b_only, result.neither) == (1, 3, 2, 2)
    # Frauds: rows 0 (both), 1 and 2 (A only), 7 (neither).
    assert (result.frauds_both, result.frauds_a_only, result.frauds_b_only, result.frauds_neither) == (
        1,
        2,
        0,
        1,
    )


def test_equal_budget_thresholds_raise_equal_alert_counts(frame: pd.DataFrame) -> None:
    result = compare(frame, 0.5, 0.5, top_k=K, alerts_per_day=15.0, n_boot=10)
    assert result.a.budget_alerts.alerts == result.b.budget_alerts.alerts == 15 * DAYS
    assert result.a.budget_alerts.alerts_per_day == result.b.budget_alerts.alerts_per_day == 15.0

    # With tied scores, ties at the budget's edge are not split: A alerts at most the budget.
    tied = frame.assign(**{SCORE_A: frame[SCORE_A].round(1)})
    result = compare(tied, 0.5, 0.5, top_k=K, alerts_per_day=15.0, n_boot=10)
    assert result.a.budget_alerts.alerts <= 15 * DAYS
    assert result.b.budget_alerts.alerts == 15 * DAYS
    assert (tied[SCORE_A] >= result.a.budget_alerts.threshold).sum() == result.a.budget_alerts.alerts


def test_a_day_without_fraud_gives_zero_card_precision_and_finite_intervals(frame: pd.DataFrame) -> None:
    quiet = frame.assign(**{LABEL: np.where(frame[DAY] == 3, 0, frame[LABEL])})
    result = compare(quiet, 0.5, 0.5, top_k=K, n_boot=BOOT)
    assert result.a.card_precision.per_day[3] == result.b.card_precision.per_day[3] == 0.0
    for d in result.differences:
        assert math.isfinite(d.diff), d.metric
        assert math.isfinite(d.days.low) and math.isfinite(d.cards.low), d.metric


def test_no_fraud_at_all_is_nan_none_in_json_and_refused(frame: pd.DataFrame) -> None:
    genuine = frame.assign(**{LABEL: 0})
    result = compare(genuine, 0.5, 0.5, top_k=K, n_boot=20)
    auc = result.difference(ROC_AUC)
    assert math.isnan(auc.a) and math.isnan(auc.diff)
    assert math.isnan(auc.days.low) and auc.days.replicates == 0
    assert result.difference(BUDGET_ALERT_PRECISION).diff == 0.0  # both precisions are 0
    as_dict = result.to_dict()
    assert as_dict["a"][ROC_AUC] is None
    assert as_dict["differences"][ROC_AUC]["ci_days"] == {"low": None, "high": None, "replicates": 0}
    json.dumps(as_dict, allow_nan=False)
    assert f"a_{ROC_AUC}" not in result.flat_metrics()
    decision = decide(result, ROC_AUC, 0.02)
    assert not decision.promote
    assert "n/a" in decision.reason


def test_to_dict_is_plain_json_rounded_to_six_digits(worse_b: Comparison) -> None:
    as_dict = worse_b.to_dict()
    assert json.loads(json.dumps(as_dict, allow_nan=False)) == as_dict
    assert set(as_dict["differences"]) == set(metric_names(K))
    auc = as_dict["differences"][ROC_AUC]
    assert auc["diff"] == round(worse_b.difference(ROC_AUC).diff, 6)
    assert as_dict["card_precision_per_day"]["days"] == list(range(DAYS))
    assert as_dict["n_boot"] == BOOT and as_dict["seed"] == 0
    flat = worse_b.flat_metrics()
    assert flat[f"diff_{ROC_AUC}_cards_low"] == round(worse_b.difference(ROC_AUC).cards.low, 6)
    assert all(math.isfinite(v) for v in flat.values())


def test_a_single_day_has_no_day_interval(frame: pd.DataFrame) -> None:
    one_day = frame[frame[DAY] == 0]
    auc = compare(one_day, 0.5, 0.5, top_k=K, n_boot=20).difference(ROC_AUC)
    assert math.isnan(auc.days.low) and auc.days.replicates == 0
    assert math.isfinite(auc.cards.low)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda f: f.drop(columns=[SCORE_B]), "lacks the columns score_b"),
        (lambda f: f.head(0), "no transactions"),
        (lambda f: f.assign(**{TX_ID: 1}), "several rows for one tx id"),
        (lambda f: f.assign(**{LABEL: 2}), "0 or 1"),
        (lambda f: f.assign(**{SCORE_A: np.nan}), "finite"),
    ],
)
def test_unusable_frames_are_refused(frame: pd.DataFrame, change: object, message: str) -> None:
    assert callable(change)
    with pytest.raises(ComparisonError, match=message):
        compare(change(frame), 0.5, 0.5, n_boot=5)
