"""`fraud demo --follow` as a user runs it: its own embedded stack, the whole pipeline, the live part, Ctrl-C.

Small (300 cards over 61 days) so that it takes minutes, but everything is real: the demo starts a stack of
its own (none runs in its fresh FRAUD_HOME), Spark runs both jobs, the live page is served, and Ctrl-C
goes to the whole process group, as a terminal sends it.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import re
import signal
import socket
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from tests.support.scripts import FRAUD

pytestmark = pytest.mark.minutes(4)

STARTUP_TIMEOUT_S = 900
LIVE_TIMEOUT_S = 240
COUNT_TIMEOUT_S = 60
STOP_TIMEOUT_S = 180


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def descendants(pid: int) -> set[int]:
    """Every live process below ``pid`` (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(parent, []).append(int(entry.name))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def get_json(url: str) -> object:
    with urllib.request.urlopen(url, timeout=10) as response:  # noqa: S310 - a loopback URL of the test
        return json.loads(response.read())


#: What Spark's JVM and Python workers print, which belongs in their log file (``infra.spark.logs``).
SPARK_NOTICES = (
    "TransformWithStateInPandas Python worker",
    "log4j",
    " WARN ",
    "NativeCodeLoader",
    "incubator modules",
    "setLogLevel",
)


def test_demo_follow_serves_live_alerts_and_ctrl_c_stops_everything_it_started(tmp_path: Path) -> None:
    home, port = tmp_path / "home", free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("FRAUD_")}
    env.update(FRAUD_HOME=str(home), FRAUD_API_PORT=str(port), COLUMNS="200")
    args = ["demo", "--follow", "--customers", "300", "--terminals", "600", "--rate", "50"]
    demo = subprocess.Popen(
        [FRAUD, *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    lines: queue.Queue[str] = queue.Queue()
    output: list[str] = []

    def read() -> None:
        assert demo.stdout is not None
        for line in demo.stdout:
            lines.put(line)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()

    def wait_for(pattern: str, timeout_s: float) -> re.Match[str]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                line = lines.get(timeout=1)
            except queue.Empty:
                assert demo.poll() is None, f"the demo exited ({demo.returncode}):\n{''.join(output)[-3000:]}"
                continue
            output.append(line)
            if found := re.search(pattern, line):
                return found
        raise AssertionError(f"no {pattern!r} within {timeout_s:.0f} s:\n{''.join(output)[-3000:]}")

    started: set[int] = set()
    try:
        wait_for(r"Live alerts page", STARTUP_TIMEOUT_S)
        # A count every 10 s plus the time to count the alerts topic, which a loaded machine stretches.
        first = int(wait_for(r"alerts so far: ([\d,]+)", COUNT_TIMEOUT_S).group(1).replace(",", ""))
        deadline = time.monotonic() + LIVE_TIMEOUT_S
        while (
            now := int(wait_for(r"alerts so far: ([\d,]+)", COUNT_TIMEOUT_S).group(1).replace(",", ""))
        ) <= first:
            assert time.monotonic() < deadline, "no new alert from the live stream"
        assert now > first
        base = f"http://127.0.0.1:{port}"
        assert get_json(f"{base}/healthz")
        recent = get_json(f"{base}/alerts/recent")
        assert isinstance(recent, list) and recent, "the live page's API has no alerts"
        with urllib.request.urlopen(f"{base}/", timeout=10) as page:  # noqa: S310
            assert page.status == 200
        started = descendants(demo.pid)
        assert started, "the demo runs Spark in child processes"
        os.killpg(demo.pid, signal.SIGINT)  # Ctrl-C in a terminal: the whole foreground process group
        demo.wait(timeout=STOP_TIMEOUT_S)
    finally:
        if demo.poll() is None:  # a failure above: its services run in sessions of their own, kill them too
            for pid in descendants(demo.pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            os.killpg(demo.pid, signal.SIGKILL)
            demo.wait()
    reader.join(timeout=10)
    while not lines.empty():
        output.append(lines.get())
    text = "".join(output)
    (tmp_path / "demo-output.txt").write_text(text)  # the whole output, for a failure's post-mortem
    assert demo.returncode == 0, text[-3000:]
    assert "Summary" in text and "Stopping..." in text and "Embedded stack stopped." in text
    assert "Traceback" not in text, text[-3000:]
    notices = [line for line in text.splitlines() if any(notice in line for notice in SPARK_NOTICES)]
    assert not notices, f"{len(notices)} notices of Spark or its Python workers, e.g. {notices[:3]}"
    # The jobs end between micro-batches: no aborted writes, no errors, no client left calling the broker.
    shutdown = text[text.index("Stopping...") :]
    for noise in ("ERROR", "Exception", "|FAIL|"):
        assert noise not in shutdown, shutdown[:3000]
    deadline = time.monotonic() + 30
    while (left := {pid for pid in started if alive(pid)}) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not left, f"processes the demo started are still running: {sorted(left)}"
    services = [p for p in Path("/proc").iterdir() if p.name.isdigit() and alive(int(p.name))]
    assert not [
        p.name
        for p in services
        if str(home) in (p / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    ], "an embedded service of the demo still runs"
