"""Peer: a Bytewax 0.21 dataflow, one worker. Its Kafka input (a consumer per partition, assigned from the
beginning), ``stateful_map`` keyed by card with the card's history (``card_windows``) as state, its Kafka
output. No recovery store is configured (Bytewax's default): state lives in memory and a restart begins
again from the start of the topic; the Kafka sink is at-least-once.

Runs in a virtualenv of its own (build/bench-venvs/bytewax, made by bench/bench_peers.py).

Run: python bench/peers/bytewax_flow.py --bootstrap HOST:PORT --input T --output T
"""

from __future__ import annotations

import bytewax.operators as op
import orjson
from bytewax.connectors.kafka import KafkaSinkMessage
from bytewax.connectors.kafka import operators as kop
from bytewax.dataflow import Dataflow
from bytewax.run import cli_main
from card_windows import History, new_history, peer_parser, process


def card_features(history: History | None, value: bytes) -> tuple[History, bytes]:
    """The mapper of ``stateful_map``: (the card's history, a transaction) -> (history, output record)."""
    if history is None:
        history = new_history()
    return history, orjson.dumps(process(history, orjson.loads(value)))


def dataflow(bootstrap: str, input_topic: str, output_topic: str) -> Dataflow:
    flow = Dataflow("bench-card-windows")
    source = kop.input(
        "transactions",
        flow,
        brokers=[bootstrap],
        topics=[input_topic],
    )
    op.inspect("errors", source.errs, lambda _step, error: print(f"kafka error: {error}", flush=True))
    keyed = op.map("by_card", source.oks, lambda m: (m.key.decode(), m.value))
    outputs = op.stateful_map("card_windows", keyed, card_features)
    messages = op.map("to_kafka", outputs, lambda kv: KafkaSinkMessage(kv[0].encode(), kv[1]))
    kop.output(
        "features",
        messages,
        brokers=[bootstrap],
        topic=output_topic,
    )
    return flow


def main() -> None:
    parser = peer_parser(__doc__)
    args = parser.parse_args()
    flow = dataflow(args.bootstrap, args.input, args.output)
    print(f"bytewax: {args.input} -> {args.output}, 1 worker", flush=True)
    cli_main(flow, workers_per_process=1)


if __name__ == "__main__":
    main()
