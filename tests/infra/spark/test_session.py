"""The Spark session's configuration from the settings (no JVM started)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from pydantic import ValidationError

from contracts.settings import Settings
from infra.spark.class_archive import remove_others
from infra.spark.session import ALLOCATOR_ENV, JIT_OPTIONS, class_archive, driver_java_options, session_config


def test_the_spark_ui_is_off_unless_a_port_is_set() -> None:
    config = session_config(Settings(spark_master="local[2]", spark_ui_port=None), app_name="fraud-pipeline")
    assert config["spark.ui.enabled"] == "false"
    assert "spark.ui.port" not in config
    assert (config["spark.master"], config["spark.app.name"]) == ("local[2]", "fraud-pipeline")


def test_a_spark_ui_port_turns_the_ui_on_at_that_port(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FRAUD_SPARK_UI_PORT", "4040")
    config = session_config(Settings())
    assert (config["spark.ui.enabled"], config["spark.ui.port"]) == ("true", "4040")
    assert config["spark.ui.showConsoleProgress"] == "false"
    with pytest.raises(ValidationError):
        Settings(spark_ui_port=0)


def test_a_driver_host_binds_the_driver_on_every_interface() -> None:
    config = session_config(Settings(spark_driver_host="pipeline"))
    assert (config["spark.driver.host"], config["spark.driver.bindAddress"]) == ("pipeline", "0.0.0.0")  # noqa: S104
    assert "spark.driver.host" not in session_config(Settings(spark_driver_host=None))


def test_executors_get_the_allocator_settings_unless_the_environment_sets_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ALLOCATOR_ENV:
        monkeypatch.delenv(name, raising=False)
    config = session_config(Settings())
    assert {name: config[f"spark.executorEnv.{name}"] for name in ALLOCATOR_ENV} == ALLOCATOR_ENV
    monkeypatch.setenv("ARROW_DEFAULT_MEMORY_POOL", "jemalloc")
    assert session_config(Settings())["spark.executorEnv.ARROW_DEFAULT_MEMORY_POOL"] == "jemalloc"


def test_the_driver_and_executor_memory_are_settings_in_sparks_notation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    config = session_config(Settings())
    assert (config["spark.driver.memory"], config["spark.executor.memory"]) == ("2g", "2g")
    monkeypatch.setenv("FRAUD_SPARK_DRIVER_MEMORY", "6144m")
    monkeypatch.setenv("FRAUD_SPARK_EXECUTOR_MEMORY", "3g")
    config = session_config(Settings())
    assert (config["spark.driver.memory"], config["spark.executor.memory"]) == ("6144m", "3g")
    for wrong in ("2 GB", "0g", "-1g", "lots"):
        with pytest.raises(ValidationError):
            Settings(spark_driver_memory=wrong)
        with pytest.raises(ValidationError):
            Settings(spark_executor_memory=wrong)


def test_the_wait_for_executors_is_a_setting_of_positive_seconds(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings().spark_executor_start_timeout_s == 120
    monkeypatch.setenv("FRAUD_SPARK_EXECUTOR_START_TIMEOUT_S", "900")
    assert Settings().spark_executor_start_timeout_s == 900
    for wrong in ("0", "-5", "forever"):
        monkeypatch.setenv("FRAUD_SPARK_EXECUTOR_START_TIMEOUT_S", wrong)
        with pytest.raises(ValidationError):
            Settings()


def test_the_driver_starts_from_the_class_archive_only_when_it_is_there(tmp_path: Path) -> None:
    archive = tmp_path / "spark-classes.jsa"
    assert driver_java_options(archive) == JIT_OPTIONS
    assert driver_java_options(None) == JIT_OPTIONS
    archive.write_bytes(b"classes")
    assert driver_java_options(archive).startswith(f"{JIT_OPTIONS} -XX:SharedArchiveFile={archive} ")
    building = driver_java_options(archive, tmp_path / "new.jsa")
    assert building.startswith(f"{JIT_OPTIONS} -XX:ArchiveClassesAtExit={tmp_path / 'new.jsa'} ")
    assert "SharedArchiveFile" not in building, "an archive is built from a JVM that loads its own classes"


def test_the_drivers_and_executors_jvms_compile_with_c1_only() -> None:
    assert JIT_OPTIONS == "-XX:TieredStopAtLevel=1"
    config = session_config(Settings(spark_master="spark://127.0.0.1:7077"))
    assert config["spark.executor.extraJavaOptions"] == JIT_OPTIONS


def test_the_class_archive_is_one_per_jdk_build_and_local_file_system_jar(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    java = tmp_path / "jdk" / "bin" / "java"
    java.parent.mkdir(parents=True)
    java.write_bytes(b"")
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "jdk"))
    cache = tmp_path / "cache"
    jar = tmp_path / "no-fork-local-fs-1.jar"
    archive = class_archive(jar, cache)
    assert archive is not None and archive.parent == cache and archive.suffix == ".jsa"
    assert class_archive(jar, cache) == archive
    assert class_archive(tmp_path / "no-fork-local-fs-2.jar", cache) != archive
    assert class_archive(None, cache) != archive
    os.utime(java, ns=(1, 1))  # another build of the JDK at the same place
    assert class_archive(jar, cache) != archive
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "nowhere"))
    assert class_archive(jar, cache) is None


def test_building_an_archive_removes_the_ones_made_for_another_jdk_or_classpath(tmp_path: Path) -> None:
    archive = class_archive(None, tmp_path)
    assert archive is not None
    others = [
        tmp_path / "spark-classes-0123456789abcdef.jsa",
        tmp_path / "spark-classes-fedcba9876543210.jsa",
    ]
    kept = [archive, tmp_path / f"{archive.name}.77.partial", tmp_path / "no-fork-local-fs-0a1b.jar"]
    for path in [*others, *kept]:
        path.write_bytes(b"classes")
    remove_others(archive)
    assert sorted(tmp_path.iterdir()) == sorted(kept)
