"""The installed console scripts, run by the tests as a user runs them."""

from __future__ import annotations

import os
import subprocess
import sys
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
