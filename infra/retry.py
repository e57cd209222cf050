"""Outages are waited out, not fatal: a call to a service that is away is retried with capped exponential
backoff until it answers, with one log line when the outage starts and one when it ends.

For calls that must happen and are safe to repeat: idempotent writes (Redis lookups after a Kafka
commit), reads, and the steps of a Kafka transaction that a commit marker guards. Giving up would stop
the job, or leave the lookup store behind the topics.

The lines are per process and service: when several threads of one process wait for the same service
(``what``), the first to fail says that it is away and the last to get through says that it answers again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")

_log = logging.getLogger(__name__)

#: Whether an error means the service is away (retry) rather than a mistake (raise): error types, or a test.
Transient = tuple[type[BaseException], ...] | Callable[[BaseException], bool]


@dataclass(frozen=True)
class Backoff:
    """Waits between attempts: ``first_s``, doubling up to ``cap_s``."""

    first_s: float = 0.1
    cap_s: float = 10.0

    def wait_s(self, failures: int) -> float:
        return min(self.cap_s, self.first_s * 2 ** (failures - 1))


class _Outages:
    """The calls of this process waiting for each service, so that an outage is told once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiting: dict[str, int] = {}

    def started(self, what: str) -> bool:
        """One more call waits for ``what``; whether it is the first."""
        with self._lock:
            self._waiting[what] = self._waiting.get(what, 0) + 1
            return self._waiting[what] == 1

    def ended(self, what: str) -> bool:
        """A call waiting for ``what`` got through (or gave up); whether it was the last."""
        with self._lock:
            left = self._waiting.get(what, 1) - 1
            if left:
                self._waiting[what] = left
            else:
                self._waiting.pop(what, None)
            return not left


_OUTAGES = _Outages()


def _is_transient(transient: Transient, error: BaseException) -> bool:
    if isinstance(transient, tuple):
        return isinstance(error, transient)
    return transient(error)


def _said(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


def wait_out(
    call: Callable[[], T],
    what: str,
    transient: Transient,
    backoff: Backoff = Backoff(),
    sleep: Callable[[float], object] = time.sleep,
    on_recovered: Callable[[int], None] | None = None,
    describe: Callable[[BaseException], str] = _said,
    permanent: tuple[type[BaseException], ...] = (),
) -> T:
    """``call()``, retried while it raises an error ``transient`` says is an outage (error types, or a
    test of the error); other errors raise, and so do those of ``permanent`` even where ``transient``
    calls them an outage (redis-py's refused password is a connection error: waiting never makes it
    right).

    Logs a warning when the outage starts (``what`` unreachable, and why: ``describe(error)``) and one when
    it ends (how long since the first failed call began, and how many attempts failed), once per process
    and ``what`` however many calls wait. ``on_recovered(failures)`` is called once the call succeeded
    after failures (to count them where it can be seen).
    """
    failures = 0
    since = 0.0
    try:
        while True:
            called = time.monotonic()
            try:
                result = call()
            except BaseException as error:
                if isinstance(error, permanent) or not _is_transient(transient, error):
                    raise
                failures += 1
                if failures == 1:
                    since = called  # a call may wait long before it fails: the outage began by then
                    if _OUTAGES.started(what):
                        _log.warning("%s unreachable (%s); retrying until it answers", what, describe(error))
                sleep(backoff.wait_s(failures))
                continue
            if failures:
                failed, failures = failures, 0
                if _OUTAGES.ended(what):
                    _log.warning(
                        "%s answers again after %.1f s (%d failed attempts)",
                        what,
                        time.monotonic() - since,
                        failed,
                    )
                if on_recovered is not None:
                    on_recovered(failed)
            return result
    finally:
        if failures:  # gave up (another error, an interrupt) while waiting
            _OUTAGES.ended(what)
