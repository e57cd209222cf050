"""Peer: a Quix Streams 3 application. A ``StreamingDataFrame`` over the transactions topic (keyed by card),
``apply(stateful=True)`` keeping the card's history (``card_windows``) in Quix's RocksDB state with its
changelog topic, ``to_topic`` to the output. Quix's defaults otherwise: a consumer group, at-least-once
(offsets and state committed every 5 s), JSON (orjson) serializers; ``--exactly-once`` switches to its
exactly-once guarantee (Kafka transactions, one per commit, every ``--commit-interval-s``).

Runs in a virtualenv of its own (build/bench-venvs/quixstreams, made by bench/bench_peers.py): Quix
Streams 3.28 pins a confluent-kafka older than the project's.

Run: python bench/peers/quix_app.py --bootstrap HOST:PORT --input T --output T --state-dir DIR
"""

from __future__ import annotations

from typing import Any

from card_windows import new_history, peer_parser, process
from quixstreams import Application, State

#: The state key of a card's history (the state is per message key: per card).
HISTORY = "history"


def card_features(event: dict[str, Any], state: State) -> dict[str, Any]:
    """The card's history from the state, updated with the transaction; its output record."""
    history = state.get(HISTORY) or new_history()
    record = process(history, event)
    state.set(HISTORY, history)
    return record


def main() -> None:
    parser = peer_parser(__doc__)
    parser.add_argument("--state-dir", required=True, help="RocksDB state directory")
    parser.add_argument(
        "--exactly-once", action="store_true", help="Quix's exactly-once processing guarantee"
    )
    parser.add_argument("--commit-interval-s", type=float, default=5.0, help="Quix's commit interval")
    args = parser.parse_args()
    app = Application(
        broker_address=args.bootstrap,
        consumer_group="bench-quix",
        auto_offset_reset="earliest",
        state_dir=args.state_dir,
        loglevel="WARNING",
        processing_guarantee="exactly-once" if args.exactly_once else "at-least-once",
        commit_interval=args.commit_interval_s,
    )
    transactions = app.topic(args.input, value_deserializer="json")
    output = app.topic(args.output, value_serializer="json")
    frame = app.dataframe(transactions).apply(card_features, stateful=True)
    frame.to_topic(output)
    print(f"quix streams: {args.input} -> {args.output}, state in {args.state_dir}", flush=True)
    app.run()


if __name__ == "__main__":
    main()
