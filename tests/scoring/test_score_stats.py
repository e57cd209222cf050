"""The per-minute counts of scores behind the live page's charts (``scoring.score_stats``), without Redis."""

from __future__ import annotations

from scoring.score_stats import MINUTE_MS, SCORE_BINS, score_stats
from tests.support.factories import T0_MS, make_score


def values(*scores: tuple[int, float, int, int]) -> list[bytes]:
    """Score records of (tx_id, score, scored_at_ms, model_version), alert at 0.5."""
    return [
        make_score(tx_id, score=score, scored_at_ms=at, model_version=version, alert=score >= 0.5)
        .model_dump_json()
        .encode()
        for tx_id, score, at, version in scores
    ]


def test_scores_are_counted_by_minute_of_scoring_and_version_into_bins() -> None:
    minute = T0_MS // MINUTE_MS
    stats = score_stats(
        values(
            (1, 0.0, T0_MS, 3),
            (2, 0.019, T0_MS + 1, 3),
            (3, 0.02, T0_MS + 59_999, 3),
            (4, 0.97, T0_MS + 60_000, 3),
            (5, 1.0, T0_MS + 60_000, 3),
            (6, 0.5, T0_MS + 10, 4),
        )
    )
    assert stats is not None
    assert sorted(stats.counts) == [(minute, 3), (minute, 4), (minute + 1, 3)]
    first = stats.counts[minute, 3]
    assert (first.scores, first.alerts) == (3, 0)
    assert first.bins[:2] == [2, 1] and sum(first.bins) == 3 and len(first.bins) == SCORE_BINS
    second = stats.counts[minute + 1, 3]
    assert (second.scores, second.alerts) == (2, 2)
    assert second.bins[SCORE_BINS - 2 :] == [1, 1]  # 0.97, and 1.0 in the last bin
    assert stats.counts[minute, 4].bins[SCORE_BINS // 2] == 1
    assert [(m.version, m.first_ms, m.last_ms, m.threshold) for m in stats.models] == [
        (3, T0_MS, T0_MS + 60_000, 0.5),
        (4, T0_MS + 10, T0_MS + 10, 0.5),
    ]


def test_the_token_names_the_rows_so_a_rerun_has_the_same_and_another_task_another() -> None:
    rows = [(1, 0.1, T0_MS, 3), (7, 0.2, T0_MS, 3)]
    first, again = score_stats(values(*rows)), score_stats(values(*reversed(rows)))
    other = score_stats(values((2, 0.1, T0_MS, 3), (8, 0.2, T0_MS, 3)))
    assert first is not None and again is not None and other is not None
    assert first.token == again.token
    assert other.token != first.token


def test_no_scores_no_stats() -> None:
    assert score_stats([]) is None
