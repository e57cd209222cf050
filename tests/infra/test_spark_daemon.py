"""The preloading Spark daemon must stay single-threaded: it forks every Python worker."""

from __future__ import annotations

import subprocess
import sys


def test_preloaded_daemon_is_single_threaded() -> None:
    code = (
        "import os, sys, infra.spark_daemon as d; d.preload(); "
        "assert all(m in sys.modules for m in d.PRELOAD); "
        "print(len(os.listdir('/proc/self/task')))"
    )
    threads = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True, timeout=120
    ).stdout
    assert int(threads) == 1
