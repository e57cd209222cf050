"""`fraud alerts tail|get` and `fraud card` against the session's embedded broker and Valkey server."""

from __future__ import annotations

import os
import queue
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx2 as httpx
import pytest
import redis
from typer.testing import CliRunner

from contracts.records import AlertRecord
from contracts.redis_keys import card_features_key
from contracts.settings import Settings
from fraud.cli import app
from fraud.console import console, err_console
from fraud.options import parse_time
from infra.clients import Clients
from infra.embedded.stack import free_port
from infra.redis.store import set_latest, write_alerts, write_scores
from tests.support.factories import CARD_A, CARD_B, T0_MS, make_alert, make_score
from tests.support.scripts import FRAUD

RETENTION_S = 7 * 86_400


def env_of(settings: Settings) -> dict[str, str]:
    env = {
        "FRAUD_HOME": str(settings.home),
        "FRAUD_BOOTSTRAP_SERVERS": settings.bootstrap_servers or "",
        "FRAUD_REDIS_URL": settings.redis_url or "",
        "FRAUD_MLFLOW_TRACKING_URI": settings.mlflow_tracking_uri or "",
    }
    for name, topic in settings.topics.model_dump().items():
        env[f"FRAUD_TOPICS__{name.upper()}"] = topic
    return env


@pytest.fixture
def fraud(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """Runs `fraud ARGS...` in this process (the entry point is too slow to start for every case)."""
    for shared in (console, err_console):
        monkeypatch.setattr(shared, "width", 250)
    runner = CliRunner()

    def invoke(*args: str) -> Any:
        return runner.invoke(app, list(args), env=env_of(settings))

    yield invoke


@pytest.fixture
def store(settings: Settings) -> Iterator[tuple[Any, str]]:
    client = redis.Redis.from_url(settings.redis_url or "")
    yield client, f"test-{uuid.uuid4().hex[:10]}:"
    client.close()


def run_fraud_cli(store: tuple[Any, str], *args: str) -> subprocess.CompletedProcess[str]:
    """The installed `fraud ARGS` (its entry point maps errors to exit codes) on the store's Redis only."""
    client, _ = store
    address = client.connection_pool.connection_kwargs
    env = {k: v for k, v in os.environ.items() if not k.startswith("FRAUD_")}
    env |= {"FRAUD_REDIS_URL": f"redis://{address['host']}:{address['port']}/0", "COLUMNS": "250"}
    env |= {"FRAUD_BOOTSTRAP_SERVERS": "127.0.0.1:1", "FRAUD_MLFLOW_TRACKING_URI": "http://127.0.0.1:1"}
    return subprocess.run([FRAUD, *args], env=env, capture_output=True, text=True, timeout=60, check=False)


def produce_alerts(clients: Clients, topic: str, alerts: list[AlertRecord], garbage: bool = False) -> None:
    producer = clients.producer()
    for alert in alerts:
        producer.produce(topic, alert.model_dump_json(), key=alert.card_id, timestamp=alert.event_time_ms)
    if garbage:
        producer.produce(topic, b'{"schema_version": 1, "tx_id": "nope"}', key=CARD_A, timestamp=T0_MS)
    assert producer.flush(30) == 0


def test_alerts_get(fraud: Any, store: tuple[Any, str]) -> None:
    client, prefix = store
    write_alerts(client, [make_alert(41)], prefix, RETENTION_S)
    result = fraud("alerts", "get", "41", "--prefix", prefix)
    assert result.exit_code == 0, result.output
    for text in (
        CARD_A,
        "fraud-detector",
        "0.91",
        "card_amount_ratio_30d",
        "4.2000",
        "2018-04-01 00:00:41 UTC",
        "card_amount_ratio_30d +1.25, card_nb_tx_1d -0.50",  # the top features, signed
        "(tree_shap); base margin -4.5000",
    ):
        assert text in result.output
    # Each feature's value and contribution, strongest first; a feature without one after them.
    rows = [line.split("│")[1:4] for line in result.output.splitlines() if line.count("│") >= 4]
    assert [[cell.strip() for cell in row] for row in rows[-3:]] == [
        ["card_amount_ratio_30d", "4.2000", "+1.2500"],
        ["card_nb_tx_1d", "3.0000", "-0.5000"],
        ["terminal_risk_7d", "-", "-"],
    ]
    missing = run_fraud_cli(store, "alerts", "get", "42", "--prefix", prefix)
    assert missing.returncode == 4, missing.stderr
    assert (
        missing.stderr.strip()
        == f"error: no alert stored for transaction 42 under the Redis key prefix {prefix!r}"
    )
    assert fraud("alerts", "get", "-3").exit_code == 2


def test_card(fraud: Any, store: tuple[Any, str]) -> None:
    client, prefix = store
    write_alerts(
        client, [make_alert(51, card_id=CARD_B), make_alert(52, card_id=CARD_B)], prefix, RETENTION_S
    )
    write_scores(client, [make_score(53, card_id=CARD_B, score=0.12, alert=False)], prefix, RETENTION_S)
    set_latest(
        client,
        [
            (
                card_features_key(CARD_B, prefix),
                T0_MS + 53_000,
                53,
                {"terminal_id": "77", "amount": 12.5, "late": 0, "card_nb_tx_1d": 4.0},
            )
        ],
        RETENTION_S,
    )
    result = fraud("card", CARD_B, "--prefix", prefix)
    assert result.exit_code == 0, result.output
    assert f"Card {CARD_B}" in result.output
    assert "card_nb_tx_1d" in result.output and "4.0000" in result.output
    assert "Latest score: 0.120" in result.output and "ALERT" not in result.output
    assert "Alerts: 2 shown" in result.output
    assert result.output.index("00:00:52") < result.output.index("00:00:51")  # newest first

    unknown = run_fraud_cli(store, "card", "b" * 32)
    assert unknown.returncode == 4, unknown.stderr
    assert unknown.stderr.strip() == f"error: nothing stored for card {'b' * 32}"
    assert fraud("card", "not-a-token").exit_code == 2


def test_alerts_tail_to_the_end_and_from_a_time(fraud: Any, settings: Settings, clients: Clients) -> None:
    alerts = [make_alert(i, card_id=CARD_A if i % 2 else CARD_B) for i in range(1, 7)]
    produce_alerts(clients, settings.topics.alerts, alerts, garbage=True)

    result = fraud("alerts", "tail")
    assert result.exit_code == 0, result.output
    assert f"Alerts on {settings.topics.alerts}: 6" in result.output
    assert "skipped a malformed alert" in result.output
    for alert in alerts:
        assert f"2018-04-01 00:00:0{alert.tx_id}" in result.output

    later = fraud("alerts", "tail", "--from", "2018-04-01T00:00:04Z")
    assert later.exit_code == 0, later.output
    assert f"Alerts on {settings.topics.alerts}: 3" in later.output
    assert "00:00:03" not in later.output and "00:00:06" in later.output

    assert (
        f"Alerts on {settings.topics.alerts}: 0" in fraud("alerts", "tail", "--from", "-1h").output
    )  # all 2018
    assert fraud("alerts", "tail", "--from", "yesterday-ish").exit_code == 2


def test_alerts_tail_follow_prints_new_alerts(settings: Settings, clients: Clients) -> None:
    """Starts `fraud alerts tail --follow` as a user would, then produces an alert and expects its line."""
    produce_alerts(clients, settings.topics.alerts, [make_alert(1)])
    process = subprocess.Popen(
        [FRAUD, "alerts", "tail", "--follow"],
        env={
            **{k: v for k, v in os.environ.items() if not k.startswith("FRAUD_")},
            **env_of(settings),
            "COLUMNS": "250",
        },
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in process.stdout or []], daemon=True).start()

    def wait_for(text: str, timeout_s: float = 60) -> str:
        deadline = time.monotonic() + timeout_s
        seen = []
        while time.monotonic() < deadline:
            try:
                line = lines.get(timeout=0.5)
            except queue.Empty:
                assert process.poll() is None, "".join(seen)
                continue
            seen.append(line)
            if text in line:
                return line
        raise AssertionError(f"{text!r} not printed within {timeout_s} s:\n{''.join(seen)}")

    try:
        wait_for("tx 1 ")
        produce_alerts(clients, settings.topics.alerts, [make_alert(2, card_id=CARD_B)])
        line = wait_for(f"tx 2  card {CARD_B}")
        # Its top features with their signed contributions to the margin.
        assert line.rstrip().endswith("  [card_amount_ratio_30d +1.25, card_nb_tx_1d -0.50]"), line
        produce_alerts(clients, settings.topics.alerts, [make_alert(3, top_features=["[b]x[/b]", "y"])])
        line = wait_for("tx 3 ")
        assert line.rstrip().endswith("  [[b]x[/b] +1.00, y +0.50]"), line  # as they are, not read as markup
    finally:
        process.terminate()
        process.wait(timeout=10)


def test_parse_time() -> None:
    now = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    assert parse_time("-1h", now) == int((now - timedelta(hours=1)).timestamp() * 1000)
    assert parse_time("-90s", now) == int((now - timedelta(seconds=90)).timestamp() * 1000)
    assert parse_time("-2d", now) == int((now - timedelta(days=2)).timestamp() * 1000)
    assert parse_time("2018-04-01T00:00:00Z") == T0_MS
    assert parse_time("2018-04-01") == T0_MS  # no zone: UTC
    assert parse_time("2018-04-01T02:00:00+02:00") == T0_MS


def test_serve_answers_on_the_given_port(settings: Settings, store: tuple[Any, str]) -> None:
    """`fraud serve` as a user runs it: the page, the API and the given prefix's alerts."""
    client, prefix = store
    write_alerts(client, [make_alert(61)], prefix, RETENTION_S)
    port = free_port()
    process = subprocess.Popen(
        [FRAUD, "serve", "--port", str(port), "--prefix", prefix],
        env={**{k: v for k, v in os.environ.items() if not k.startswith("FRAUD_")}, **env_of(settings)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert process.poll() is None, process.stdout.read() if process.stdout else ""
            try:
                if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                assert time.monotonic() < deadline, "fraud serve did not answer within 60 s"
                time.sleep(0.2)
        assert [a["tx_id"] for a in httpx.get(f"{base}/alerts/recent").json()] == [61]
        assert "card-form" in httpx.get(f"{base}/").text
    finally:
        process.terminate()
        process.wait(timeout=10)
