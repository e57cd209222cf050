"""The README's step-by-step paths, run line by line as written there (read from README.md, so the two
cannot drift apart): the A/B path (a durable stack, two months of history, two models registered, a
replay, the report), then on its stack the alert consumers' path (the live job, a consumer group, a tail).

The lines run in a fresh directory, as on a fresh clone: ``.venv`` there is this test run's own (the
``make install`` line is what made it, so it is not run again), ``examples`` the repository's, and ``FRAUD_HOME`` is the default
``.fraud`` of that directory. The durable embedded stack (`fraud up`) runs under it.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.minutes(5)

README = Path(__file__).resolve().parents[2] / "README.md"
#: The README says the A/B path takes about 10 minutes on 2 cores; a busy machine takes longer.
LINE_TIMEOUT_S = 1200


def readme_path(name: str) -> list[str]:
    """The command lines of the README's bash block marked ``<!-- path: NAME -->``."""
    found = re.search(rf"<!-- path: {name} -->\n```bash\n(.*?)```", README.read_text(), re.DOTALL)
    assert found, f"README.md has no path {name!r}"
    return [line for line in found.group(1).splitlines() if line.strip()]


@pytest.mark.timeout(3600)  # 12-14 minutes at a load average of 15-20 on 2 cores
def test_readme_ab_and_alerts_paths_work_as_written(tmp_path: Path) -> None:
    (tmp_path / ".venv").symlink_to(Path(sys.executable).parent.parent)
    (tmp_path / "examples").symlink_to(README.parent / "examples")  # a clone has them
    env = {k: v for k, v in os.environ.items() if not k.startswith("FRAUD_")}
    env.update(COLUMNS="200", SPARK_LOCAL_IP="127.0.0.1")
    ab, alerts = readme_path("ab"), readme_path("alerts")
    assert ab[0].startswith("make install"), ab[0]
    outputs: dict[str, str] = {}
    try:
        for line in ab[1:] + alerts:
            ran = subprocess.run(
                ["bash", "-c", line],
                cwd=tmp_path,
                env=env,
                capture_output=True,
                text=True,
                timeout=LINE_TIMEOUT_S,
                check=False,
            )
            with (tmp_path / "output.txt").open("a") as log:  # the whole session, for a failure's post-mortem
                log.write(f"$ {line}\n{ran.stdout}{ran.stderr}\n")
            assert ran.returncode == 0, f"{line}\n{ran.stdout[-3000:]}\n{ran.stderr[-3000:]}"
            assert "Traceback" not in ran.stderr, ran.stderr[-3000:]
            outputs[" ".join(shlex.split(line, comments=True)[1:3])] = ran.stdout
    finally:
        subprocess.run([".venv/bin/fraud", "down"], cwd=tmp_path, env=env, capture_output=True, check=False)
    first, second = outputs["train"], outputs["train --model"]
    assert "Registered fraud-detector version 1 with alias champion" in first, first[-2000:]
    assert "Registered fraud-detector version 2" in second, second[-2000:]
    assert "challenger" in outputs["models promote"]
    assert re.search(r"average_precision +│ 0\.\d+ │ 0\.\d+", outputs["ab run"]), outputs["ab run"][-3000:]
    assert (tmp_path / "ab-report.html").stat().st_size > 10_000
    handled = [
        line
        for line in outputs["examples/alert_consumer.py --group"].splitlines()
        if line.startswith("alert ")
    ]
    assert len(handled) == 5, outputs["examples/alert_consumer.py --group"][-2000:]
    tailed = re.search(r"Alerts on alerts: ([\d,]+)", outputs["alerts tail"])
    assert tailed and int(tailed.group(1).replace(",", "")) >= 5, outputs["alerts tail"][-2000:]
