"""Redis connections: clients of a URL that log in as its ``RedisConnection`` says (user, password, TLS), one
per process, refusals as :class:`RedisAccessError`, and writes that wait out an outage (:class:`RedisTarget`)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

from contracts.errors import ServiceUnavailableError
from contracts.privacy import redact_url
from contracts.redis_keys import stats_key
from contracts.sections import RedisConnection
from infra.retry import wait_out

T = TypeVar("T")


#: A server reached by its URL alone (the embedded stack's Valkey).
URL_ONLY = RedisConnection()


def redis_client(url: str, options: RedisConnection = URL_ONLY, **kwargs: Any) -> Any:
    """A new redis-py client of ``url`` with ``options`` (and any other client ``kwargs``)."""
    import redis

    return redis.Redis.from_url(url, **options.client_kwargs(), **kwargs)


class RedisAccessError(ServiceUnavailableError):
    """Redis answers, but refuses the credentials (a wrong password or user) or a command (an ACL user
    without it): a setting to correct, not an outage to wait out."""


@contextlib.contextmanager
def refused_access(url: str) -> Iterator[None]:
    """Redis's refusals inside the block as :class:`RedisAccessError` (one line: server, what it said,
    what to check)."""
    import redis

    try:
        yield
    except redis.AuthenticationError as exc:
        raise RedisAccessError(
            f"Redis at {redact_url(url)} refused the credentials ({exc}): check FRAUD_REDIS_USERNAME and "
            "FRAUD_REDIS_PASSWORD (or the user and password of FRAUD_REDIS_URL)"
        ) from None
    except redis.exceptions.NoPermissionError as exc:
        raise RedisAccessError(
            f"Redis at {redact_url(url)} refused a command ({exc}): its ACL user needs the commands the "
            "jobs run on their keys (docs/operations.md)"
        ) from None


def check_access(client: Any, url: str) -> None:
    """A PING with ``client``'s credentials: refused credentials raise :class:`RedisAccessError`; a Redis
    that does not answer passes (an outage: the writes wait it out).

    Raises:
        RedisAccessError: Redis refused the credentials.
    """
    import redis

    with contextlib.suppress(redis.ConnectionError, redis.TimeoutError), refused_access(url):
        try:
            client.ping()
        except redis.exceptions.NoPermissionError:
            return  # an ACL user may be denied PING and still write: its writes will tell


@dataclass(frozen=True)
class RedisTarget:
    """Where a job keeps its lookups: the server, the key prefix of its namespace (empty for the live
    pipeline), how long what it writes is kept (``Settings.alert_retention_s``) and how to log in."""

    url: str
    prefix: str
    retention_s: int
    options: RedisConnection = URL_ONLY
    #: Who writes (a job's name): its failed write attempts are counted under it (:func:`write_failures`).
    writer: str = ""

    def __repr__(self) -> str:
        return (
            f"RedisTarget({redact_url(self.url)!r}, prefix={self.prefix!r}, retention_s={self.retention_s}, "
            f"options={self.options!r}, writer={self.writer!r})"
        )

    def client(self) -> Any:
        """This process's client of the server (Spark workers reuse it across micro-batches)."""
        return client_for(self.url, self.options)

    def write(self, operation: Callable[[Any], T]) -> T:
        """``operation(client)``, waiting out a Redis outage (a restart, a failover, a network cut): the
        writes are idempotent and must not be lost, so they are retried until Redis answers.

        Raises:
            RedisAccessError: Redis refused the credentials or the command (no outage: waiting would
                never end).
        """
        import redis

        with refused_access(self.url):
            return wait_out(
                lambda: operation(self.client()),
                f"Redis at {redact_url(self.url)}",
                (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError),
                on_recovered=self._count_failures,
                permanent=(redis.AuthenticationError,),
            )

    def check_access(self) -> None:
        """Fail now if Redis refuses the credentials (:func:`check_access`), before a job starts."""
        check_access(self.client(), self.url)

    def _count_failures(self, failures: int) -> None:
        """Add an outage's failed attempts to the writer's count, in Redis (write tasks may run on any
        executor; the job's driver reads the count for its metrics)."""
        with contextlib.suppress(Exception):  # a count must never fail the write it follows
            self.client().hincrby(stats_key(self.prefix), f"{self.writer}:write_failures", failures)

    def write_failures(self) -> int | None:
        """The writer's failed write attempts so far (all its runs), or None when Redis does not answer."""
        try:
            stored = self.client().hget(stats_key(self.prefix), f"{self.writer}:write_failures")
        except Exception:
            return None
        return int(stored or 0)


_CLIENTS: dict[tuple[str, RedisConnection], Any] = {}
#: Seconds a Redis call may wait for the server before it counts as away.
SOCKET_TIMEOUT_S = 5.0


def client_for(url: str, options: RedisConnection = URL_ONLY) -> Any:
    """A redis-py client for ``url`` and ``options``, one per process (Spark workers reuse it across
    micro-batches)."""
    if (url, options) not in _CLIENTS:
        # Timeouts, so that a server that stops answering (paused, cut off) is an error to wait out
        # (RedisTarget.write) rather than a write blocked forever.
        _CLIENTS[url, options] = redis_client(
            url, options, socket_timeout=SOCKET_TIMEOUT_S, socket_connect_timeout=SOCKET_TIMEOUT_S
        )
    return _CLIENTS[url, options]
