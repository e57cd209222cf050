"""Outages are waited out, not fatal: a call to a service that is away is retried with capped exponential
backoff until it answers, with one log line when the outage starts and one when it ends.

For writes that must happen and are idempotent (Redis lookups after a Kafka commit): giving up would
leave the lookup store behind the topics, and repeating a write changes nothing.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Backoff:
    """Waits between attempts: ``first_s``, doubling up to ``cap_s``."""

    first_s: float = 0.1
    cap_s: float = 10.0

    def wait_s(self, failures: int) -> float:
        return min(self.cap_s, self.first_s * 2 ** (failures - 1))


def wait_out(
    call: Callable[[], T],
    what: str,
    transient: tuple[type[BaseException], ...],
    backoff: Backoff = Backoff(),
    sleep: Callable[[float], None] = time.sleep,
    on_recovered: Callable[[int], None] | None = None,
    permanent: tuple[type[BaseException], ...] = (),
) -> T:
    """``call()``, retried while it raises one of ``transient`` (the service is away); other errors raise,
    and so do those of ``permanent`` even where they are of a transient kind (redis-py's refused password
    is a connection error: waiting never makes it right).

    Logs a warning when the outage starts (``what`` unreachable, and why) and an info line when it ends
    (after how long and how many attempts). ``on_recovered(failures)`` is called once the call succeeded
    after failures (to count them where it can be seen).
    """
    failures = 0
    since = 0.0
    while True:
        try:
            result = call()
        except transient as error:
            if isinstance(error, permanent):
                raise
            failures += 1
            if failures == 1:
                since = time.monotonic()
                _log.warning(
                    "%s unreachable (%s: %s); retrying until it answers", what, type(error).__name__, error
                )
            sleep(backoff.wait_s(failures))
            continue
        if failures:
            _log.warning(
                "%s answers again after %.1f s (%d failed attempts)", what, time.monotonic() - since, failures
            )
            if on_recovered is not None:
                on_recovered(failures)
        return result
