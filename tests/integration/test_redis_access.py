"""Redis refusing the credentials (a wrong password) or a command (an ACL user without it) is a setting to
correct, not an outage: a write fails at once with one line where an outage is waited out, and a job or
`fraud serve` started with such credentials stops before it starts, with exit 3.

Against the session's Valkey, with ACL users of each test's own.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from pydantic import SecretStr

from contracts.sections import RedisConnection
from contracts.settings import Settings
from infra.embedded.stack import StackInfo, free_port
from infra.redis.connection import RedisAccessError, RedisTarget, check_access, redis_client
from tests.support.scripts import run_fraud

PASSWORD = f"acl-{uuid.uuid4().hex}"
WRONG = f"wrong-{uuid.uuid4().hex}"


@pytest.fixture
def users(stack: StackInfo) -> Iterator[tuple[str, str]]:
    """Two ACL users with PASSWORD: one that may run everything, one that may only PING."""
    name = uuid.uuid4().hex[:8]
    writer, pinger = f"fraud-writer-{name}", f"fraud-pinger-{name}"
    admin = redis.Redis.from_url(stack.redis_url)
    admin.acl_setuser(writer, enabled=True, passwords=[f"+{PASSWORD}"], keys=["*"], commands=["+@all"])
    admin.acl_setuser(pinger, enabled=True, passwords=[f"+{PASSWORD}"], keys=["*"], commands=["+ping"])
    yield writer, pinger
    admin.acl_deluser(writer, pinger)


def within(seconds: float, call: Callable[[], Any]) -> Any:
    """``call()`` in a thread of its own, which must end within ``seconds`` (a retry forever does not)."""
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["value"] = call()
        except BaseException as exc:  # handed to the test
            outcome["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still retrying after {seconds} s"
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("value")


def target(stack: StackInfo, user: str, password: str) -> RedisTarget:
    options = RedisConnection(username=user, password=SecretStr(password))
    return RedisTarget(stack.redis_url, f"acl-{uuid.uuid4().hex[:6]}:", 60, options, "test")


def test_a_wrong_password_fails_a_write_at_once(stack: StackInfo, users: tuple[str, str]) -> None:
    writer, _ = users
    assert target(stack, writer, PASSWORD).write(lambda client: client.set("acl-test", 1))
    with pytest.raises(RedisAccessError, match="refused the credentials") as refused:
        within(30, lambda: target(stack, writer, WRONG).write(lambda client: client.set("acl-test", 1)))
    assert WRONG not in str(refused.value) and refused.value.exit_code == 3


def test_a_command_the_user_may_not_run_fails_a_write_at_once(
    stack: StackInfo, users: tuple[str, str]
) -> None:
    _, pinger = users
    pinging = target(stack, pinger, PASSWORD)
    pinging.check_access()  # its credentials are right
    with pytest.raises(RedisAccessError, match="refused a command"):
        within(30, lambda: pinging.write(lambda client: client.set("acl-test", 1)))


def test_the_start_check_refuses_credentials_and_lets_an_outage_pass(
    stack: StackInfo, users: tuple[str, str]
) -> None:
    writer, _ = users
    with pytest.raises(RedisAccessError):
        target(stack, writer, WRONG).check_access()
    away = redis_client(f"redis://127.0.0.1:{free_port()}/0", socket_connect_timeout=1)
    check_access(away, "redis://127.0.0.1/0")  # away: the writes will wait it out, the start goes on


@pytest.mark.parametrize("command", [("features", "run", "--once"), ("serve", "--port", "1")])
def test_a_job_or_the_api_with_a_wrong_password_stops_before_it_starts(
    settings: Settings, users: tuple[str, str], command: tuple[str, ...]
) -> None:
    writer, _ = users
    started = time.monotonic()
    result = run_fraud(settings, *command, FRAUD_REDIS_USERNAME=writer, FRAUD_REDIS_PASSWORD=WRONG)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 3, result.stderr[-3000:]
    assert len(lines) == 1 and "refused the credentials" in lines[0], result.stderr[-3000:]
    assert WRONG not in result.stdout + result.stderr and "Traceback" not in result.stderr
    assert time.monotonic() - started < 60, "it stopped before starting Spark"
