"""Upgrading the feature job: a new version with one more window, from a savepoint, against a full replay.

The simulator's history (61 days by default) goes to an embedded stack; ``fraud features run --once``
processes all but its last day, and ``fraud savepoint create features`` saves its state. The last day then
arrives, and the new version of the job (``--windows 1,7,14,30``: the 14-day card and terminal features
added) runs twice, each with ``--once`` in a namespace of its own:

- **from the savepoint** (``--from-savepoint``): it takes the state over and processes the new day;
- **as a full replay** from the earliest offset: it rebuilds its state from the whole history.

Both are timed from the command's launch to its exit (Spark's start-up included), as a user runs them, and
their records of the new day's transactions must be the same, value for value; the script fails
otherwise. Writes the ``upgrade`` section of docs/benchmarks.md.

Run: .venv/bin/python bench/bench_upgrade.py [--customers 5000 --days 61] [--no-report]
Quick: .venv/bin/python bench/bench_upgrade.py --customers 500 --days 60 --no-report
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson
import report
from project_jobs import fraud_env

from features.compat import check_specs, spec_record
from features.definitions import DAY_MS, DEFAULT_PARAMS, FeatureParams
from infra.clients import Clients
from infra.embedded.stack import temporary_stack
from infra.kafka.admin import create_project_topics
from infra.kafka.log import read_topic
from ingest.files import clean_table
from ingest.produce import events_from_table, produce_events
from ingest.simulator import SimulatorConfig, simulate

FRAUD = Path(sys.executable).parent / "fraud"
#: The new version: one more window, within the state's longest (its features look back no further).
UPGRADED = FeatureParams(window_days=(1, 7, 14, 30))


def timed(env: dict[str, str], *args: str) -> float:
    """Run ``fraud ARGS`` to its end; its wall time in seconds (fails with its output if it fails)."""
    started = time.perf_counter()
    done = subprocess.run([str(FRAUD), *args], env=env, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        sys.exit(
            f"fraud {' '.join(args)} failed ({done.returncode}):\n{done.stdout[-2000:]}{done.stderr[-3000:]}"
        )
    print(f"  fraud {' '.join(args)}: {seconds:,.1f} s")
    return seconds


def values_by_tx(clients: Clients, topic: str, tx_ids: set[int]) -> dict[int, bytes]:
    """The feature records of ``tx_ids`` on ``topic``, by transaction."""
    found: dict[int, bytes] = {}
    for message in read_topic(clients, topic):
        value = message.value() or b""
        tx_id = orjson.loads(value)["tx_id"]
        if tx_id in tx_ids:
            found[tx_id] = value
    return found


def main() -> None:
    parser = report.world_parser(__doc__)
    parser.add_argument(
        "--days", type=int, default=61, help="the history: the first version runs over all but its last day"
    )
    parser.add_argument("--seed", type=int, default=0)
    report.add_flag(parser)
    args = parser.parse_args()
    windows = ",".join(map(str, UPGRADED.window_days))
    added = check_specs(spec_record(DEFAULT_PARAMS), UPGRADED, "the savepoint")
    print(f"settings: {vars(args)}; new version: --windows {windows} ({'; '.join(added)})")

    frame = simulate(
        SimulatorConfig(customers=args.customers, terminals=args.terminals, days=args.days, seed=args.seed)
    )
    with tempfile.TemporaryDirectory() as directory, temporary_stack(Path(directory) / "stack") as info:
        home = Path(directory) / "home"
        env = fraud_env(info, home, "bench-token-key", FRAUD_PARTITIONS="4")
        clients = Clients.for_stack(info, home, partitions=4)
        settings = clients.settings
        create_project_topics(clients.admin(), settings)
        events = events_from_table(
            clean_table(frame, "bench"),
            "bench",
            b"bench-token-key",
            round(settings.label_delay_days * DAY_MS),
            settings.max_event_bytes,
        )
        cut = max(events.tx_times) - DAY_MS
        history, new_day = events.split_at(cut)
        produce_events(clients.producer(), settings.topics, history)
        print(f"history: {len(history.tx_values):,} transactions, {len(history.label_values):,} labels")

        first_s = timed(env, "features", "run", "--once")
        savepoint = Path(directory) / "savepoint"
        save_s = timed(env, "savepoint", "create", "features", "--to", str(savepoint))
        size = sum(path.stat().st_size for path in savepoint.rglob("*") if path.is_file())
        produce_events(clients.producer(), settings.topics, new_day)
        print(f"new day: {len(new_day.tx_values):,} transactions, {len(new_day.label_values):,} labels")

        upgrade_s = timed(
            env, "features", "run", "--once", "--windows", windows, "--namespace", "upgraded",
            "--from-savepoint", str(savepoint),
        )  # fmt: skip
        replay_s = timed(env, "features", "run", "--once", "--windows", windows, "--namespace", "replayed")

        new_tx = {orjson.loads(value)["tx_id"] for value in new_day.tx_values}
        upgraded = values_by_tx(clients, settings.topics.in_namespace("upgraded").features, new_tx)
        replayed = values_by_tx(clients, settings.topics.in_namespace("replayed").features, new_tx)
        if not upgraded or upgraded != replayed:
            differ = [tx for tx in new_tx if upgraded.get(tx) != replayed.get(tx)]
            sys.exit(f"the upgraded job's records of the new day differ from the replay's: {len(differ):,}")
        print(f"the new day's {len(upgraded):,} feature records are the same from both")

    transactions = len(history.tx_values) + len(new_day.tx_values)
    rows = [
        ["the first version, over the history (`--once`)", f"{first_s:,.1f} s"],
        ["`fraud savepoint create features`", f"{save_s:,.1f} s ({size / 2**20:,.1f} MiB)"],
        ["new version from the savepoint, the new day (`--from-savepoint`)", f"{upgrade_s:,.1f} s"],
        ["new version as a full replay, history and new day", f"{replay_s:,.1f} s"],
        ["replay / upgrade", f"{replay_s / upgrade_s:,.1f}x"],
    ]
    for name, value in rows:
        print(f"{name}: {value}")
    table = report.Table(
        ["step (wall time of the command, Spark start-up included)", "time"],
        rows,
        notes=[
            f"Input: {transactions:,} transactions over {args.days} days, the last day after the "
            f"savepoint ({len(new_day.tx_values):,} transactions). New version: --windows {windows} "
            f"({'; '.join(added)}). The new day's {len(upgraded):,} feature records are the same "
            "from both runs."
        ],
    )
    report.write_unless_skipped(
        args,
        "upgrade",
        script=__file__,
        tables=[table],
        settings={**report.args_settings(args), "stack": f"{report.EMBEDDED_STACK}, Spark local"},
        title="Upgrading the feature job: from a savepoint, or a full replay",
    )


if __name__ == "__main__":
    main()
