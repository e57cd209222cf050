"""The `fraud` command as a user runs it, against the session's embedded stack."""

import os
import subprocess
from pathlib import Path

import orjson
import pandas as pd

from contracts.events import Reason, from_message
from contracts.settings import DEMO_TOKEN_KEY, Settings
from fraud.demo import BAD_EVENTS_FILE
from infra.clients import Clients
from infra.kafka.log import read_topic, topic_counts
from tests.support.samples import GOOD as TX
from tests.support.scripts import FRAUD, run_fraud


def test_simulate_to_file_and_kafka_then_ingest_handbook_csv(
    settings: Settings, clients: Clients, tmp_path: Path
) -> None:
    out = tmp_path / "sim.parquet"
    result = run_fraud(
        settings,
        "simulate",
        "--customers",
        "100",
        "--terminals",
        "200",
        "--days",
        "10",
        "--out",
        str(out),
        "--produce",
    )
    assert result.returncode == 0, result.stderr
    simulated = pd.read_parquet(out)
    assert "Produced" in result.stdout and "transactions" in result.stdout

    handbook = tmp_path / "handbook.csv"
    pd.DataFrame(
        {
            "TRANSACTION_ID": simulated["tx_id"] + 1_000_000,
            "TX_DATETIME": simulated["event_time"].dt.strftime("%Y-%m-%d %H:%M:%S"),
            "CUSTOMER_ID": simulated["card_id"],
            "TERMINAL_ID": simulated["terminal_id"],
            "TX_AMOUNT": simulated["amount"],
            "TX_FRAUD": simulated["is_fraud"],
        }
    ).to_csv(handbook, index=False)
    result = run_fraud(settings, "ingest", str(handbook), "--mapping", "handbook")
    assert result.returncode == 0, result.stderr

    counts = topic_counts(clients, [settings.topics.transactions, settings.topics.labels])
    assert counts[settings.topics.transactions] == 2 * len(simulated)
    assert counts[settings.topics.labels] == 2 * int(simulated["is_fraud"].sum())

    status = run_fraud(settings, "topics", "list")
    assert status.returncode == 0, status.stderr
    assert f"{2 * len(simulated):,}" in status.stdout


def test_simulate_if_empty_produces_once(settings: Settings, clients: Clients) -> None:
    """The compose simulator's command run twice, as a second `docker compose up` does: the second run
    produces nothing."""
    args = ("simulate", "--customers", "100", "--terminals", "200", "--days", "3", "--produce", "--if-empty")
    first = run_fraud(settings, *args)
    assert first.returncode == 0, first.stderr
    produced = topic_counts(clients, [settings.topics.transactions])[settings.topics.transactions]
    assert produced > 0, first.stdout
    again = run_fraud(settings, *args)
    assert again.returncode == 0, again.stderr
    assert "holds records already: nothing produced (--if-empty)" in again.stdout
    assert topic_counts(clients, [settings.topics.transactions])[settings.topics.transactions] == produced


def test_the_public_demo_token_key_is_refused_with_a_kafka_of_ones_own(
    settings: Settings, clients: Clients
) -> None:
    result = run_fraud(settings, "ingest", str(BAD_EVENTS_FILE), token_key=DEMO_TOKEN_KEY)
    assert result.returncode == 2
    assert "FRAUD_TOKEN_KEY is the public demo key" in result.stderr and "Traceback" not in result.stderr
    assert topic_counts(clients, [settings.topics.transactions])[settings.topics.transactions] == 0


def test_an_event_dated_in_2099_is_dead_lettered_and_its_neighbours_are_kept(
    settings: Settings, clients: Clients, tmp_path: Path
) -> None:
    lines = [
        orjson.dumps({**TX, "tx_id": tx_id, "event_time_ms": TX["event_time_ms"] + tx_id * 1000})
        for tx_id in (1, 2, 3)
    ]
    lines.insert(1, orjson.dumps({**TX, "tx_id": 99, "event_time_ms": 4_070_908_800_000}))  # 2099-01-01
    events = tmp_path / "events.jsonl"
    events.write_bytes(b"\n".join(lines) + b"\n")
    result = run_fraud(settings, "ingest", str(events))
    assert result.returncode == 6, result.stderr  # produced, and a record dead-lettered
    assert result.stderr.strip().endswith("the other 3 were produced"), result.stderr
    tx_ids = sorted(
        orjson.loads(m.value() or b"")["tx_id"] for m in read_topic(clients, settings.topics.transactions)
    )
    assert tx_ids == [1, 2, 3]
    letters = [from_message(m) for m in read_topic(clients, settings.topics.dead_letter)]
    assert [(letter.reason, orjson.loads(letter.raw)["tx_id"]) for letter in letters] == [
        (Reason.FUTURE_EVENT_TIME, 99)
    ]


def test_user_errors_are_one_clear_line(settings: Settings, tmp_path: Path) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("a,b\n1,2\n")
    result = run_fraud(settings, "ingest", str(bad))
    assert result.returncode == 2  # a ConfigError: the user's file
    assert "missing column(s)" in result.stderr
    assert "Traceback" not in result.stderr

    env_typo = run_fraud(settings, "topics", "list")
    assert env_typo.returncode == 0
    result = subprocess.run(
        [FRAUD, "status"],
        env={**os.environ, "FRAUD_BOOTSTRAP_SERVER": "x"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 2
    assert "unknown setting FRAUD_BOOTSTRAP_SERVER (did you mean FRAUD_BOOTSTRAP_SERVERS?)" in result.stderr


def test_without_stack_or_settings_says_how_to_start(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FRAUD_")}
    env["FRAUD_HOME"] = str(tmp_path / "empty")
    result = subprocess.run([FRAUD, "topics", "list"], env=env, capture_output=True, text=True, check=False)
    assert result.returncode == 3  # a ServiceUnavailableError
    assert "fraud up" in result.stderr and "FRAUD_BOOTSTRAP_SERVERS" in result.stderr
