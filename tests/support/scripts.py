"""The installed console scripts, run by the tests as a user runs them."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from contracts.settings import Settings

#: The ``fraud`` command installed next to this interpreter.
FRAUD = str(Path(sys.executable).parent / "fraud")


def run_fraud(
    settings: Settings,
    *args: str,
    token_key: str = "a-test-token-key",  # noqa: S107 - a test key
    **extra_env: str,
) -> subprocess.CompletedProcess[str]:
    """``fraud ARGS`` with the connections, home and topics of ``settings`` (and ``extra_env``) as its
    ``FRAUD_*`` variables, none inherited; its output captured."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FRAUD_")}
    env.update(
        FRAUD_TOKEN_KEY=token_key,
        FRAUD_HOME=str(settings.home),
        FRAUD_BOOTSTRAP_SERVERS=settings.bootstrap_servers or "",
        FRAUD_REDIS_URL=settings.redis_url or "",
        FRAUD_MLFLOW_TRACKING_URI=settings.mlflow_tracking_uri or "",
        FRAUD_PARTITIONS=str(settings.partitions),
        COLUMNS="200",
        **extra_env,
    )
    for name, topic in settings.topics.model_dump().items():
        env[f"FRAUD_TOPICS__{name.upper()}"] = topic
    return subprocess.run([FRAUD, *args], env=env, capture_output=True, text=True, timeout=300, check=False)


def fraud_in(env: Mapping[str, str], *args: str, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
    """``fraud ARGS`` with ``env`` as its whole environment (the terminal 200 columns wide), its output
    captured."""
    return subprocess.run(
        [FRAUD, *args],
        env={**env, "COLUMNS": "200"},
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


def stderr_lines(result: subprocess.CompletedProcess[str]) -> list[str]:
    """The lines a command wrote to stderr, blank ones left out."""
    return [line for line in result.stderr.splitlines() if line.strip()]
