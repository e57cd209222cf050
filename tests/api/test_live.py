"""What the live page's routes make of the counts (``api.live``): pure parts."""

from __future__ import annotations

from api.live import distribution, minutes_until, model_in_use
from scoring.score_stats import MINUTE_MS, SCORE_BINS, Counts, ScoredModel


def test_minutes_end_with_the_current_one() -> None:
    now = 100 * MINUTE_MS + 59_999
    assert minutes_until(now, 3) == [98, 99, 100]


def test_the_model_in_use_is_the_last_to_score_since_the_other_stopped() -> None:
    v3 = ScoredModel(3, "fraud-detector", 0.4, first_ms=1_000, last_ms=9_000)
    v4 = ScoredModel(4, "fraud-detector", 0.6, first_ms=5_000, last_ms=7_000)
    # v3, then v4, then back to v3 (newest last score first, as read_models orders them).
    used = model_in_use([v3, v4])
    assert used is not None
    assert (used.model_version, used.threshold, used.since_ms, used.last_scored_ms) == (3, 0.4, 7_000, 9_000)
    alone = model_in_use([v4])
    assert alone is not None and alone.since_ms == 5_000
    assert model_in_use([]) is None


def test_the_distribution_counts_the_model_in_use_only() -> None:
    bins = [0] * SCORE_BINS
    bins[0], bins[40] = 5, 2
    counts = {
        1: {3: Counts(7, 2, bins), 4: Counts(4, 1, [4] + [0] * (SCORE_BINS - 1))},
        2: {3: Counts(7, 2, bins)},
        3: {},
    }
    used = model_in_use([ScoredModel(3, "fraud-detector", 0.8, 0, 10)])
    shown = distribution(counts, used)
    assert (shown.minutes, shown.scores, shown.alerts, shown.other_versions) == (3, 14, 4, 4)
    assert shown.counts[0] == 10 and shown.counts[40] == 4 and sum(shown.counts) == 14
    assert shown.bin_width == 1 / SCORE_BINS
    nothing = distribution({1: {}}, None)
    assert (nothing.scores, nothing.model, sum(nothing.counts)) == (0, None, 0)
