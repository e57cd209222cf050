"""The benchmark scripts as modules: imported with bench/ on the path, as they import their shared pieces
(measure, report, project_jobs)."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture
def bench_script(monkeypatch: pytest.MonkeyPatch) -> Callable[[str], ModuleType]:
    """Import a bench script by its name."""
    monkeypatch.syspath_prepend(str(BENCH))
    return importlib.import_module
