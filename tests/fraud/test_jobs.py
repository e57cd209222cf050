"""The jobs' wiring that needs no Spark: importing the model-loading modules ahead of the job's start."""

from __future__ import annotations

import sys
import threading

import pytest

from fraud.jobs import import_ahead


def test_import_ahead_imports_in_a_thread_of_its_own() -> None:
    sys.modules.pop("colorsys", None)
    thread = import_ahead(("colorsys",))
    assert thread.name == "import-ahead" and thread is not threading.current_thread()
    thread.join(timeout=30)
    assert not thread.is_alive()
    assert "colorsys" in sys.modules


def test_a_module_that_fails_to_import_is_left_to_the_job(monkeypatch: pytest.MonkeyPatch) -> None:
    """No traceback from the thread: the job's own import of the module reports the error."""
    failures: list[threading.ExceptHookArgs] = []
    monkeypatch.setattr(threading, "excepthook", failures.append)
    sys.modules.pop("colorsys", None)
    thread = import_ahead(("no_such_module_of_the_project", "colorsys"))
    thread.join(timeout=30)
    assert failures == []
    assert "colorsys" in sys.modules  # the modules after it are still imported
