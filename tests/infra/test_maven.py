"""The jars the project fetches: read from the lock, checked against their SHA-256, refused otherwise (a
repository in a local directory stands in for Maven Central)."""

import hashlib
from pathlib import Path

import pytest

from contracts.errors import StateError
from infra import maven
from infra.maven import BROKER, ROOTS, SPARK_KAFKA, Jar, JarsUnavailableError, fetch, locked


def test_the_project_lock_pins_every_set_at_the_versions_it_names() -> None:
    for name in ROOTS:
        jars = locked(name)
        assert jars and all(len(jar.sha256) == 64 for jar in jars)
    coordinates = {jar.coordinates for jar in locked(SPARK_KAFKA)}
    assert f"org.apache.spark:spark-sql-kafka-0-10_2.13:{maven.SPARK_VERSION}" in coordinates
    assert f"org.apache.kafka:kafka_2.13:{maven.KAFKA_VERSION}" in {jar.coordinates for jar in locked(BROKER)}


def test_a_lock_of_other_versions_is_refused_naming_the_command(tmp_path: Path) -> None:
    lock = tmp_path / "maven.lock"
    lock.write_text(f"{BROKER}.root org.apache.kafka:kafka_2.13:0.0.1 -\n{BROKER} a.b:c:1 {'0' * 64}\n")
    with pytest.raises(StateError, match=r"python -m infra\.maven lock"):
        locked(BROKER, lock)


def test_a_jar_is_kept_only_when_its_checksum_matches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repository = tmp_path / "repository"
    content = b"PK\x03\x04 a jar"
    jar = Jar("org.example", "thing", "1.0", hashlib.sha256(content).hexdigest())
    (repository / jar.path).parent.mkdir(parents=True)
    (repository / jar.path).write_bytes(content)
    monkeypatch.setattr(maven, "JAR_CACHE", tmp_path / "cache")

    assert fetch(jar, repository.as_uri()).read_bytes() == content
    tampered = Jar(jar.group, jar.artifact, jar.version, "0" * 64)
    (tmp_path / "cache" / jar.path).unlink()
    with pytest.raises(JarsUnavailableError, match="does not match the SHA-256"):
        fetch(tampered, repository.as_uri())
    assert not (tmp_path / "cache" / jar.path).exists() and not list((tmp_path / "cache").rglob("tmp*"))
    with pytest.raises(
        JarsUnavailableError, match=r"cannot fetch org\.example:other:1\.0 from .*connect to Maven"
    ):
        fetch(Jar("org.example", "other", "1.0", "0" * 64), repository.as_uri())
