"""A Redis outage is waited out: the lookup writes after a Kafka commit retry until the server answers
again, whether it was restarted or paused, and say so in one line at each end of the outage."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from infra.embedded.stack import HOST, free_port, valkey_binary
from infra.redis.connection import SOCKET_TIMEOUT_S, RedisTarget
from infra.redis.store import set_latest

OUTAGE_S = 3.0


class Server:
    """A Valkey server of this test's own, on a fixed port, that can be killed, restarted and paused."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        args = [
            "--port",
            str(self.port),
            "--bind",
            HOST,
            "--dir",
            str(self.home),
            "--save",
            "",
            "--appendonly",
            "no",
        ]
        self.process = subprocess.Popen([str(valkey_binary()), *args], stdout=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                if redis.Redis(host=HOST, port=self.port, socket_timeout=1).ping():
                    return
            except redis.RedisError:
                time.sleep(0.05)
        raise AssertionError("the test's Valkey server did not start")

    def kill(self) -> None:
        assert self.process is not None
        self.process.kill()
        self.process.wait()

    def signal(self, sig: signal.Signals) -> None:
        assert self.process is not None
        os.kill(self.process.pid, sig)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    server = Server(tmp_path)
    server.start()
    yield server
    if server.process is not None and server.process.poll() is None:
        server.signal(signal.SIGCONT)
        server.kill()


def write_in_background(target: RedisTarget, tx_id: int) -> threading.Thread:
    rows = [("t:card:1:features", 1_000 + tx_id, tx_id, {"amount": float(tx_id)})]
    thread = threading.Thread(target=target.write, args=(lambda client: set_latest(client, rows, 3600),))
    thread.start()
    return thread


def stored(server: Server) -> dict[bytes, bytes]:
    return redis.Redis(host=HOST, port=server.port).hgetall("t:card:1:features")


def test_a_write_during_a_restart_waits_for_the_server(
    server: Server, caplog: pytest.LogCaptureFixture
) -> None:
    target = RedisTarget(f"redis://{HOST}:{server.port}/0", "t:", 3600, writer="features")
    write_in_background(target, 1).join(10)
    assert stored(server)[b"tx_id"] == b"1"
    assert target.write_failures() == 0

    server.kill()
    with caplog.at_level(logging.INFO, logger="infra.retry"):
        writing = write_in_background(target, 2)
        time.sleep(OUTAGE_S)
        assert writing.is_alive(), "the write gave up while Redis was away"
        server.start()
        writing.join(30)
    assert not writing.is_alive()
    assert stored(server)[b"tx_id"] == b"2", "the write landed once Redis was back"
    failures = target.write_failures()  # counted in Redis once it answers, for the job's metrics
    assert failures is not None and failures >= 2
    lines = [record.getMessage() for record in caplog.records]
    assert (
        sum("unreachable" in line for line in lines) == 1
        and sum("answers again" in line for line in lines) == 1
    )


def test_a_write_during_a_pause_waits_for_the_server(server: Server) -> None:
    target = RedisTarget(f"redis://{HOST}:{server.port}/0", "t:", 3600)
    write_in_background(target, 1).join(10)
    server.signal(signal.SIGSTOP)
    writing = write_in_background(target, 2)
    time.sleep(SOCKET_TIMEOUT_S + OUTAGE_S)  # past the socket timeout: the call has failed at least once
    assert writing.is_alive()
    server.signal(signal.SIGCONT)
    writing.join(30)
    assert not writing.is_alive() and stored(server)[b"tx_id"] == b"2"
