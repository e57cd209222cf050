"""`fraud serve` with an empty or blank FRAUD_API_TOKEN refuses to start, with one line and exit 2: such a
token would let a request without the header in (it is a wrong setting, not "no authentication")."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.support.scripts import fraud_in, stderr_lines


@pytest.mark.parametrize("token", ["", " ", "two words"])
def test_an_empty_or_blank_token_is_refused_at_start(tmp_path: Path, token: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("FRAUD_")}
    env |= {"FRAUD_HOME": str(tmp_path), "FRAUD_API_TOKEN": token}
    result = fraud_in(env, "serve", "--host", "0.0.0.0", "--port", "1")  # noqa: S104 - refused before it listens
    lines = stderr_lines(result)
    assert result.returncode == 2, result.stderr
    assert len(lines) == 1 and lines[0].startswith("error: invalid setting: FRAUD_API_TOKEN="), result.stderr
    assert "API token" in lines[0] and "Traceback" not in result.stdout + result.stderr
