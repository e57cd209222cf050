"""The preloading Spark daemon must stay single-threaded: it forks every Python worker."""

from __future__ import annotations

import os
import subprocess
import sys

from infra.spark.daemon import PRELOAD_ENV


def test_preloaded_daemon_is_single_threaded() -> None:
    code = (
        "import os, sys, infra.spark.daemon as d; d.preload(); "
        "assert all(m in sys.modules for m in (*d.PRELOAD, 'features.job')); "
        "print(len(os.listdir('/proc/self/task')))"
    )
    env = {**os.environ, PRELOAD_ENV: "features.job"}
    threads = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True, timeout=120, env=env
    ).stdout
    assert int(threads) == 1
