"""A real Spark standalone cluster on this machine, for the tests and benchmarks of the cluster path: a master
and a worker from the pyspark wheel's own launcher (``spark-class``), on the loopback address, each in a
process group of its own."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

import pyspark

from infra.embedded.stack import StackError, free_port
from infra.spark.session import JIT_OPTIONS

HOST = "127.0.0.1"
SPARK_HOME = str(Path(pyspark.__file__).parent)
SPARK_CLASS = str(Path(sys.executable).parent / "spark-class")
#: Spark's processes bind the loopback address only, and find their jars in the pyspark package.
SPARK_ENV = {"SPARK_LOCAL_IP": HOST, "SPARK_HOME": SPARK_HOME}
#: The master and the worker are JVMs of Spark's too, and compile with C1 only like a job's: they start in
#: 2.7 s instead of 4.4 and use half the CPU doing it (docker-compose.yml sets the same for its daemons).
DAEMON_ENV = {"SPARK_DAEMON_JAVA_OPTS": JIT_OPTIONS}
START_TIMEOUT_S = 90.0


@dataclass(frozen=True)
class Cluster:
    """A running standalone cluster: its master URL, the master's web UI (its JSON status), and the process
    of its worker (its executors are its children)."""

    master_url: str
    ui_url: str
    worker_pid: int | None = None

    def workers(self) -> list[dict[str, object]]:
        with urllib.request.urlopen(f"{self.ui_url}/json/", timeout=5) as response:  # noqa: S310 - loopback
            return list(json.loads(response.read())["workers"])


def spawn(args: Sequence[str], log: Path, env: Mapping[str, str] | None = None) -> subprocess.Popen[bytes]:
    """A process in a session of its own (killed with its children by :func:`stop`), output to ``log``."""
    with log.open("ab") as out:
        return subprocess.Popen(  # noqa: S603 - Spark's launcher from the installed wheel
            list(args),
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, **SPARK_ENV, **(env or {})},
            start_new_session=True,
        )


def stop(*processes: subprocess.Popen[bytes]) -> None:
    """SIGTERM each process group, SIGKILL what is left after 20 s."""
    for process in processes:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
    for process in processes:
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def wait_for_worker(cluster: Cluster, timeout_s: float = START_TIMEOUT_S) -> None:
    """Until the master lists an ALIVE worker."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if any(worker.get("state") == "ALIVE" for worker in cluster.workers()):
                return
        except OSError:
            pass  # the master's UI is not up yet
        time.sleep(0.5)
    raise StackError(f"no worker joined {cluster.master_url} within {timeout_s:.0f} s")


@contextmanager
def standalone_cluster(work: Path, cores: int = 2, memory: str = "2g") -> Iterator[Cluster]:
    """A master and one worker with ``cores`` cores for the block's duration."""
    work.mkdir(parents=True, exist_ok=True)
    port, ui_port, worker_ui = free_port(), free_port(), free_port()
    master = spawn(
        [
            SPARK_CLASS,
            "org.apache.spark.deploy.master.Master",
            "--host",
            HOST,
            "--port",
            str(port),
            "--webui-port",
            str(ui_port),
        ],
        work / "master.log",
        DAEMON_ENV,
    )
    cluster = Cluster(f"spark://{HOST}:{port}", f"http://{HOST}:{ui_port}")
    worker = spawn(
        [
            SPARK_CLASS,
            "org.apache.spark.deploy.worker.Worker",
            cluster.master_url,
            "--host",
            HOST,
            "--cores",
            str(cores),
            "--memory",
            memory,
            "--webui-port",
            str(worker_ui),
            "--work-dir",
            str(work / "worker"),
        ],
        work / "worker.log",
        DAEMON_ENV,
    )
    try:
        wait_for_worker(cluster)
        yield replace(cluster, worker_pid=worker.pid)
    finally:
        stop(worker, master)
