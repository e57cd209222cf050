"""React to fraud alerts: a consumer-group service reading the alerts topic (the README's example).

Run several copies with the same ``--group`` and Kafka shares the topic's partitions among them. The
consumer reads committed records only (``isolation.level=read_committed``: alerts of a scoring batch
that was rolled back are never seen) and commits an alert's offset only after handling it, so delivery is
at-least-once: after a crash, the alerts since the last commit come again. Make the handler idempotent by
keying its effects on ``tx_id`` (a case id, an upsert).

    python examples/alert_consumer.py --bootstrap-servers 127.0.0.1:9092 --group case-management

Without ``--bootstrap-servers`` it reads the broker of the project's settings (``FRAUD_BOOTSTRAP_SERVERS``,
else the embedded stack started by ``fraud up``), and the alerts topic is the settings' own. It logs in as
the project's own clients do: the settings' security protocol, SASL and TLS (``FRAUD_SECURITY_PROTOCOL``,
``FRAUD_SASL_*``, ``FRAUD_SSL_*``).
"""

from __future__ import annotations

import argparse
import signal
from typing import Any

from confluent_kafka import Consumer, KafkaException, Message

from contracts.records import AlertRecord
from contracts.settings import load_settings
from infra.embedded.stack import EmbeddedStack


def handle(alert: AlertRecord) -> None:
    """Your reaction to an alert: open a case, block the card, page an analyst. Keep it idempotent."""
    print(
        f"alert tx={alert.tx_id} card={alert.card_id} amount={alert.amount:.2f} "
        f"score={alert.score:.3f} model={alert.model_name} v{alert.model_version}",
        flush=True,
    )


def consume(client_config: dict[str, Any], topic: str, group: str, max_records: int | None = None) -> int:
    """Handle alerts until stopped (SIGINT/SIGTERM) or ``max_records`` were handled; returns the count.
    ``client_config``: the broker and how to log in to it (``settings.kafka.client_config``)."""
    consumer = Consumer(
        {
            **client_config,
            "group.id": group,
            "isolation.level": "read_committed",  # librdkafka's default is read_uncommitted
            "enable.auto.commit": False,  # commit after handling, not on a timer
            "auto.offset.reset": "earliest",  # a new group starts at the oldest alert kept
        }
    )
    stop = False

    def request_stop(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    handled = 0
    consumer.subscribe([topic])
    try:
        while not stop and (max_records is None or handled < max_records):
            message: Message | None = consumer.poll(1.0)
            if message is None:
                continue
            if message.error() is not None:
                raise KafkaException(message.error())
            try:
                alert = AlertRecord.model_validate_json(message.value() or b"")
            except ValueError as exc:  # not an alert: log it and move on, never block the partition
                print(f"skipped a malformed record at offset {message.offset()}: {exc}", flush=True)
            else:
                handle(alert)
                handled += 1
            consumer.commit(message=message, asynchronous=False)  # this record and all before it are done
    finally:
        consumer.close()  # leaves the group at once, so its partitions move to the other members
    return handled


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    settings = load_settings()
    parser.add_argument(
        "--bootstrap-servers",
        default=settings.bootstrap_servers,
        help="Kafka bootstrap servers, host:port (default: FRAUD_BOOTSTRAP_SERVERS, else the embedded stack).",
    )
    parser.add_argument("--topic", default=settings.topics.alerts, help="The alerts topic.")
    parser.add_argument("--group", default="alert-reactor", help="Consumer group id shared by the copies.")
    parser.add_argument("--max-records", type=int, default=None, help="Stop after this many alerts.")
    args = parser.parse_args()
    servers = args.bootstrap_servers
    if servers is None:
        stack = EmbeddedStack(settings.home).running()
        if stack is None:
            parser.error(
                "give --bootstrap-servers (or FRAUD_BOOTSTRAP_SERVERS), or start a stack with `fraud up`"
            )
        servers = stack.bootstrap_servers
    consume(settings.kafka.client_config(servers), args.topic, args.group, args.max_records)


if __name__ == "__main__":
    main()
