"""Reading topics on the real broker: where partitions begin and end for a read_committed reader."""

from __future__ import annotations

import uuid

from confluent_kafka import Producer

from contracts.settings import Settings
from infra.clients import Clients
from infra.kafka.log import offset_bounds, read_topic


def test_a_partition_with_an_open_transaction_ends_where_the_transaction_begins(
    clients: Clients, settings: Settings
) -> None:
    """A read_committed reader's partition ends at the last stable offset while a transaction is open on it:
    the committed records and their commit marker (offsets 0-4, then 5) before the open transaction (from 6);
    all of it once that one commits."""
    topic = settings.topics.alerts
    producer = Producer({**clients.kafka_config(), "transactional.id": f"open-{uuid.uuid4().hex[:8]}"})
    producer.init_transactions(30)
    producer.begin_transaction()
    for number in range(5):
        producer.produce(topic, f"committed-{number}".encode(), partition=0)
    producer.commit_transaction(30)
    producer.begin_transaction()
    for number in range(10):
        producer.produce(topic, f"open-{number}".encode(), partition=0)
    producer.flush(30)  # on the broker, not committed

    assert offset_bounds(clients.admin(), topic)[0] == (0, 6)
    assert [m.value() for m in read_topic(clients, topic)] == [f"committed-{n}".encode() for n in range(5)]

    producer.commit_transaction(30)
    assert len(list(read_topic(clients, topic))) == 15
