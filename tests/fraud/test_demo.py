"""The demo's namespace: what it isolates, and the commands it prints for its results."""

from __future__ import annotations

from pathlib import Path

from contracts.settings import Settings
from fraud.demo import isolated, result_commands


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
