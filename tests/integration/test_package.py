"""The wheel holds everything the jobs read at run time: built from the checkout, installed into a fresh
virtualenv outside the source tree, it runs `fraud --help` and a short Spark feature job from there."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

pytestmark = pytest.mark.minutes(2.5)

ROOT = Path(__file__).resolve().parents[2]


def run(
    argv: list[str], cwd: Path, env: dict[str, str] | None = None, timeout: float = 600, expect: int = 0
) -> str:
    result = subprocess.run(
        argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert result.returncode == expect, f"{' '.join(argv)}:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result.stdout


def test_the_installed_wheel_runs_a_feature_job_outside_the_source_tree(tmp_path: Path) -> None:
    dist, venv, work = tmp_path / "dist", tmp_path / "venv", tmp_path / "work"
    work.mkdir()
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(dist), str(ROOT)], tmp_path)
    (wheel,) = dist.glob("kappa_fraud-*.whl")
    run([sys.executable, "-m", "venv", str(venv)], tmp_path)
    python = venv / "bin" / "python"
    run([str(python), "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", str(wheel)], tmp_path)
    # The dependencies come from this environment's site-packages (read-only, after the venv's own):
    # the project itself comes from the wheel only (this environment's editable install is not seen).
    site = Path(
        run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], work).strip()
    )
    (site / "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")

    located = run(
        [
            str(python),
            "-c",
            "import features, fraud, infra, scoring; print(features.__file__, fraud.__file__)",
        ],
        work,
    )
    assert all(path.startswith(str(site)) for path in located.split()), located

    env = {k: v for k, v in os.environ.items() if not k.startswith("FRAUD_")}
    env |= {"FRAUD_HOME": str(work / "home"), "COLUMNS": "160"}
    fraud = str(venv / "bin" / "fraud")
    assert "Real-time card-fraud detection" in run([fraud, "--help"], work, env)
    run([fraud, "up"], work, env)
    try:
        run(
            [fraud, "simulate", "--days", "3", "--customers", "30", "--terminals", "60", "--produce"],
            work,
            env,
        )
        bad_events = Path(run([str(python), "-c", BAD_EVENTS], work).strip())
        run(
            [fraud, "ingest", str(bad_events)], work, env, expect=6
        )  # its good events in, the bad dead letters
        run([fraud, "features", "run", "--once"], work, env)
        counts = run([fraud, "topics", "list"], work, env)
    finally:
        run([fraud, "down"], work, env)
    rows = {
        line.split("│")[1].strip(): line.split("│")[2].strip()
        for line in counts.splitlines()
        if line.count("│") == 3
    }
    assert rows["features"] == rows["transactions"] != "0", counts
    assert rows["dead-letter"] == "11", counts  # the packaged example's broken events


#: The path of the demo's example of broken events, as the installed package finds it.
BAD_EVENTS = "from fraud.demo import BAD_EVENTS_FILE; print(BAD_EVENTS_FILE)"
