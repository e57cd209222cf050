"""``fraud state``'s feature parameters: the job's, as its checkpoint records them, with the label delay
the command is given, if any."""

from __future__ import annotations

from features.definitions import DAY_MS, FeatureParams
from fraud.commands.state import _params

RECORDED = FeatureParams(window_days=(1, 7, 14, 30), label_delay_ms=3 * DAY_MS, max_lateness_ms=60_000)


def test_without_a_delay_the_command_shows_the_jobs_windows_and_delay() -> None:
    assert _params(RECORDED, None) == RECORDED


def test_a_delay_given_replaces_the_recorded_one_only() -> None:
    assert _params(RECORDED, 5.0) == RECORDED.model_copy(update={"label_delay_ms": 5 * DAY_MS})
