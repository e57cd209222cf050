"""The frontier source's rules, without Spark or Kafka: the frontier of what was read, when a micro-batch
carries ticks, the query offset log it reads the connector's offsets from, and the source's planning as
Spark drives it (its offset, then the offset log, then its partitions) over records kept in memory."""

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from contracts.errors import ConfigError, StateError
from infra.kafka.offsets import NO_FRONTIER
from infra.spark.checkpoint import newest_batch
from infra.spark.frontier import (
    FrontierConfig,
    FrontierReader,
    TickSplit,
    final_in,
    frontier_of,
    lagging_of,
    next_frontier,
    plans_a_batch,
)
from infra.spark.offset_log import (
    ENDING_FILE,
    FRONTIER_FILE,
    FRONTIERS_KEPT,
    Frontier,
    FrontierPlan,
    connector_offsets,
    frontier_after,
    frontier_ms_at,
    is_frontier,
    is_plan,
    logged_batch,
    planned_frontiers,
    position_at,
    record_ending,
    record_frontier,
    settle_ending,
)

KAFKA = {"bootstrap.servers": "127.0.0.1:9092"}


def test_frontier_is_the_slowest_partition_that_still_has_records() -> None:
    progress = {"tx/0": 1_000, "tx/1": 700, "labels/0": 5_000}
    assert frontier_of(progress, lagging=["tx/0", "tx/1"], allowed_lateness_ms=0) == 700
    assert frontier_of(progress, lagging=["tx/0"], allowed_lateness_ms=100) == 900


def test_frontier_passes_everything_once_all_partitions_are_read() -> None:
    progress = {"tx/0": 1_000, "tx/1": 700}
    assert frontier_of(progress, lagging=[], allowed_lateness_ms=0) == 1_001
    assert frontier_of(progress, lagging=[], allowed_lateness_ms=50) == 951
    assert frontier_of({}, lagging=[], allowed_lateness_ms=0) == NO_FRONTIER


def test_a_partition_never_read_holds_the_frontier_back() -> None:
    assert frontier_of({"tx/0": 1_000}, lagging=["tx/1"], allowed_lateness_ms=0) == NO_FRONTIER


def test_a_frontier_moves_with_the_last_records_read_and_never_back() -> None:
    start = Frontier({"tx/0": 10}, {"tx/0": 5_000}, 4_000)
    moved = next_frontier(start, 3, {"tx/0": 20}, {"tx/0": 6_000}, ["tx/0"], allowed_lateness_ms=500)
    assert moved == Frontier({"tx/0": 20}, {"tx/0": 6_000}, 5_500, planned=1, batch=3)
    # A last record stamped earlier (disorder) keeps the progress: the frontier stays, no ticks.
    assert next_frontier(moved, 3, {"tx/0": 30}, {"tx/0": 5_800}, ["tx/0"], allowed_lateness_ms=500) is None


def test_a_micro_batch_carries_ticks_only_when_the_frontier_or_its_final_mark_changes() -> None:
    start = Frontier({"tx/0": 3}, {"tx/0": 2_000}, 2_001)
    assert next_frontier(start, 3, {"tx/0": 3}, {}, [], allowed_lateness_ms=0) is None
    final = next_frontier(start, 3, {"tx/0": 3}, {}, [], allowed_lateness_ms=0, final=True)
    assert final is not None and final.final and final.frontier_ms == 2_001
    assert next_frontier(final, 3, {"tx/0": 3}, {}, [], allowed_lateness_ms=0, final=True) is None


def test_a_source_moves_its_offset_when_the_connector_may_read_or_a_run_still_needs_its_final_batch() -> None:
    """Without end, only when a partition holds records past the connector's newest offsets (an idle input
    runs no micro-batch); an availableNow run until its final micro-batch, even with nothing new (what a
    continuous run left waiting is released), but not when it starts from a final frontier and nothing new."""
    assert plans_a_batch(fresh=True, available_now=False, after_final=False, final_planned=False)
    assert not plans_a_batch(fresh=False, available_now=False, after_final=False, final_planned=False)
    assert plans_a_batch(fresh=False, available_now=True, after_final=False, final_planned=False)
    assert plans_a_batch(fresh=True, available_now=True, after_final=True, final_planned=False)
    assert not plans_a_batch(fresh=False, available_now=True, after_final=True, final_planned=False)
    assert not plans_a_batch(fresh=True, available_now=True, after_final=False, final_planned=True)


def test_the_partitions_left_short_of_their_end_hold_records() -> None:
    stable = FrontierPlan(batch=3, stable={"tx/0": 10, "tx/1": 7, "tx/2": 0})
    assert lagging_of({"tx/0": 10, "tx/1": 5}, stable) == ["tx/1"]
    assert lagging_of({"tx/0": 12}, stable) == ["tx/1"], "past the snapshot: read to its end"
    ranged = FrontierPlan(batch=3, stable={}, ending={"tx/0": 8})
    assert lagging_of({"tx/0": 5, "tx/1": 9}, ranged) == ["tx/0"] and lagging_of({"tx/0": 8}, ranged) == []


def test_a_frontier_and_a_plan_round_trip_through_their_json() -> None:
    frontier = Frontier({"tx/0": 3, "labels/1": 9}, {"tx/0": 2_000}, 1_999, final=True, planned=7)
    assert Frontier.of_json(json.loads(json.dumps(frontier.as_json()))) == frontier
    plan = FrontierPlan(frontier, 8, {"tx/0": 5}, {"tx/0": 4}, available_now=True)
    assert FrontierPlan.of_json(json.loads(json.dumps(plan.as_json()))) == plan
    assert is_frontier(plan.as_json()) and is_plan(plan.as_json()) and connector_offsets(plan.as_json()) == {}
    assert is_frontier(frontier.as_json()) and not is_plan(frontier.as_json()), "an earlier version's offset"
    assert not is_frontier({"tx": {"0": 3}}) and not is_plan({"tx": {"0": 3}})
    assert not is_frontier({"frontier_ms": {"0": 3}, "progress": {"0": 1}}), "topics named so"


def offset_log(query: Path, batch: int, *sources: object, timestamp_ms: int = 1_000) -> None:
    folder = query / "offsets"
    folder.mkdir(parents=True, exist_ok=True)
    metadata = {"batchWatermarkMs": 0, "batchTimestampMs": timestamp_ms, "conf": {}}
    lines = ["v1", json.dumps(metadata), *("-" if s is None else json.dumps(s) for s in sources)]
    (folder / str(batch)).write_text("\n".join(lines))


def test_the_offset_log_gives_the_connectors_offsets_and_the_frontier(tmp_path: Path) -> None:
    query = tmp_path / "query"
    assert newest_batch(query) is None
    before = Frontier({"tx/0": 3}, {"tx/0": 1_500}, 1_200, planned=1, batch=0)
    frontier = Frontier({"tx/0": 4}, {"tx/0": 2_000}, 2_001, final=True, planned=2, batch=1)
    offset_log(query, 0, {"tx": {"0": 3, "1": 5}, "labels": {"0": 1}}, None)
    plan = FrontierPlan(before, 1, {"tx/0": 4, "tx/1": 5, "labels/0": 1}, available_now=True)
    offset_log(query, 1, {"tx": {"0": 4, "1": 5}, "labels": {"0": 1}}, plan.as_json(), timestamp_ms=7)
    (query / "offsets" / ".1.crc").write_text("")
    assert newest_batch(query) == 1
    logged = logged_batch(query, 1, ("tx", "labels"))
    assert logged.kafka == {"tx/0": 4, "tx/1": 5, "labels/0": 1} and logged.timestamp_ms == 7
    position = position_at(query, 1)
    assert position.offsets == logged.kafka and position.frontier == before, "not kept: the one before it"
    record_frontier(query, 1, frontier)
    assert (tmp_path / FRONTIER_FILE).is_file()
    position = position_at(query, 1)
    assert position.frontier == frontier and frontier_ms_at(query, 1) == 2_001
    assert position.frontier_ms == 2_001 and position.final and position.topics == {"tx", "labels"}
    assert position_at(query, 0).frontier is None and position_at(query, 0).frontier_ms is None
    assert frontier_ms_at(query, 5) is None, "no such batch"


def test_an_earlier_versions_offset_is_its_frontier(tmp_path: Path) -> None:
    """Checkpoints written when the source's offset was the frontier itself read as before."""
    frontier = Frontier({"tx/0": 4}, {"tx/0": 2_000}, 2_001, final=True, planned=2, batch=0)
    offset_log(tmp_path, 1, {"tx": {"0": 4}}, frontier.as_json())
    assert position_at(tmp_path, 1).frontier == frontier
    assert frontier_after(tmp_path, 1, [{"tx": {"0": 4}}, frontier.as_json()]) == frontier


def test_the_frontiers_kept_are_the_newest_and_a_re_run_replaces_the_later_ones(tmp_path: Path) -> None:
    query = tmp_path / "query"
    for batch in range(FRONTIERS_KEPT + 5):
        record_frontier(query, batch, Frontier({}, {}, batch, planned=batch, batch=batch))
    kept = planned_frontiers(query)
    assert sorted(kept) == list(range(5, FRONTIERS_KEPT + 5))
    record_frontier(query, 20, Frontier({}, {}, 99, batch=20))
    assert max(planned_frontiers(query)) == 20 and planned_frontiers(query)[20].frontier_ms == 99
    plan = FrontierPlan(Frontier({}, {}, 7, batch=3), 25).as_json()
    assert frontier_after(query, 25, [plan]) == Frontier({}, {}, 99, batch=20), "the newest at or before"
    assert frontier_after(query, 2, [plan]) == Frontier({}, {}, 7, batch=3), "none kept: the one before"


def test_a_progress_report_of_a_final_micro_batch_is_told_by_its_frontier_source(tmp_path: Path) -> None:
    query = tmp_path / "query"
    record_frontier(query, 3, Frontier({}, {"tx/0": 1}, 2, planned=1, batch=3))
    record_frontier(query, 4, Frontier({}, {"tx/0": 1}, 2, final=True, planned=2, batch=4))
    assert final_in(query, {"batchId": 4}) and not final_in(query, {"batchId": 3})
    assert not final_in(query, {"batchId": 5}) and not final_in(query, {})


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


# --- the source as Spark drives it, over records kept in memory -----------------------------------------


class MemoryReader(FrontierReader):
    """The source with its Kafka reads answered from ``records``: each partition's record timestamps, in
    offset order (all committed)."""

    def __init__(self, config: FrontierConfig, records: Mapping[str, list[int]]) -> None:
        super().__init__(config)
        self.records = records

    def stable_offsets(self) -> dict[str, int]:
        return {name: len(stamps) for name, stamps in self.records.items()}

    def _read(self, ranges: Mapping[str, tuple[int, int]]) -> dict[str, list[int]]:
        return {name: list(self.records[name][begin:end]) for name, (begin, end) in ranges.items()}


def memory_reader(query: Path, records: Mapping[str, list[int]], **options: Any) -> MemoryReader:
    config = FrontierConfig(KAFKA, ("tx",), str(query), ticker=None, **options)  # type: ignore[arg-type]
    return MemoryReader(config, records)


def micro_batch(
    reader: FrontierReader, query: Path, start: dict, connector: Mapping[str, int], clock_ms: int = 1_000
) -> tuple[dict, list[TickSplit]] | None:
    """Spark's planning of the next micro-batch: every source's end offset (the connector's is
    ``connector``), the offset log's entry when one moved, then the partitions. None: no micro-batch."""
    end = reader.latestOffset(start, None)  # type: ignore[arg-type]
    newest = newest_batch(query)
    before = logged_batch(query, newest, ("tx",)).kafka if newest is not None else None
    if end == start and before == dict(connector):
        return None
    by_topic: dict[str, dict[str, int]] = {}
    for name, offset in connector.items():
        topic, _, partition = name.rpartition("/")
        by_topic.setdefault(topic, {})[partition] = offset
    offset_log(query, 0 if newest is None else newest + 1, by_topic, end, timestamp_ms=clock_ms)
    return end, [split for split in reader.partitions(start, end) if isinstance(split, TickSplit)]


def test_a_micro_batch_carries_the_frontier_of_the_records_it_reads(tmp_path: Path) -> None:
    """Two partitions, read short of their end and then to it: each micro-batch's ticks carry the frontier
    of what it read itself; an idle input runs no micro-batch."""
    query = tmp_path / "query"
    records = {"tx/0": [1_000, 2_000, 3_000, 4_000], "tx/1": [1_500, 2_500]}
    reader = memory_reader(query, records)
    start = reader.initialOffset()

    first = micro_batch(reader, query, start, {"tx/0": 2, "tx/1": 1})
    assert first is not None and first[1] == [TickSplit(1_500, False)], "the slowest partition left"
    second = micro_batch(reader, query, first[0], {"tx/0": 4, "tx/1": 2})
    assert second is not None and second[1] == [TickSplit(4_001, False)], "past every record read"
    assert micro_batch(reader, query, second[0], {"tx/0": 4, "tx/1": 2}) is None
    assert position_at(query, 0).frontier_ms == 1_500 and position_at(query, 1).frontier_ms == 4_001

    records["tx/0"].append(5_000)
    third = micro_batch(reader, query, second[0], {"tx/0": 4, "tx/1": 2})
    assert third is not None and third[1] == [], "the connector left the new record: F stays, no ticks"
    fourth = micro_batch(reader, query, third[0], {"tx/0": 5, "tx/1": 2})
    assert fourth is not None and fourth[1] == [TickSplit(5_001, False)]


def test_records_a_micro_batch_read_without_the_source_get_a_frontier_in_the_next(tmp_path: Path) -> None:
    """Should the connector read records in a micro-batch this source did not plan (were it asked for its
    end after this source), the next micro-batch plans a frontier for them, new records or not."""
    query = tmp_path / "query"
    records = {"tx/0": [1_000, 2_000]}
    reader = memory_reader(query, records)
    first = micro_batch(reader, query, reader.initialOffset(), {"tx/0": 1})
    assert first is not None and first[1] == [TickSplit(1_000, False)]
    offset_log(query, 1, {"tx": {"0": 2}}, first[0])  # the connector alone moved
    after = micro_batch(reader, query, first[0], {"tx/0": 2})
    assert after is not None and after[1] == [TickSplit(2_001, False)]
    assert micro_batch(reader, query, after[0], {"tx/0": 2}) is None


def test_a_micro_batch_re_run_after_a_crash_computes_the_same_frontier(tmp_path: Path) -> None:
    """A new driver (nothing in memory) re-runs micro-batch 1 after records were written meanwhile, one of
    them stamped behind what it read: its frontier is the first attempt's."""
    query = tmp_path / "query"
    records = {"tx/0": [1_000, 2_000, 3_000], "tx/1": [1_500]}
    reader = memory_reader(query, records, allowed_lateness_ms=100)
    first = micro_batch(reader, query, reader.initialOffset(), {"tx/0": 1, "tx/1": 1})
    assert first is not None
    second = micro_batch(reader, query, first[0], {"tx/0": 3, "tx/1": 1})
    assert second is not None and second[1] == [TickSplit(2_901, False)]
    records["tx/1"].append(1_600)

    again = memory_reader(query, records, allowed_lateness_ms=100)
    assert again.partitions(first[0], second[0]) == second[1]
    assert again.frontier_after(second[0]) == planned_frontiers(query)[1]
    following = again.latestOffset(second[0], None)  # type: ignore[arg-type]
    assert (
        FrontierPlan.of_json(following).after.frontier_ms == 2_901
        and FrontierPlan.of_json(following).batch == 2
    )


def test_an_available_now_run_ends_with_a_final_micro_batch(tmp_path: Path) -> None:
    """The run's micro-batch in which the connector does not move is final, and the run's last; a continuous
    run's waiting events get one too when nothing new comes; a run from a final frontier with nothing new
    runs none."""
    query = tmp_path / "query"
    records = {"tx/0": [1_000, 2_000, 3_000]}
    continuous = memory_reader(query, records, allowed_lateness_ms=500)
    left = micro_batch(continuous, query, continuous.initialOffset(), {"tx/0": 3})
    assert left is not None and left[1] == [TickSplit(2_501, False)]

    run = memory_reader(query, records, allowed_lateness_ms=500)
    run.prepareForTriggerAvailableNow()
    final = micro_batch(run, query, left[0], {"tx/0": 3})
    assert final is not None and final[1] == [TickSplit(2_501, True)]
    assert final_in(query, {"batchId": 1}) and position_at(query, 1).final
    assert micro_batch(run, query, final[0], {"tx/0": 3}) is None

    records["tx/0"].append(4_000)
    reading = memory_reader(query, records, allowed_lateness_ms=500)
    reading.prepareForTriggerAvailableNow()
    read = micro_batch(reading, query, final[0], {"tx/0": 4})
    assert read is not None and read[1] == [TickSplit(3_501, False)], "the connector moved: not final"
    last = micro_batch(reading, query, read[0], {"tx/0": 4})
    assert last is not None and last[1] == [TickSplit(3_501, True)]

    idle = memory_reader(query, records, allowed_lateness_ms=500)
    idle.prepareForTriggerAvailableNow()
    assert micro_batch(idle, query, last[0], {"tx/0": 4}) is None


def test_a_run_of_a_range_is_final_once_every_partition_reached_its_end(tmp_path: Path) -> None:
    query = tmp_path / "query"
    records = {"tx/0": [1_000, 2_000, 3_000, 4_000], "tx/1": [1_500, 2_500]}
    reader = memory_reader(query, records, ending_offsets={"tx/0": 3, "tx/1": 2})
    reader.prepareForTriggerAvailableNow()
    first = micro_batch(reader, query, reader.initialOffset(), {"tx/0": 2, "tx/1": 2})
    assert first is not None and first[1] == [TickSplit(2_000, False)]
    second = micro_batch(reader, query, first[0], {"tx/0": 4, "tx/1": 2})
    assert second is not None and second[1] == [TickSplit(3_001, True)], "the record past the end is not read"


def test_records_stamped_past_the_batch_clock_and_its_skew_move_no_progress(tmp_path: Path) -> None:
    query = tmp_path / "query"
    records = {"tx/0": [1_000, 2_000, 90_000]}
    reader = memory_reader(query, records, max_clock_skew_ms=5_000)
    batch = micro_batch(reader, query, reader.initialOffset(), {"tx/0": 3}, clock_ms=10_000)
    assert batch is not None and batch[1] == [TickSplit(2_001, False)]


def test_partitions_planned_before_the_offset_log_holds_their_batch_fail_loudly(tmp_path: Path) -> None:
    query = tmp_path / "query"
    reader = memory_reader(query, {"tx/0": [1_000]})
    start = reader.initialOffset()
    end = reader.latestOffset(start, None)  # type: ignore[arg-type]
    with pytest.raises(StateError, match=r"offset log .* does not hold micro-batch 0"):
        reader.partitions(start, end)


def test_a_checkpoint_of_the_earlier_version_resumes(tmp_path: Path) -> None:
    """Its newest offset is the frontier itself: a re-run of that batch carries it; the next plan starts
    from it."""
    query = tmp_path / "query"
    old = Frontier({"tx/0": 2}, {"tx/0": 2_000}, 2_001, planned=3, batch=0)
    offset_log(query, 0, {"tx": {"0": 2}}, Frontier().as_json())
    offset_log(query, 1, {"tx": {"0": 2}}, old.as_json())
    reader = memory_reader(query, {"tx/0": [1_000, 2_000, 3_000]})
    assert reader.partitions(Frontier().as_json(), old.as_json()) == [TickSplit(2_001, False)]
    assert planned_frontiers(query)[1] == old
    nxt = micro_batch(reader, query, old.as_json(), {"tx/0": 3})
    assert nxt is not None and FrontierPlan.of_json(nxt[0]).after == old
    assert nxt[1] == [TickSplit(3_001, False)]
