"""The demo's namespace: what it isolates, the commands it prints for its results; its live jobs started again."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from contracts.settings import Settings
from fraud.demo import isolated, restart_failed, result_commands
from fraud.progress import JobFailedError


def test_a_demo_has_every_topic_and_a_registry_of_its_own(tmp_path: Path) -> None:
    live = Settings(home=tmp_path, mlflow_tracking_uri="http://mlflow.example:5000")
    demo = isolated(live, "demo-abc123")
    assert all(topic.startswith("demo-abc123.") for topic in demo.topics.all())
    assert not set(demo.topics.all()) & set(live.topics.all())
    # `--namespace demo-abc123` of a command names the same alerts topic the demo writes.
    assert live.topics.in_namespace("demo-abc123").alerts == demo.topics.alerts
    assert demo.mlflow_tracking_uri == f"sqlite:///{tmp_path.resolve()}/demos/demo-abc123/mlflow/mlflow.db"


def test_the_printed_commands_name_the_demos_namespace_prefix_and_registry(tmp_path: Path) -> None:
    demo = isolated(Settings(home=tmp_path), "demo-abc123")
    commands = result_commands(demo, "demo-abc123", "ab" * 16, 42)
    assert commands[0] == "fraud alerts tail --namespace demo-abc123"
    assert commands[1] == "fraud alerts get 42 --prefix demo-abc123:"
    assert commands[2] == f"fraud card {'ab' * 16} --prefix demo-abc123:"
    assert commands[3] == f"FRAUD_MLFLOW_TRACKING_URI={demo.mlflow_tracking_uri} fraud models list"
    assert commands[4].startswith("fraud serve --prefix demo-abc123:")
    assert "alerts get" not in " ".join(result_commands(demo, "demo-abc123", "ab" * 16, None))


class StoppedQuery:
    """A query as ``restart_failed`` sees it: running, or stopped with an error or without one."""

    def __init__(self, error: str | None = None, active: bool = False) -> None:
        self.isActive, self.error = active, error

    def exception(self) -> str | None:
        return self.error


def test_a_live_job_that_failed_starts_again_in_its_place_until_no_restart_is_left() -> None:
    started: list[int] = []

    def start(index: int) -> Callable[[], Any]:
        def again() -> Any:
            started.append(index)
            return StoppedQuery(active=True)

        return again

    running, failed = StoppedQuery(active=True), StoppedQuery("Python worker failed to connect back.")
    queries: list[Any] = [running, failed]
    assert restart_failed(queries, [start(0), start(1)], restarts_left=1) == 0
    assert started == [1] and queries[0] is running and queries[1] is not failed and queries[1].isActive

    queries[0] = StoppedQuery("Python worker failed to connect back.")
    with pytest.raises(
        JobFailedError, match="the streaming query failed: Python worker failed to connect back"
    ):
        restart_failed(queries, [start(0), start(1)], restarts_left=0)
    assert started == [1]


def test_a_live_job_stopped_without_an_error_is_not_started_again() -> None:
    queries: list[Any] = [StoppedQuery(active=True), StoppedQuery()]
    assert restart_failed(queries, [lambda: pytest.fail("started"), lambda: pytest.fail("started")], 3) == 3
