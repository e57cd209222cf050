"""The frontier source's rules, without Spark or Kafka: the frontier of what was read, when a micro-batch
carries ticks, and the query offset log it reads the connector's offsets from."""

import json
from pathlib import Path

import pytest

from contracts.errors import ConfigError
from infra.kafka.offsets import NO_FRONTIER
from infra.spark.checkpoint import newest_batch
from infra.spark.frontier import FrontierConfig, TickSplit, final_in, frontier_of, next_frontier
from infra.spark.offset_log import (
    ENDING_FILE,
    Frontier,
    is_frontier,
    logged_batch,
    position_at,
    record_ending,
    settle_ending,
)

KAFKA = {"bootstrap.servers": "127.0.0.1:9092"}


def test_frontier_is_the_slowest_partition_that_still_has_records() -> None:
    progress = {"tx/0": 1_000, "tx/1": 700, "labels/0": 5_000}
    assert frontier_of(progress, lagging=["tx/0", "tx/1"], lateness_ms=0) == 700
    assert frontier_of(progress, lagging=["tx/0"], lateness_ms=100) == 900


def test_frontier_passes_everything_once_all_partitions_are_read() -> None:
    progress = {"tx/0": 1_000, "tx/1": 700}
    assert frontier_of(progress, lagging=[], lateness_ms=0) == 1_001
    assert frontier_of(progress, lagging=[], lateness_ms=50) == 951
    assert frontier_of({}, lagging=[], lateness_ms=0) == NO_FRONTIER


def test_a_partition_never_read_holds_the_frontier_back() -> None:
    assert frontier_of({"tx/0": 1_000}, lagging=["tx/1"], lateness_ms=0) == NO_FRONTIER


def test_a_frontier_moves_with_the_last_records_read_and_never_back() -> None:
    start = Frontier({"tx/0": 10}, {"tx/0": 5_000}, 4_000)
    moved = next_frontier(start, 3, {"tx/0": 20}, {"tx/0": 6_000}, ["tx/0"], lateness_ms=500)
    assert moved == Frontier({"tx/0": 20}, {"tx/0": 6_000}, 5_500, planned=1, batch=3)
    # A last record stamped earlier (disorder) keeps the progress: the frontier stays, no ticks.
    assert next_frontier(moved, 3, {"tx/0": 30}, {"tx/0": 5_800}, ["tx/0"], lateness_ms=500) is None


def test_a_micro_batch_carries_ticks_only_when_the_frontier_or_its_final_mark_changes() -> None:
    start = Frontier({"tx/0": 3}, {"tx/0": 2_000}, 2_001)
    assert next_frontier(start, 3, {"tx/0": 3}, {}, [], lateness_ms=0) is None
    final = next_frontier(start, 3, {"tx/0": 3}, {}, [], lateness_ms=0, final=True)
    assert final is not None and final.final and final.frontier_ms == 2_001
    assert next_frontier(final, 3, {"tx/0": 3}, {}, [], lateness_ms=0, final=True) is None


def test_an_available_now_runs_first_micro_batch_carries_ticks_after_a_continuous_run() -> None:
    """What a continuous run left waiting gets to a final micro-batch even when nothing new comes."""
    left = Frontier({"tx/0": 3}, {"tx/0": 2_000}, 2_001)
    probe = next_frontier(left, 3, {"tx/0": 3}, {}, [], lateness_ms=0, first_of_run=True)
    assert probe is not None and not probe.final and probe.frontier_ms == 2_001
    assert next_frontier(Frontier(), -1, {}, {}, [], lateness_ms=0, first_of_run=True) is None, (
        "nothing read yet"
    )
    done = Frontier({"tx/0": 3}, {"tx/0": 2_000}, 2_001, final=True)
    assert next_frontier(done, 3, {"tx/0": 3}, {}, [], lateness_ms=0, first_of_run=True, final=True) is None


def test_a_frontier_round_trips_through_its_offset_json() -> None:
    frontier = Frontier({"tx/0": 3, "labels/1": 9}, {"tx/0": 2_000}, 1_999, final=True, planned=7)
    assert Frontier.of_json(json.loads(json.dumps(frontier.as_json()))) == frontier
    assert is_frontier(frontier.as_json()) and not is_frontier({"tx": {"0": 3}})


def offset_log(query: Path, batch: int, *sources: object, timestamp_ms: int = 1_000) -> None:
    folder = query / "offsets"
    folder.mkdir(parents=True, exist_ok=True)
    metadata = {"batchWatermarkMs": 0, "batchTimestampMs": timestamp_ms, "conf": {}}
    lines = ["v1", json.dumps(metadata), *("-" if s is None else json.dumps(s) for s in sources)]
    (folder / str(batch)).write_text("\n".join(lines))


def test_the_offset_log_gives_the_connectors_offsets_and_the_frontier(tmp_path: Path) -> None:
    assert newest_batch(tmp_path) is None
    frontier = Frontier({"tx/0": 3}, {"tx/0": 2_000}, 2_001, final=True)
    offset_log(tmp_path, 0, {"tx": {"0": 3, "1": 5}, "labels": {"0": 1}}, None)
    offset_log(tmp_path, 1, {"tx": {"0": 4, "1": 5}, "labels": {"0": 1}}, frontier.as_json(), timestamp_ms=7)
    (tmp_path / "offsets" / ".1.crc").write_text("")
    assert newest_batch(tmp_path) == 1
    logged = logged_batch(tmp_path, 1, ("tx", "labels"))
    assert logged.kafka == {"tx/0": 4, "tx/1": 5, "labels/0": 1} and logged.timestamp_ms == 7
    position = position_at(tmp_path, 1)
    assert position.offsets == logged.kafka and position.frontier == frontier
    assert position.frontier_ms == 2_001 and position.final and position.topics == {"tx", "labels"}
    assert position_at(tmp_path, 0).frontier is None and position_at(tmp_path, 0).frontier_ms is None


def test_a_progress_report_of_a_final_micro_batch_is_told_by_its_frontier_source() -> None:
    final = json.dumps(Frontier({}, {"tx/0": 1}, 2, final=True).as_json())
    kafka = {"endOffset": json.dumps({"tx": {"0": 3}})}
    assert final_in({"sources": [kafka, {"endOffset": final}]})
    assert not final_in({"sources": [kafka, {"endOffset": json.dumps(Frontier().as_json())}]})
    assert not final_in({"sources": [kafka]}) and not final_in({})


def test_a_tick_split_carries_the_frontier_and_its_final_mark() -> None:
    assert TickSplit(5, True) == TickSplit(5, True) and TickSplit(5, True) != TickSplit(5, False)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"allowed_lateness_ms": -1}, "allowed_lateness_ms must not be negative"),
        ({"max_clock_skew_ms": -5}, "max_clock_skew_ms must not be negative"),
    ],
)
def test_bad_frontier_configs_fail_with_a_clear_message(kwargs: dict[str, int], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        FrontierConfig(KAFKA, ("tx",), "query", ticker=None, **kwargs)  # type: ignore[arg-type]


def test_what_a_run_of_a_range_read_past_its_end_is_read_again_by_the_next_run(tmp_path: Path) -> None:
    """A run ending at offset 50 of tx/0 (and 7 of tx/1) committed batch 3 having read to 80 (the connector
    reads on, the records past the end dropped) and planned batch 4 to 95: the next run cuts both entries
    back to the end, leaves older ones, and forgets the end; a run without end records none."""
    checkpoint = tmp_path / "checkpoint"
    query = checkpoint / "query"
    for batch, (tx0, tx1) in enumerate([(10, 2), (30, 4), (45, 6), (80, 9), (95, 9)]):
        offset_log(query, batch, {"tx": {"0": tx0, "1": tx1}}, Frontier({}, {}, batch).as_json())
        (query / "offsets" / f".{batch}.crc").write_text("")
        if batch <= 3:
            (query / "commits").mkdir(parents=True, exist_ok=True)
            (query / "commits" / str(batch)).write_text("v1\n{}")
    record_ending(checkpoint, {"tx/0": 50, "tx/1": 7})
    assert json.loads((checkpoint / ENDING_FILE).read_text()) == {"tx/0": 50, "tx/1": 7}

    record_ending(checkpoint, None)

    assert not (checkpoint / ENDING_FILE).exists()
    assert [position_at(query, batch).offsets for batch in range(5)] == [
        {"tx/0": 10, "tx/1": 2},
        {"tx/0": 30, "tx/1": 4},
        {"tx/0": 45, "tx/1": 6},
        {"tx/0": 50, "tx/1": 7},
        {"tx/0": 50, "tx/1": 7},
    ]
    assert position_at(query, 4).frontier == Frontier({}, {}, 4), "the frontier's line is left as it was"
    assert (query / "offsets" / ".2.crc").exists() and not (query / "offsets" / ".3.crc").exists()
    settle_ending(checkpoint)  # nothing recorded: nothing to do
