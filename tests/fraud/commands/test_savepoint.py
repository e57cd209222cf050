"""`fraud savepoint create | list | inspect | delete` as the command runs them (in this process): what they
print, and one line of error with its exit code for what cannot be done."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from contracts.settings import DEFAULT_PAGE_BYTES, DEFAULT_SLOTS
from features.entries import ENTRY_FORMAT
from fraud import cli
from fraud.console import console
from fraud.savepoints import SAVEPOINT_FILE
from tests.support.checkpoints import spark_checkpoint


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    for name in os.environ:
        if name.startswith("FRAUD_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("FRAUD_HOME", str(tmp_path / "home"))
    # Wide enough for a path in a table: the console may have been made before, at another width.
    monkeypatch.setattr(console, "width", 250)
    yield tmp_path / "home"


def fraud(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exit_:
        cli.run(list(args))
    out, err = capsys.readouterr()
    return int(exit_.value.code or 0), out, err


def test_create_list_inspect_delete(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spark_checkpoint(home / "checkpoints" / "replay" / "features", committed=2)
    code, out, _ = fraud(capsys, "savepoint", "create", "features", "--namespace", "replay")
    assert code == 0 and "Savepoint of the features job at micro-batch 2" in out
    (made,) = (home / "savepoints").iterdir()
    assert made.name.startswith("replay.features-") and (made / SAVEPOINT_FILE).is_file()
    code, out, _ = fraud(capsys, "savepoint", "list")
    assert code == 0 and str(made) in out and "replay" in out
    code, out, _ = fraud(capsys, "savepoint", "inspect", str(made))
    assert code == 0 and "2 (a job started from it in its layout runs 3 next)" in out
    assert "transactions/1: 300" in out
    assert (
        f"card_buckets 6; terminal_buckets 6; card_slots {DEFAULT_SLOTS}; terminal_slots {DEFAULT_SLOTS}; "
        f"page_bytes {DEFAULT_PAGE_BYTES}; entry_format {ENTRY_FORMAT}; shuffle partitions 2" in out
    )
    code, out, _ = fraud(capsys, "savepoint", "inspect", str(made), "--json")
    assert code == 0 and json.loads(out)["batch"] == 2
    code, out, _ = fraud(capsys, "savepoint", "delete", str(made), "--yes")
    assert code == 0 and not made.exists()
    code, out, _ = fraud(capsys, "savepoint", "list")
    assert code == 0 and "No savepoints under" in out


@pytest.mark.parametrize(
    ("args", "code", "error"),
    [
        (["create", "features", "--namespace", "nowhere"], 4, "no checkpoint of the features job at"),
        (["create", "scoring", "--checkpoint", "{empty}"], 5, "has no committed micro-batch yet"),
        (["create", "features", "--checkpoint", "{checkpoint}", "--to", "{checkpoint}"], 2, "not an empty"),
        (["create", "state"], 2, "'state' is not one of"),
        (["inspect", "{missing}"], 4, "no savepoint at"),
        (["inspect", "{checkpoint}"], 2, "is not a savepoint: it has no savepoint.json"),
        (["delete", "{checkpoint}", "--yes"], 2, "is not a savepoint"),
    ],
)
def test_what_cannot_be_done_is_one_line(
    home: Path, capsys: pytest.CaptureFixture[str], args: list[str], code: int, error: str
) -> None:
    places = {
        "checkpoint": spark_checkpoint(home / "checkpoints" / "features", committed=0),
        "empty": home / "checkpoints" / "empty",
        "missing": home / "missing",
    }
    (places["empty"] / "query" / "offsets").mkdir(parents=True)
    got, _, err = fraud(capsys, "savepoint", *(arg.format(**places) for arg in args))
    lines = [line for line in err.splitlines() if line.strip()]
    assert got == code and len(lines) == 1 and lines[0].startswith("error: "), err
    assert error in lines[0]
    assert places["checkpoint"].is_dir()
