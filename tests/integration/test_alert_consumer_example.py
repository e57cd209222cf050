"""The README's consumer-group example (examples/alert_consumer.py) run against the embedded broker.

Produces three alerts, runs the example as a service would run it (its own process, a consumer group,
read_committed, manual commits) until it has handled them, then checks that the group's committed
offsets reached the end of every partition.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from confluent_kafka import TopicPartition

from contracts.settings import Settings
from infra.clients import Clients
from infra.kafka.log import offset_bounds
from tests.support.factories import CARD_B, make_alert

EXAMPLE = Path(__file__).parents[2] / "examples" / "alert_consumer.py"
GROUP_JOIN_TIMEOUT_S = 120


def test_example_consumer_handles_alerts_and_commits(settings: Settings, clients: Clients) -> None:
    topic = settings.topics.alerts
    alerts = [make_alert(1), make_alert(2, card_id=CARD_B), make_alert(3)]
    producer = clients.producer()
    for alert in alerts:
        producer.produce(topic, alert.model_dump_json(), key=alert.card_id, timestamp=alert.event_time_ms)
    assert producer.flush(30) == 0

    group = f"{topic}-example"
    command = [sys.executable, str(EXAMPLE), "--bootstrap-servers", settings.bootstrap_servers or ""]
    result = subprocess.run(
        [*command, "--topic", topic, "--group", group, "--max-records", "3"],
        capture_output=True,
        text=True,
        timeout=GROUP_JOIN_TIMEOUT_S,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    lines = sorted(line for line in result.stdout.splitlines() if line.startswith("alert "))
    assert [line.split()[1] for line in lines] == ["tx=1", "tx=2", "tx=3"]
    assert f"card={CARD_B}" in lines[1] and "model=fraud-detector v3" in lines[1]

    probe = clients.consumer(group_id=group, overrides={"enable.partition.eof": True})
    try:
        ends = {p: end for p, (_, end) in offset_bounds(clients.admin(), topic).items()}
        committed = probe.committed([TopicPartition(topic, p) for p in ends], timeout=10)
        assert {tp.partition: max(tp.offset, 0) for tp in committed} == ends
    finally:
        probe.close()
