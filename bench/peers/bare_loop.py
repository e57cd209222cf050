"""Peer: a bare confluent-kafka loop with its state in a dict. No fault tolerance: no offsets committed and
no state saved (a restart can only begin again from the start of the topic, writing every output again),
output produced without idempotence or transactions.

One consumer assigned every partition of the input topic from its beginning (no group join), one
producer, one thread: consume a batch, update the card's history (``card_windows``), produce one JSON
record per transaction, keyed by card.

Run (by bench/bench_peers.py): python bench/peers/bare_loop.py --bootstrap HOST:PORT --input T --output T
"""

from __future__ import annotations

import signal
import sys

import orjson
from card_windows import History, new_history, peer_parser, process
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, Producer, TopicPartition


def main() -> None:
    parser = peer_parser(__doc__)
    parser.add_argument("--batch", type=int, default=1000, help="records per consume call at most")
    args = parser.parse_args()

    consumer = Consumer(
        {
            "bootstrap.servers": args.bootstrap,
            "group.id": "bench-bare-loop",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
        }
    )
    partitions = consumer.list_topics(args.input, timeout=30).topics[args.input].partitions
    consumer.assign([TopicPartition(args.input, p, OFFSET_BEGINNING) for p in sorted(partitions)])
    producer = Producer({"bootstrap.servers": args.bootstrap})
    state: dict[str, History] = {}
    running = True

    def stop(*_: object) -> None:
        nonlocal running
        running = False

    signal.signal(signal.SIGTERM, stop)
    print(f"bare loop: {args.input} ({len(partitions)} partitions) -> {args.output}", flush=True)
    while running:
        for message in consumer.consume(args.batch, timeout=0.01):
            if message.error() is not None:
                raise KafkaException(message.error())
            raw = message.value()
            if raw is None:  # a tombstone: no transaction
                continue
            event = orjson.loads(raw)
            card = event["card_id"]
            history = state.get(card)
            if history is None:
                history = state[card] = new_history()
            value = orjson.dumps(process(history, event))
            while True:
                try:
                    producer.produce(args.output, value, message.key())
                    break
                except BufferError:
                    producer.poll(0.01)
        producer.poll(0)
    producer.flush(10)
    consumer.close()
    sys.exit(0)


if __name__ == "__main__":
    main()
