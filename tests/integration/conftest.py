"""Fixtures of the integration tier: one real Spark session (local mode) for the whole test session, and
Debian's headless Chromium for the pages.

Starting Spark's JVM costs seconds, so every integration test shares this session; tests isolate
themselves with their own topics (``settings``), checkpoints and query names.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.remote.webdriver import WebDriver

from contracts.settings import Settings
from fraud.jobs import SCORING_PRELOAD
from infra.spark.session import spark_session


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkSession]:
    """Spark in local[2] mode: 2 shuffle partitions, Python workers on this interpreter, no UI, RocksDB state."""
    settings = Settings(spark_master="local[2]", home=tmp_path_factory.mktemp("spark-home"))
    session = spark_session(
        settings, app_name="fraud-integration-tests", shuffle_partitions=2, preload=SCORING_PRELOAD
    )
    try:
        yield session
    finally:
        session.stop()


ENSURE_CHROMIUM = Path(__file__).parents[2] / "infra" / "ensure-chromium.sh"


@pytest.fixture(scope="session")
def chromium() -> tuple[str, str]:
    """Paths of Debian's chromium and chromedriver, installed by infra/ensure-chromium.sh if missing."""
    result = subprocess.run(["bash", str(ENSURE_CHROMIUM)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, f"cannot provide chromium for the browser test:\n{result.stderr}"
    browser, driver = shutil.which("chromium"), shutil.which("chromedriver")
    assert browser and driver, "ensure-chromium.sh succeeded but chromium/chromedriver are not on PATH"
    return browser, driver


@pytest.fixture
def browser(chromium: tuple[str, str]) -> Iterator[WebDriver]:
    binary, driver_path = chromium
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        options.add_argument(argument)
    # An explicit chromedriver: Selenium Manager never runs, nothing is downloaded.
    driver = webdriver.Chrome(service=Service(executable_path=driver_path), options=options)
    try:
        yield driver
    finally:
        driver.quit()
