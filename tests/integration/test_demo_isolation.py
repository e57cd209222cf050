"""`fraud demo` on services that already run (here a stack of the test's own, given as the user's own
services): it writes only into its own namespace and registry, and the commands it prints at the end show
its results as written."""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import pytest
import redis
from mlflow.tracking import MlflowClient

from infra.kafka.admin import existing_topics
from tests.support.cli_stack import cli_stack
from tests.support.scripts import FRAUD

pytestmark = pytest.mark.minutes(3)

DEMO_TIMEOUT_S = 1500


@pytest.mark.timeout(DEMO_TIMEOUT_S + 300)  # about 4 minutes on 2 idle cores, longer on a loaded one
def test_demo_writes_only_its_namespace_and_prints_commands_that_show_its_results(tmp_path: Path) -> None:
    with cli_stack(tmp_path) as (stack, clients, env):
        demo = subprocess.run(
            [FRAUD, "demo", "--customers", "200", "--terminals", "400"],
            env=env,
            capture_output=True,
            text=True,
            timeout=DEMO_TIMEOUT_S,
            check=False,
        )
        (tmp_path / "demo-output.txt").write_text(demo.stdout + demo.stderr)
        assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr[-3000:]
        namespace = re.search(r"runs in namespace (demo-[0-9a-f]{6})", demo.stdout)
        assert namespace, demo.stdout[:3000]
        ns = namespace.group(1)

        # Nothing live was written: no live topic, no Redis key outside the namespace, no live model.
        live = clients.settings.topics.all()
        assert existing_topics(clients.admin(), live) == []
        keys = [key.decode() for key in redis.Redis.from_url(stack.redis_url).scan_iter(count=1000)]
        assert keys and all(key.startswith(f"{ns}:") for key in keys), sorted(set(keys))[:10]
        assert MlflowClient(stack.mlflow_tracking_uri).search_registered_models() == []

        # The commands it prints, run as printed, show its alerts, one alert, one card and its model.
        commands = [
            line.strip().split("#")[0]
            for line in demo.stdout.splitlines()
            if line.startswith(("  fraud ", "  FRAUD_"))
        ]
        assert len(commands) == 5, demo.stdout[-2000:]
        running = {}
        for command in commands:  # side by side: they only read
            words = shlex.split(command)
            extra = dict(word.split("=", 1) for word in words if "=" in word and word.startswith("FRAUD_"))
            args = [word for word in words if not word.startswith("FRAUD_")]
            assert args[0] == "fraud"
            if args[1] == "serve":
                continue
            running[command] = (
                " ".join(args[1:3]),
                subprocess.Popen(
                    [FRAUD, *args[1:]],
                    env={**env, **extra},
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                ),
            )
        outputs = {}
        for command, (name, ran) in running.items():
            stdout, stderr = ran.communicate(timeout=300)
            assert ran.returncode == 0, f"{command}: {stderr[-2000:]}"
            outputs[name] = stdout
        alerts = re.search(rf"Alerts on {ns}\.alerts: ([\d,]+)", outputs["alerts tail"])
        assert alerts and int(alerts.group(1).replace(",", "")) > 0, outputs["alerts tail"][:2000]
        assert "Alert for transaction" in outputs["alerts get"]
        assert "Latest features" in next(text for ran, text in outputs.items() if ran.startswith("card "))
        assert "champion" in outputs["models list"]
