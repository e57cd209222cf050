"""Jars from Maven Central, pinned by a lock: the embedded Apache Kafka broker and Spark's Kafka connector.

Each set of jars (:data:`ROOTS`) is resolved once, with Maven, by whoever changes a version: ``python -m
infra.maven lock`` writes ``infra/maven.lock``, a line per jar with its coordinates and SHA-256. The project
fetches the locked jars itself, over HTTPS with Python alone (``python -m infra.maven fetch``, which ``make
install`` runs; or on first use), checks each one's SHA-256, and keeps them with this environment
(:data:`JAR_CACHE`): a machine with Python and Java needs no Maven, and works offline afterwards.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from contracts.errors import ServiceUnavailableError, StateError

MAVEN_CENTRAL = "https://repo1.maven.org/maven2"
#: Apache Kafka's version: the embedded broker's jars, and the image of docker-compose.yml
#: (tests/integration/test_compose.py checks they agree).
KAFKA_VERSION = "4.3.2"
#: Spark's Kafka connector is built for exactly one Spark version: the installed pyspark's.
SPARK_VERSION = importlib.metadata.version("pyspark")
#: Kafka logs through SLF4J 1.7 and ships no backend: Log4j 2 takes its lines (SLF4J 2 binds to it).
_LOG4J = "org.apache.logging.log4j:{}:2.25.4"

BROKER, SPARK_KAFKA = "kafka-broker", "spark-kafka"
#: What each set is resolved from: its root artifacts, with their dependencies at run time.
ROOTS: dict[str, tuple[str, ...]] = {
    BROKER: (
        f"org.apache.kafka:kafka_2.13:{KAFKA_VERSION}",
        _LOG4J.format("log4j-core"),
        _LOG4J.format("log4j-slf4j2-impl"),
        "org.slf4j:slf4j-api:2.0.17",
    ),
    # Spark's own jars (pyspark/jars) provide the rest: a dependency it ships is left out of the set.
    SPARK_KAFKA: (f"org.apache.spark:spark-sql-kafka-0-10_2.13:{SPARK_VERSION}",),
}
LOCK_FILE = Path(__file__).with_name("maven.lock")
#: What the project builds or fetches for Java, kept with this environment (``sys.prefix``).
JVM_CACHE = Path(sys.prefix) / "var" / "fraud-jvm"
JAR_CACHE = JVM_CACHE / "maven"
FETCH_TIMEOUT_S = 60.0


class JarsUnavailableError(ServiceUnavailableError):
    """A locked jar is not here and cannot be fetched."""


@dataclass(frozen=True)
class Jar:
    """One locked jar: its Maven coordinates and SHA-256."""

    group: str
    artifact: str
    version: str
    sha256: str

    @property
    def coordinates(self) -> str:
        return f"{self.group}:{self.artifact}:{self.version}"

    @property
    def path(self) -> str:
        """Its path in a Maven repository (and in :data:`JAR_CACHE`)."""
        name = f"{self.artifact}-{self.version}.jar"
        return f"{self.group.replace('.', '/')}/{self.artifact}/{self.version}/{name}"


def locked(name: str, lock: Path = LOCK_FILE) -> list[Jar]:
    """The jars of set ``name`` in the lock file.

    Raises:
        StateError: the set is not in the lock, or was locked for other versions than :data:`ROOTS` names
            (run ``python -m infra.maven lock``).
    """
    jars, roots = [], set()
    for line in lock.read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        kind, coordinates, sha256 = line.split()
        if kind == f"{name}.root":
            roots.add(coordinates)
        elif kind == name:
            group, artifact, version = coordinates.split(":")
            jars.append(Jar(group, artifact, version, sha256))
    if not jars or roots != set(ROOTS[name]):
        raise StateError(
            f"{lock} does not lock the jars of {', '.join(ROOTS[name])}: run `python -m infra.maven lock`"
        )
    return jars


def jar_paths(name: str, progress: Callable[[str], None] | None = None) -> list[Path]:
    """The local paths of set ``name``'s jars, fetched first if any is missing (``progress`` hears of it).

    Raises:
        JarsUnavailableError: a jar is missing and Maven Central cannot be reached.
    """
    jars = locked(name)
    missing = [jar for jar in jars if not (JAR_CACHE / jar.path).is_file()]
    if missing:
        if progress is not None:
            progress(f"Fetching {len(missing)} jars of the {name} set from Maven Central...")
        for jar in missing:
            fetch(jar)
    return [JAR_CACHE / jar.path for jar in jars]


def fetch(jar: Jar, repository: str = MAVEN_CENTRAL) -> Path:
    """Download ``jar`` into :data:`JAR_CACHE`, checked against its SHA-256 before it takes its place."""
    target = JAR_CACHE / jar.path
    url = f"{repository}/{jar.path}"
    target.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    with tempfile.NamedTemporaryFile(dir=target.parent, delete=False) as part:
        try:
            with urllib.request.urlopen(url, timeout=FETCH_TIMEOUT_S) as response:  # noqa: S310 - https
                while chunk := response.read(1 << 20):
                    digest.update(chunk)
                    part.write(chunk)
        except (urllib.error.URLError, OSError) as exc:
            Path(part.name).unlink(missing_ok=True)
            reason = getattr(exc, "reason", exc)
            raise JarsUnavailableError(
                f"cannot fetch {jar.coordinates} from {repository} ({reason}): the embedded broker and "
                "Spark's Kafka connector need it once; connect to Maven Central and try again"
            ) from None
    if digest.hexdigest() != jar.sha256:
        Path(part.name).unlink(missing_ok=True)
        raise JarsUnavailableError(
            f"{url} does not match the SHA-256 that {LOCK_FILE.name} records for it: refused"
        )
    os.replace(part.name, target)
    return target


# --- the lock, written with Maven -------------------------------------------------------------------------


def resolve(roots: tuple[str, ...]) -> list[Path]:
    """The jars of ``roots`` and their run-time dependencies, resolved by Maven (into its local repository)."""
    mvn = shutil.which("mvn")
    if mvn is None:
        raise JarsUnavailableError("writing the lock needs Maven (`mvn`) on PATH")
    dependencies = "".join(
        "<dependency><groupId>{}</groupId><artifactId>{}</artifactId><version>{}</version></dependency>".format(
            *root.split(":")
        )
        for root in roots
    )
    pom = (
        '<project xmlns="http://maven.apache.org/POM/4.0.0"><modelVersion>4.0.0</modelVersion>'
        "<groupId>kappa-fraud</groupId><artifactId>lock</artifactId><version>0</version>"
        f"<dependencies>{dependencies}</dependencies></project>"
    )
    with tempfile.TemporaryDirectory() as work:
        (Path(work) / "pom.xml").write_text(pom)
        listing = Path(work) / "dependencies.txt"
        subprocess.run(  # noqa: S603 - mvn from PATH on a pom written here
            [
                mvn,
                "-q",
                "-B",
                "dependency:list",
                "-DincludeScope=runtime",
                "-DoutputAbsoluteArtifactFilename=true",
                f"-DoutputFile={listing}",
            ],
            cwd=work,
            check=True,
        )
        paths = [
            Path(line.strip().rsplit(":", 1)[-1])
            for line in listing.read_text().splitlines()
            if line.strip().endswith(".jar")
        ]
    return sorted(paths)


def _coordinates(path: Path) -> tuple[str, str, str]:
    """(group, artifact, version) of a jar in Maven's local repository layout."""
    version_dir = path.parent
    artifact_dir = version_dir.parent
    repository = next(p for p in path.parents if p.name == "repository")
    group = ".".join(artifact_dir.parent.relative_to(repository).parts)
    return group, artifact_dir.name, version_dir.name


def _shipped_by_spark() -> set[str]:
    """The artifacts (names without version) of the jars pyspark ships."""
    jars = Path(str(importlib.metadata.distribution("pyspark").locate_file("pyspark/jars")))
    return {path.name.rsplit("-", 1)[0] for path in jars.glob("*.jar")}


def write_lock(lock: Path = LOCK_FILE) -> None:
    """Resolve every set with Maven and write the lock: roots, then each jar's coordinates and SHA-256."""
    shipped = _shipped_by_spark()
    lines = ["# Written by `python -m infra.maven lock`: the jars the project fetches, with their SHA-256."]
    for name, roots in ROOTS.items():
        lines += [f"{name}.root {root} -" for root in roots]
        for path in resolve(roots):
            group, artifact, version = _coordinates(path)
            if name == SPARK_KAFKA and artifact in shipped:
                continue
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
            lines.append(f"{name} {group}:{artifact}:{version} {digest}")
    lock.write_text("\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["fetch", "lock"], help="fetch the locked jars, or write the lock")
    parser.add_argument("sets", nargs="*", help=f"the sets to fetch, of {', '.join(ROOTS)} (default: all)")
    args = parser.parse_args()
    if unknown := set(args.sets) - set(ROOTS):
        parser.error(f"no set {', '.join(sorted(unknown))}: the sets are {', '.join(ROOTS)}")
    if args.command == "lock":
        write_lock()
        print(f"wrote {LOCK_FILE}")
        return
    try:
        for name in args.sets or ROOTS:
            jar_paths(name, progress=print)
    except (JarsUnavailableError, StateError) as exc:
        sys.exit(f"error: {exc}")


if __name__ == "__main__":
    main()
