"""One label delay per command: every command that stamps labels or computes features takes it from
``FRAUD_LABEL_DELAY_DAYS``, and ``--label-delay-days`` overrides it the same way in each. The commands' heavy
calls are replaced by ones that record what they were given and stop the command."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from contracts.events import DAY_MS
from fraud.cli import app


class Given(Exception):
    """Raised by a replaced call with the label delay it was given (ms)."""

    def __init__(self, delay_ms: int) -> None:
        super().__init__(delay_ms)
        self.delay_ms = delay_ms


def _params_of_build(_ctx: Any, _job: Any, build: Any, _run: Any) -> None:
    raise Given(build.keywords["params"].label_delay_ms)


def _params_at(index: int) -> Callable[..., None]:
    def replaced(*args: Any, **_kwargs: Any) -> None:
        raise Given(args[index].label_delay_ms)

    return replaced


def _delay_at(index: int) -> Callable[..., None]:
    def replaced(*args: Any, **_kwargs: Any) -> None:
        raise Given(args[index])

    return replaced


def _settings_of_ab(settings: Any, _request: Any) -> None:
    raise Given(settings.label_delay_ms)


#: Each command, its arguments, and the call replaced (module, name, replacement).
COMMANDS = {
    "features run": (["features", "run", "--once"], "fraud.commands.features", "run_streaming_job", _params_of_build),
    "pipeline run": (["pipeline", "run", "--once"], "fraud.commands.score", "run_streaming_job", _params_of_build),
    "features batch": (["features", "batch", "{file}", "--out", "{out}"], "fraud.commands.features", "file_features", _params_at(2)),
    "train": (["train"], "fraud.training", "topics_training_set", _params_at(1)),
    "ingest": (["ingest", "{file}"], "fraud.commands.ingest", "events_from_file", _delay_at(3)),
    "ab run": (["ab", "run", "--from", "2018-05-04", "--to", "2018-05-11"], "fraud.ab", "run_ab", _settings_of_ab),
}  # fmt: skip


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    for name in [n for n in os.environ if n.upper().startswith("FRAUD_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("FRAUD_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("FRAUD_LABEL_DELAY_DAYS", "3")
    monkeypatch.setenv("FRAUD_MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    monkeypatch.setenv("COLUMNS", "200")
    (tmp_path / "tx.csv").write_text("tx_id,card_id,terminal_id,amount,event_time\n")
    yield tmp_path


def delay_given(name: str, folder: Path, monkeypatch: pytest.MonkeyPatch, *more: str) -> float:
    """The label delay (days) the command's heavy call got."""
    args, module, attribute, replacement = COMMANDS[name]
    monkeypatch.setattr(f"{module}.{attribute}", replacement)
    filled = [a.format(file=folder / "tx.csv", out=folder / "out.parquet") for a in args]
    result = CliRunner().invoke(app, [*filled, *more])
    assert isinstance(result.exception, Given), f"{name}: {result.output}\n{result.exception!r}"
    return result.exception.delay_ms / DAY_MS


@pytest.mark.parametrize("name", COMMANDS)
def test_every_command_takes_the_label_delay_from_the_setting(
    name: str, env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert delay_given(name, env, monkeypatch) == 3


@pytest.mark.parametrize("name", COMMANDS)
def test_the_option_overrides_the_setting_in_every_command(
    name: str, env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert delay_given(name, env, monkeypatch, "--label-delay-days", "1.5") == 1.5


def test_a_label_delay_the_setting_refuses_is_refused_by_the_option(env: Path) -> None:
    result = CliRunner().invoke(app, ["features", "list", "--label-delay-days", "8"])
    assert result.exit_code == 2
    assert "the label delay is more than 0 and at most 7 days" in result.output
