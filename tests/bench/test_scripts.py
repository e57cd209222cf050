"""The benchmark scripts import: a module split elsewhere cannot leave ``make bench`` broken until it runs."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
SCRIPTS = sorted(path.stem for path in BENCH.glob("*.py"))


@pytest.mark.parametrize("name", SCRIPTS)
def test_the_script_imports(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(BENCH))  # the scripts import their shared pieces (measure, report)
    module = importlib.import_module(name)
    assert module.__file__ == str(BENCH / f"{name}.py")
