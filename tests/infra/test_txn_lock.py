"""The per-topic transaction locks (no broker): which topics rows go to, and that a lock excludes processes."""

from __future__ import annotations

import multiprocessing
import time
from multiprocessing.synchronize import Event
from pathlib import Path

import pyarrow as pa
import pytest

from infra import txn_lock
from infra.txn_lock import topic_locks, topics_of

BOOTSTRAP = "127.0.0.1:9092"


def test_topics_of_rows_with_and_without_a_topic_column() -> None:
    routed = pa.record_batch({"topic": pa.array(["alerts", None, "scores", "alerts"]), "value": [b"a"] * 4})
    plain = pa.record_batch({"value": [b"v"]})
    assert topics_of([routed], "dead-letter") == {"alerts", "scores", "dead-letter"}
    assert topics_of([routed], None) == {"alerts", "scores"}
    assert topics_of([plain], "features") == {"features"}
    assert topics_of([], "features") == set()


def _hold(topic: str, seconds: float, ready: Event) -> None:
    with topic_locks(BOOTSTRAP, [topic]):
        ready.set()
        time.sleep(seconds)


def test_a_topic_lock_waits_for_the_other_process_and_other_topics_do_not() -> None:
    context = multiprocessing.get_context("spawn")
    ready = context.Event()
    holder = context.Process(target=_hold, args=("locked-topic", 1.5, ready))
    holder.start()
    try:
        assert ready.wait(30), "the holding process did not take its lock"
        started = time.monotonic()
        with topic_locks(BOOTSTRAP, ["other-topic"]):
            assert time.monotonic() - started < 0.5
        with topic_locks(BOOTSTRAP, ["other-topic", "locked-topic"]):
            waited = time.monotonic() - started
        assert waited > 0.8, f"took the lock held by another process after {waited:.2f} s"
    finally:
        holder.join(30)
    assert holder.exitcode == 0


def test_locks_of_another_cluster_are_separate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(txn_lock, "LOCK_DIR", tmp_path)
    with topic_locks(BOOTSTRAP, ["t"]), topic_locks("10.0.0.1:9092", ["t"]):
        assert len(list(tmp_path.glob("*-t.lock"))) == 2
