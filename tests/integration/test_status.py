"""`fraud status` on the embedded stack: the topics' offsets, right and quick."""

from __future__ import annotations

import time

from contracts.settings import Settings
from fraud.commands.status import offsets_table
from infra.clients import Clients
from tests.support.scripts import run_fraud

#: What the offsets table may take on the embedded broker. It read each topic apart, each partition's end
#: found by a fetch that waited librdkafka's default 500 ms: 6.6 s for the seven topics.
OFFSETS_TABLE_BUDGET_S = 2.0


def test_status_shows_each_topics_offsets_in_well_under_two_seconds(
    settings: Settings, clients: Clients
) -> None:
    producer = clients.producer()
    for i in range(300):
        producer.produce(settings.topics.transactions, key=f"card-{i % 11}", value=b"{}")
    for i in range(40):
        producer.produce(settings.topics.labels, key=f"card-{i % 5}", value=b"{}")
    assert producer.flush(30) == 0

    started = time.monotonic()
    table = offsets_table(clients, settings)
    took = time.monotonic() - started
    rows = {
        topic: (partitions, first, end)
        for topic, partitions, first, end in zip(*(column.cells for column in table.columns), strict=True)
    }
    assert rows[settings.topics.transactions] == (str(settings.partitions), "0", "300")
    assert rows[settings.topics.labels] == (str(settings.partitions), "0", "40")
    assert rows[settings.topics.alerts] == (str(settings.partitions), "0", "0")
    assert list(rows) == settings.topics.all()
    assert took < OFFSETS_TABLE_BUDGET_S, f"the offsets table took {took:.1f} s"

    status = run_fraud(settings, "status")
    assert status.returncode == 0, status.stderr
    line = next(line for line in status.stdout.splitlines() if f"│ {settings.topics.transactions} " in line)
    assert [cell.strip() for cell in line.split("│")[2:5]] == [str(settings.partitions), "0", "300"], line
