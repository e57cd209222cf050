"""Card numbers are never stored: 100 rows holding Luhn-valid card numbers (in the card_id field, in a
free field, in a malformed line, in a terminal id, as an amount or a time; whole, or grouped with spaces
or dashes) go through `fraud ingest` (JSON lines and CSV) beside good rows whose card ids are card numbers
(tokenised at ingest), then `fraud pipeline run` (features and scoring) as a user runs it. The rows with
a card number as their terminal id are kept, the terminal id tokenised; the others are dead letters. None of the
numbers is found, in any of its written forms, on any topic (keys, values, headers; dead letters
included), in any Redis key or value, in the commands' output or in any file under their FRAUD_HOME.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import orjson
import pandas as pd
import pytest
import redis

from contracts.events import from_message
from contracts.settings import Settings
from features.definitions import DEFAULT_PARAMS
from infra.clients import Clients
from infra.kafka.log import read_topic, topic_counts
from models.dataset import Dataset
from tests.support.cards import formatted, random_card_numbers
from tests.support.cli_stack import train_champion
from tests.support.samples import GOOD as TX
from tests.support.scripts import run_fraud

pytestmark = pytest.mark.minutes(2)

BAD_ROWS = 100
GOOD_ROWS = 30
#: Rows whose only fault is a card number as the terminal id (one of five kinds, in each file): kept.
TERMINAL_ROWS = BAD_ROWS // 5
NUMBERS = random_card_numbers(BAD_ROWS + GOOD_ROWS + 1, seed=17)
BAD, GOOD_CARDS, MALFORMED_CSV = NUMBERS[:BAD_ROWS], NUMBERS[BAD_ROWS:-1], NUMBERS[-1]
T0 = "2018-04-15 10:00:00"


def forms(number: str) -> list[bytes]:
    """The ways a number is written: whole, in groups of four with spaces, with dashes."""
    return [form.encode() for form in (number, formatted(number, " "), formatted(number, "-"))]


def jsonl_lines(numbers: list[str]) -> list[bytes]:
    """Good events (tokens), and a bad line per number, the number in five kinds of place."""
    lines = [
        orjson.dumps({**TX, "tx_id": 1_000 + i, "event_time_ms": TX["event_time_ms"] + i}) for i in range(5)
    ]
    for i, number in enumerate(numbers):
        event = {**TX, "tx_id": 2_000 + i}
        kind = i % 5
        if kind == 0:
            lines.append(orjson.dumps({**event, "card_id": number}))
        elif kind == 1:
            lines.append(orjson.dumps({**event, "card_id": formatted(number, " ")}))
        elif kind == 2:
            lines.append(orjson.dumps({**event, "note": f"paid with {formatted(number, '-')}"}))
        elif kind == 3:
            lines.append(f'{{"tx_id": {event["tx_id"]}, "card_id": "{number}", "amount": 1'.encode())
        else:
            lines.append(orjson.dumps({**event, "terminal_id": formatted(number, "-")}))
    return lines


def csv_rows(numbers: list[str]) -> pd.DataFrame:
    """Good rows whose card ids are card numbers (ingest tokenises them), some above the alert amount,
    and a bad row per number, the number in five kinds of place."""
    when = pd.Timestamp(T0)
    rows = [
        {
            "tx_id": 3_000 + i,
            "card_id": number,
            "terminal_id": str(100 + i % 3),
            "amount": 500.0 if i % 4 == 0 else 20.0 + i,
            "event_time": str(when + pd.Timedelta(minutes=i)),
        }
        for i, number in enumerate(GOOD_CARDS)
    ]
    for i, number in enumerate(numbers):
        row = {"tx_id": 4_000 + i, "card_id": "77", "terminal_id": "100", "amount": "12.5", "event_time": T0}
        kind = i % 5
        if kind == 0:
            row |= {"card_id": number, "amount": "-5"}
        elif kind == 1:
            row |= {"card_id": formatted(number, " "), "amount": "twelve"}
        elif kind == 2:
            row |= {"terminal_id": number}
        elif kind == 3:
            row |= {"event_time": formatted(number, "-")}
        else:
            row |= {"amount": formatted(number, " ")}
        rows.append(row)
    return pd.DataFrame(rows)


def redis_contents(client: redis.Redis) -> bytes:
    """Every key of the server and everything stored under it, as one text."""
    parts = []
    for key in client.scan_iter(count=1_000):
        kind = client.type(key)
        parts.append(key)
        if kind == b"string":
            parts.append(client.get(key) or b"")
        elif kind == b"hash":
            parts += [item for pair in client.hgetall(key).items() for item in pair]
        elif kind == b"zset":
            parts += [member for member, _ in client.zrange(key, 0, -1, withscores=True)]
        elif kind == b"set":
            parts += list(client.smembers(key))
        elif kind == b"list":
            parts += client.lrange(key, 0, -1)
    return b"\n".join(parts)


def topic_contents(clients: Clients, topic: str) -> bytes:
    """Every record of ``topic``: keys, values, header names and values."""
    parts = []
    for message in read_topic(clients, topic):
        parts += [message.key() or b"", message.value() or b""]
        for name, value in message.headers() or []:
            parts += [name.encode(), value or b""]
    return b"\n".join(parts)


@pytest.fixture
def champion(small_dataset: Dataset, store_uri: str, tmp_path: Path) -> str:
    """An MLflow store of this test with a registered champion (trained on the small simulated world)."""
    train_champion(small_dataset, DEFAULT_PARAMS, store_uri, tmp_path / "art")
    return store_uri


def test_card_numbers_in_bad_rows_are_stored_nowhere(
    settings: Settings, clients: Clients, champion: str, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    settings = settings.model_copy(update={"home": home, "mlflow_tracking_uri": champion})
    events = tmp_path / "events.jsonl"
    events.write_bytes(b"\n".join(jsonl_lines(BAD[:50])) + b"\n")
    table = tmp_path / "transactions.csv"
    csv_rows(BAD[50:]).to_csv(table, index=False)
    malformed = tmp_path / "malformed.csv"  # a line of seven fields under a header of five
    malformed.write_text(
        f"tx_id,card_id,terminal_id,amount,event_time\n1,{MALFORMED_CSV},7,1.0,{T0},x,{MALFORMED_CSV}\n"
    )

    results: list[tuple[str, subprocess.CompletedProcess[str]]] = []
    for args in (
        ("ingest", str(events)),
        ("ingest", str(table)),
        ("ingest", str(malformed)),
        ("pipeline", "run", "--once"),  # the feature job and the scoring job in one query
    ):
        result = run_fraud(settings, *args)
        expected = 6 if args[0] == "ingest" else 0  # 6: the good rows produced, the bad dead-lettered
        assert result.returncode == expected, f"fraud {' '.join(args)}:\n{result.stderr[-3000:]}"
        results.append((" ".join(args), result))

    topics = settings.topics
    counts = topic_counts(clients, [topics.transactions, topics.dead_letter, topics.scores, topics.alerts])
    assert counts[topics.transactions] == 5 + GOOD_ROWS + TERMINAL_ROWS, counts
    assert counts[topics.scores] == counts[topics.transactions], counts
    assert counts[topics.alerts] > 0, "no alert: the alert paths went untested"
    letters = [from_message(message) for message in read_topic(clients, topics.dead_letter)]
    assert len(letters) == BAD_ROWS - TERMINAL_ROWS + 1, "each bad row alone (the malformed CSV line too)"
    assert any(letter.source.startswith(f"file:{malformed}") for letter in letters)

    places = {f"topic {topic}": topic_contents(clients, topic) for topic in topics.all()}
    places["redis"] = redis_contents(redis.Redis.from_url(str(settings.redis_url)))
    for name, result in results:
        places[f"stdout of fraud {name}"] = result.stdout.encode()
        places[f"stderr of fraud {name}"] = result.stderr.encode()
    for path in home.rglob("*"):
        if path.is_file():
            places[str(path)] = path.read_bytes()
    leaks = [
        f"{number} in {where}"
        for number in NUMBERS
        for where, content in places.items()
        if any(form in content for form in forms(number))
    ]
    assert not leaks, f"{len(leaks)} card numbers found: {leaks[:10]}"
