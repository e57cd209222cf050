"""The timing lines of ``infra.spark.timing``: phases in milliseconds, logged at debug level only."""

from __future__ import annotations

import logging

import pytest

from infra.spark.timing import PREFIX, Timings


def test_a_line_names_the_context_and_each_phase(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="infra.spark.timing")
    timings = Timings("card-stage", batch=7)
    with timings.phase("core"):
        pass
    with timings.phase("core"):  # a phase entered twice adds up
        pass
    items = list(timings.timed("read", iter([1, 2, 3])))
    timings.log()
    assert items == [1, 2, 3]
    (line,) = [r.getMessage() for r in caplog.records]
    what, batch, *phases = line.removeprefix(f"{PREFIX} ").split()
    assert (what, batch) == ("card-stage", "batch=7")
    assert [phase.split("=")[0] for phase in phases] == ["core", "read"]
    assert all("." in phase.split("=")[1] for phase in phases)


def test_nothing_is_logged_above_debug(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="infra.spark.timing")
    timings = Timings("sink-write")
    with timings.phase("commit"):
        pass
    timings.log()
    assert not caplog.records
