"""Measuring stream processors from outside, alike for every system: a pacing producer, an output reader,
a sampler of a process tree's memory and CPU, latency summaries, and the start and stop of the system's
process.

One clock for all: ``time.monotonic()`` in the bench process, read when a transaction is handed to the
producer and when its output record comes out of the reader's ``consume`` call.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson
from confluent_kafka import OFFSET_BEGINNING, KafkaException, Producer, TopicPartition

from infra.clients import Clients
from infra.kafka.log import partitions_of

PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def pace(
    producer: Producer,
    topic: str | Sequence[str],
    keys: Sequence[bytes],
    values: Sequence[bytes],
    timestamps: Sequence[int],
    rate: float,
) -> np.ndarray:
    """Produce the records at ``rate`` records/s from now on (record i is due i / rate s after the start;
    records that fell due together go out together) to ``topic``, or each to its own topic (a sequence of
    them); returns when each was handed to the producer (monotonic seconds). Flushes at the end."""
    topics = [topic] * len(values) if isinstance(topic, str) else topic
    sent = np.empty(len(values))
    started = time.monotonic()
    i = 0
    while i < len(values):
        due = min(len(values), int((time.monotonic() - started) * rate) + 1)
        while i < due:
            try:
                producer.produce(topics[i], values[i], keys[i], timestamp=timestamps[i])
            except BufferError:
                producer.poll(0.01)
                continue
            sent[i] = time.monotonic()
            i += 1
        producer.poll(0)
        wait = started + i / rate - time.monotonic()
        if wait > 0:
            time.sleep(wait)
    producer.flush(60)
    return sent


class OutputReader:
    """Reads an output topic from its beginning, in a thread, until stopped: when each transaction's output
    first became readable, the features of the transactions to check, and how many outputs repeated one
    or were marked late.

    Outputs are JSON objects with ``tx_id`` and ``features`` (the project's feature records and the peers'
    outputs alike), read_committed.
    """

    def __init__(self, clients: Clients, topic: str, checked: set[int]) -> None:
        self.topic = topic
        self.checked = checked
        self.first_seen: dict[int, float] = {}
        self.features: dict[int, dict[str, Any]] = {}
        #: Transactions to check whose output says they arrived late (the project's feature records do).
        self.late: set[int] = set()
        self.late_count = 0
        self.duplicates = 0
        self.error: BaseException | None = None
        self._consumer = clients.consumer(group_id="bench-reader", overrides={"fetch.wait.max.ms": 10})
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"reader-{topic}", daemon=True)

    def start(self) -> OutputReader:
        partitions = partitions_of(self._consumer, self.topic)
        self._consumer.assign([TopicPartition(self.topic, p, OFFSET_BEGINNING) for p in partitions])
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self._consumer.close()

    @property
    def count(self) -> int:
        return len(self.first_seen)

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                messages = self._consumer.consume(10_000, timeout=0.05)
                now = time.monotonic()
                for message in messages:
                    if message.error() is not None:
                        raise KafkaException(message.error())
                    record = orjson.loads(message.value() or b"")
                    tx = record["tx_id"]
                    if tx in self.first_seen:
                        self.duplicates += 1
                        continue
                    self.first_seen[tx] = now
                    late = record.get("late", False)
                    self.late_count += late
                    if tx in self.checked:
                        self.features[tx] = record["features"]
                        if late:
                            self.late.add(tx)
        except BaseException as exc:  # reported by the bench, which stops waiting
            self.error = exc


def tree_pids(root: int) -> list[int]:
    """``root`` and its descendants, from /proc."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            with contextlib.suppress(OSError):
                ppid = int(Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()[1])
                children.setdefault(ppid, []).append(int(name))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo += children.get(pid, [])
    return found


def process_memory_bytes(pid: int) -> int:
    """The memory of process ``pid``: its proportional set size (PSS: resident pages, each shared page
    divided among the processes that map it), so that a tree's sum counts once what forked processes share
    (Spark's Python workers share their daemon's imports). Its RSS where the kernel gives no PSS."""
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    return resident_bytes(pid)


def cpu_seconds(pid: int) -> float:
    """The CPU time (user + system) process ``pid`` has used, in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def resident_bytes(pid: int) -> int:
    """The resident set size (RSS) of process ``pid``: its pages in memory, shared ones whole."""
    return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE_BYTES


class TreeSampler:
    """Samples the memory (PSS, :func:`process_memory_bytes`) and CPU time of a process and its
    descendants, in a thread."""

    def __init__(self, root: int, interval_s: float = 0.25) -> None:
        self.root = root
        self.interval_s = interval_s
        self.peak_memory_bytes = 0
        #: Each sample's time (monotonic seconds) and the tree's memory then.
        self.memory_samples: list[tuple[float, int]] = []
        self._cpu_s: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"sampler-{root}", daemon=True)

    def start(self) -> TreeSampler:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def cpu_s(self) -> float:
        """CPU seconds (user + system) the tree used so far, as last sampled."""
        return sum(self._cpu_s.values())

    def sample(self) -> None:
        memory = 0
        for pid in tree_pids(self.root):
            with contextlib.suppress(OSError, IndexError, ValueError):
                memory += process_memory_bytes(pid)
                self._cpu_s[pid] = cpu_seconds(pid)
        self.peak_memory_bytes = max(self.peak_memory_bytes, memory)
        self.memory_samples.append((time.monotonic(), memory))

    def memory_between(self, start_s: float, end_s: float) -> tuple[float, int]:
        """The tree's mean and peak memory over the samples taken from ``start_s`` to ``end_s`` (monotonic
        seconds); zeros when none was."""
        taken = [memory for at, memory in list(self.memory_samples) if start_s <= at <= end_s]
        return (sum(taken) / len(taken), max(taken)) if taken else (0.0, 0)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()


def wait_for(
    condition: Callable[[], bool], timeout_s: float, what: str, process: subprocess.Popen[bytes], name: str
) -> None:
    """Wait until ``condition()`` holds; exit the bench when ``process`` (the system, called ``name``) exits
    first or ``timeout_s`` passes."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if process.poll() is not None:
            raise SystemExit(f"{name} exited ({process.returncode}) while waiting for {what}")
        if time.monotonic() > deadline:
            raise SystemExit(f"no {what} after {timeout_s:.0f} s")
        time.sleep(0.05)


def stop_tree(process: subprocess.Popen[bytes]) -> None:
    """Terminate the system's process, then kill what is left of the process group it runs in (it was
    started in a session of its own). Only the process gets SIGTERM: the project's stops its Spark query and
    session, which the same signal to its JVM would kill first."""
    with contextlib.suppress(ProcessLookupError):
        process.terminate()
    try:
        process.wait(20)
    except subprocess.TimeoutExpired:
        print(f"  pid {process.pid} still running 20 s after SIGTERM: killed")
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def steady_rate(arrivals: np.ndarray, settle_s: float = 1.0) -> tuple[float, int]:
    """Outputs/s after the first ``settle_s`` of output: from the last output in that first stretch to the
    last output, over the outputs that came after it (a system that writes in micro-batches writes its
    first one at once: it is left out whole). Returns the rate and the outputs it counts."""
    times = np.sort(arrivals)
    if len(times) < 2:
        return 0.0, 0
    first = int(np.searchsorted(times, times[0] + settle_s, side="right")) - 1
    counted = len(times) - 1 - first
    seconds = times[-1] - times[first]
    return (counted / seconds if seconds > 0 else 0.0), counted


#: A paced load is sustained while latency grows by at most this many seconds per second of the load: a
#: system that handles a share c of the pace falls behind by (1 - c) s each second, so 0.1 means c >= 90 %.
MAX_GROWTH = 0.1


@dataclass(frozen=True)
class Latency:
    """Produce -> output-readable latencies of one paced load, in seconds."""

    p50: float
    p95: float
    p99: float
    max: float
    #: Least-squares slope of latency against sending time: seconds of latency gained per second of load
    #: (a system that keeps the pace has none, whatever the shape of its micro-batches).
    growth: float

    @classmethod
    def of(cls, sent: np.ndarray, latencies: np.ndarray) -> Latency:
        """Latencies of transactions sent at ``sent`` (monotonic seconds)."""
        p50, p95, p99 = np.percentile(latencies, [50, 95, 99])
        growth = float(np.polyfit(sent - sent[0], latencies, 1)[0]) if len(sent) > 1 else 0.0
        return cls(float(p50), float(p95), float(p99), float(latencies.max()), growth)

    @property
    def kept_up(self) -> bool:
        """No growing backlog: latency grew by at most ``MAX_GROWTH`` s per second of the load."""
        return self.growth <= MAX_GROWTH

    def cell(self) -> str:
        return f"{self.p50 * 1000:,.0f} / {self.p95 * 1000:,.0f} / {self.p99 * 1000:,.0f} ms"
