"""Wrong usage and unreachable services end the `fraud` command with one line of error and a non-zero exit,
never a traceback: each case runs the installed console script in a process of its own."""

from __future__ import annotations

import importlib
import os
import pkgutil
import re
import socket
import subprocess
import tomllib
from importlib.metadata import version
from pathlib import Path

import pytest

from contracts.errors import FraudError
from fraud import cli
from tests.support.scripts import FRAUD, fraud_in, stderr_lines


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def unreachable_services() -> dict[str, str]:
    return {
        "FRAUD_BOOTSTRAP_SERVERS": f"127.0.0.1:{closed_port()}",
        "FRAUD_REDIS_URL": f"redis://:secret-pw@127.0.0.1:{closed_port()}/0",
        "FRAUD_MLFLOW_TRACKING_URI": f"http://127.0.0.1:{closed_port()}",
    }


CASES = {
    "invalid number": ({"FRAUD_PARTITIONS": "0"}, ["topics", "list"], 2, "FRAUD_PARTITIONS='0'"),
    "not a number": ({"FRAUD_PARTITIONS": "four"}, ["topics", "list"], 2, "FRAUD_PARTITIONS='four'"),
    "mistyped setting": (
        {"FRAUD_PARTITONS": "4"},
        ["topics", "list"],
        2,
        "unknown setting FRAUD_PARTITONS (did you mean FRAUD_PARTITIONS?)",
    ),
    "a Redis URL that is not one": (
        {"FRAUD_REDIS_URL": "http://user:secret-pw@redis:6379/0"},
        ["alerts", "get", "5"],
        2,
        "FRAUD_REDIS_URL='http://user:***@redis:6379/0': give redis://",
    ),
    "brackets in a setting's message": (
        {"FRAUD_SPARK_DRIVER_MEMORY": "lots"},
        ["topics", "list"],
        2,
        "should match pattern '^[1-9][0-9]*([kKmMgGtT][bB]?)?$'",
    ),
    "brackets in a file name": ({}, ["ingest", "[red]x[/red].csv"], 2, "'[red]x[/red].csv' does not exist"),
    "simulating into a missing directory": (
        {},
        ["simulate", "--days", "1", "--out", "no-such-dir/sim.parquet"],
        2,
        "no-such-dir is not a directory",
    ),
    "a gate on a volume": (
        {},
        ["ab", "run", "--from", "2018-05-01", "--to", "2018-05-08", "--promote-if-better", "alerts_per_day"],
        2,
        "--promote-if-better: one of roc_auc, average_precision",
    ),
    "unknown choice": ({"FRAUD_SECURITY_PROTOCOL": "TLS"}, ["status"], 2, "FRAUD_SECURITY_PROTOCOL"),
    "port out of range": ({}, ["serve", "--port", "99999"], 2, "--port"),
    "public address without a token": ({}, ["serve", "--host", "0.0.0.0"], 2, "set FRAUD_API_TOKEN"),  # noqa: S104
    "unknown command": ({}, ["nosuch"], 2, "nosuch"),
    "no stack, nothing set": ({}, ["topics", "list"], 3, "fraud up"),
    "unreachable Kafka": (unreachable_services(), ["topics", "list"], 3, "Kafka did not answer"),
    "unreachable Redis": (unreachable_services(), ["alerts", "get", "5"], 3, "Redis"),
    "unreachable MLflow": (unreachable_services(), ["models", "list"], 3, "MLflow at http://127.0.0.1"),
    "windows out of order": ({}, ["features", "list", "--windows", "7,1"], 2, "strictly increasing"),
    "windows not in days": ({}, ["features", "list", "--windows", "1d,7d"], 2, "give whole days"),
    "no checkpoint to read the state of": ({}, ["state", "card", "ab" * 16], 4, "no checkpoint at"),
    "a checkpoint and a savepoint": (
        {},
        ["state", "terminal", "7", "--checkpoint", "a", "--savepoint", "b"],
        2,
        "--checkpoint or --savepoint, not both",
    ),
}


@pytest.mark.parametrize("case", CASES)
def test_one_line_of_error_and_an_exit_code(case: str, tmp_path: Path) -> None:
    extra, args, code, expected = CASES[case]
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("FRAUD_")}
    env |= {"FRAUD_HOME": str(tmp_path), **extra}
    result = fraud_in(env, *args, timeout_s=60)
    lines = stderr_lines(result)
    assert result.returncode == code, result.stderr
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    assert expected in lines[0]
    assert "Traceback" not in result.stdout + result.stderr
    assert "secret-pw" not in result.stdout + result.stderr


def test_serve_on_a_port_in_use_says_so_before_serving(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("FRAUD_")}
    env |= {"FRAUD_HOME": str(tmp_path), "COLUMNS": "200"}
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            [FRAUD, "serve", "--port", str(port)],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""  # no page address of a server that never listened
    assert result.stderr.strip().startswith(
        f"error: cannot listen on 127.0.0.1:{port}: Address already in use"
    )


def test_version() -> None:
    result = subprocess.run([FRAUD, "--version"], capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"fraud (kappa-fraud) {version('kappa-fraud')}"


def documented_exit_codes() -> set[int]:
    """The codes of the README's exit-code table."""
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    table = readme.partition("| exit code | meaning |")[2].partition("\n\n")[0]
    return {int(code) for code in re.findall(r"^\| (\d+) \|", table, re.MULTILINE)}


def test_every_exit_code_is_in_the_readmes_table() -> None:
    """Each error kind the project raises (every FraudError subclass of every module), and the codes the
    entry point sets itself, has a row in the README's table."""
    pyproject = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    for package in pyproject["tool"]["importlinter"]["root_packages"]:  # every package of the project
        for module in pkgutil.walk_packages(importlib.import_module(package).__path__, f"{package}."):
            importlib.import_module(module.name)
    kinds, pending = set(), [FraudError]
    while pending:
        kind = pending.pop()
        kinds.add(kind)
        pending.extend(kind.__subclasses__())
    codes = {kind.exit_code: kind for kind in kinds} | {
        cli.USAGE_EXIT: "usage",
        130: "interrupted",
        0: "done",
    }
    documented = documented_exit_codes()
    assert documented >= {0, 1, 2, 3, 4, 5}
    undocumented = {code: kind for code, kind in codes.items() if code not in documented}
    assert not undocumented, f"exit codes missing from the README's table: {undocumented}"
