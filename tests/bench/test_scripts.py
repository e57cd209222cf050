"""The benchmark scripts import: a module split elsewhere cannot leave ``make bench`` broken until it runs."""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

import pytest

from tests.bench.conftest import BENCH

SCRIPTS = sorted(path.stem for path in BENCH.glob("*.py"))


@pytest.mark.parametrize("name", SCRIPTS)
def test_the_script_imports(name: str, bench_script: Callable[[str], ModuleType]) -> None:
    module = bench_script(name)
    assert module.__file__ == str(BENCH / f"{name}.py")
