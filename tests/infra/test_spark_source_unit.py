from array import array

import pytest
from infra.kafka_source.config import KafkaSourceConfig, at_time
from infra.kafka_source.datasource import KafkaStreamReader
from infra.kafka_source.offsets import NO_FRONTIER
from infra.kafka_source.planner import (
    Tail,
    _frontier,
    end_offset,
    frontier_moves,
    release_without_records,
    share,
)
from infra.kafka_source.splits import Split, SplitGroup, group_splits

from contracts.errors import ConfigError

KAFKA = {"bootstrap.servers": "127.0.0.1:9092"}


def reader(*topics: str, read_tasks: int | None = None) -> KafkaStreamReader:
    return KafkaStreamReader(KafkaSourceConfig(KAFKA, topics, read_tasks=read_tasks))


def test_frontier_is_the_slowest_partition_that_still_has_records() -> None:
    progress = {"tx/0": 1_000, "tx/1": 700, "labels/0": 5_000}
    assert _frontier(progress, lagging=["tx/0", "tx/1"], lateness_ms=0) == 700
    assert _frontier(progress, lagging=["tx/0"], lateness_ms=100) == 900


def test_frontier_passes_everything_once_all_partitions_are_read() -> None:
    progress = {"tx/0": 1_000, "tx/1": 700}
    assert _frontier(progress, lagging=[], lateness_ms=0) == 1_001
    assert _frontier(progress, lagging=[], lateness_ms=50) == 951
    assert _frontier({}, lagging=[], lateness_ms=0) == NO_FRONTIER


def test_a_partition_never_read_holds_the_frontier_back() -> None:
    assert _frontier({"tx/0": 1_000}, lagging=["tx/1"], lateness_ms=0) == NO_FRONTIER


def test_admission_shares_the_budget_by_backlog() -> None:
    begin = {"a/0": 10, "a/1": 0, "a/2": 5}
    available = {"a/0": 300, "a/1": 100, "a/2": 0}
    chosen = share(begin, available, budget=100)
    assert chosen == {"a/0": 10 + 75, "a/1": 25, "a/2": 5}
    assert sum(chosen[k] - begin[k] for k in begin) <= 100
    assert share({"a/0": 0, "a/1": 0}, {"a/0": 1000, "a/1": 1}, budget=10) == {"a/0": 9, "a/1": 1}


def test_the_last_batch_of_an_available_now_run_is_final() -> None:
    """Records at 1000, 3000, 2000 in one partition, lateness 1500: the last one read (2000) sets the
    frontier, 2001, below the newest record: only the final mark tells the job to release it too."""
    start = {"offsets": {"tx/0": 0}, "progress": {}, "frontier": NO_FRONTIER, "read": 0}
    ends = {"tx/0": 3}
    final = end_offset(start, {"tx/0": 0}, ends, [], {"tx/0": 2_000}, 1_500, available_now=True)
    assert final == {
        "offsets": {"tx/0": 3},
        "progress": {"tx/0": 2_000},
        "frontier": 2_001,
        "read": 3,
        "final": True,
    }
    continuous = end_offset(start, {"tx/0": 0}, ends, [], {"tx/0": 2_000}, 1_500, available_now=False)
    assert (continuous["frontier"], continuous["final"]) == (501, False)


def test_an_available_now_batch_that_leaves_records_behind_is_not_final() -> None:
    start = {"offsets": {"tx/0": 0, "tx/1": 10}, "progress": {"tx/1": 900}, "frontier": 100, "read": 10}
    begin = dict(start["offsets"])
    chosen = {"tx/0": 30, "tx/1": 20}  # admission control: tx/0 has 20 more records
    offset = end_offset(start, begin, chosen, ["tx/0"], {"tx/0": 700, "tx/1": 1_000}, 50, available_now=True)
    assert offset == {
        "offsets": chosen,
        "progress": {"tx/0": 700, "tx/1": 1_000},
        "frontier": 650,  # tx/0 still has records: its progress - lateness
        "read": 10 + 30 + 10,
        "final": False,
    }
    behind = end_offset({**start, "frontier": 800}, begin, chosen, ["tx/0"], {"tx/0": 700}, 50, True)
    assert behind["frontier"] == 800, "the frontier never moves back"


def test_offsets_from_before_the_final_mark_read_as_not_final() -> None:
    old = {"offsets": {"tx/0": 5}, "progress": {"tx/0": 1_000}, "frontier": 1_001, "read": 5}
    splits = reader("tx").partitions({"offsets": {"tx/0": 0}}, old)
    assert splits == [SplitGroup((Split("tx", 0, 0, 5, 1_001, heartbeat=True, final=False),))]
    assert release_without_records(old, available_now=True, heartbeats=True)


def test_splits_carry_the_final_mark() -> None:
    end = {"offsets": {"tx/0": 5, "tx/1": 7}, "progress": {}, "frontier": 9, "read": 12, "final": True}
    splits = reader("tx").splits({"offsets": {"tx/0": 5, "tx/1": 0}}, end)
    assert splits == [
        Split("tx", 0, 5, 5, 9, heartbeat=True, final=True),
        Split("tx", 1, 0, 7, 9, heartbeat=False, final=True),
    ]


def test_a_query_with_an_initial_position_starts_exactly_there() -> None:
    """Where another query's micro-batch left the source (a savepoint's end offset), whole: no Kafka asked."""
    end = {
        "offsets": {"tx/0": 5},
        "progress": {"tx/0": 7},
        "frontier": 8,
        "read": 5,
        "final": True,
        "clock": 3,
    }
    config = KafkaSourceConfig(KAFKA, ("tx",), starting_offsets="latest", initial_position=end)
    assert KafkaStreamReader(config).initialOffset() == end


def test_read_tasks_group_the_splits_the_same_way_in_every_micro_batch() -> None:
    offsets = {f"{topic}/{p}": 10 for topic in ("labels", "tx") for p in range(4)}
    end = {"offsets": offsets, "progress": {}, "frontier": 9, "read": 0}
    two = reader("tx", "labels", read_tasks=2)
    groups = two.partitions({"offsets": dict.fromkeys(offsets, 0)}, end)
    assert [[f"{s.topic}/{s.partition}" for s in g.splits] for g in groups] == [
        ["labels/0", "labels/2", "tx/0", "tx/2"],
        ["labels/1", "labels/3", "tx/1", "tx/3"],
    ]
    assert [s.heartbeat for g in groups for s in g.splits] == [True] + [False] * 7
    one_each = reader("tx").partitions({"offsets": {}}, end)
    assert [len(g.splits) for g in one_each] == [1] * 8
    assert len(group_splits(two.splits({"offsets": {}}, end)[:1], 4)) == 1


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"read_tasks": 0}, "read_tasks must be at least 1"),
        ({"max_records_per_trigger": 0}, "max_records_per_trigger"),
        ({"starting_offsets": "first"}, "starting_offsets 'first'"),
        ({"ending_offsets": "earliest"}, "ending_offsets 'earliest'"),
        ({"allowed_lateness_ms": -1}, "allowed_lateness_ms"),
        ({"initial_position": {"offsets": {}}}, "initial_position must be an end offset"),
    ],
)
def test_bad_source_configs_fail_with_a_clear_message(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        KafkaSourceConfig(KAFKA, ("tx",), **kwargs)  # type: ignore[arg-type]
    assert KafkaSourceConfig(KAFKA, ("tx",), starting_offsets=at_time(1_522_540_800_000)).schema.startswith(
        "topic string"
    )


def test_an_available_now_run_with_nothing_new_releases_what_a_continuous_run_left() -> None:
    """Nothing new to read: a final micro-batch without records only when records were read before, the
    batch that read the last of them was not final, the run is availableNow and the job has heartbeats."""
    read = {"offsets": {"tx/0": 5}, "progress": {"tx/0": 1_000}, "frontier": 500, "read": 5, "final": False}
    assert release_without_records(read, available_now=True, heartbeats=True)
    assert not release_without_records({**read, "final": True}, available_now=True, heartbeats=True)
    assert not release_without_records(read, available_now=False, heartbeats=True)
    assert not release_without_records(read, available_now=True, heartbeats=False)
    assert not release_without_records({**read, "progress": {}}, available_now=True, heartbeats=True)
    begin = read["offsets"]
    final = end_offset(read, begin, begin, [], {}, 300, available_now=True)
    assert final == {**read, "frontier": 1_001, "final": True}


def test_a_continuous_run_releases_what_it_holds_once_the_lagging_partitions_are_read_to_their_end() -> None:
    """The last batch was planned while tx/1 still had records coming: its frontier stayed at tx/1's
    progress. Nothing new since, and tx/1 is read to its end: a batch without records moves the frontier."""
    held = {"offsets": {"tx/0": 5, "tx/1": 3}, "progress": {"tx/0": 1_000, "tx/1": 700}, "frontier": 700}
    assert frontier_moves(held, lagging=set(), lateness_ms=0)
    assert not frontier_moves(held, lagging={"tx/1"}, lateness_ms=0)  # still coming: it waits
    assert not frontier_moves({**held, "frontier": 1_001}, lagging=set(), lateness_ms=0)  # released already
    assert not frontier_moves({**held, "progress": {}}, lagging=set(), lateness_ms=0)  # nothing read yet
    begin = held["offsets"]
    assert end_offset(held, begin, begin, [], {}, 0, available_now=False)["frontier"] == 1_001


def test_records_stamped_too_far_ahead_of_the_planners_clock_move_no_progress() -> None:
    """A record dated in 2099 (another producer, no ingest checks) would set its partition's progress, hence
    the frontier, to 2099: every later event of its cards would be late. The planner skips it for progress
    and keeps its clock in the end offset; the splits carry that clock to the decoder."""
    tail = Tail(consumer=None)  # type: ignore[arg-type]  # only its bookkeeping is used
    tail._offsets["tx/0"] = array("q", [0, 1, 2])
    tail._stamps["tx/0"] = array("q", [1_000, 4_070_908_800_000, 2_000])
    assert tail.stamp_before("tx/0", 3) == 2_000
    assert tail.stamp_before("tx/0", 2) == 4_070_908_800_000
    assert tail.stamp_before("tx/0", 2, newest_ms=10_000) == 1_000
    assert tail.stamp_before("tx/0", 1, newest_ms=500) is None

    start = {"offsets": {"tx/0": 0}, "progress": {}, "frontier": NO_FRONTIER, "read": 0}
    end = end_offset(start, {"tx/0": 0}, {"tx/0": 2}, [], {"tx/0": 1_000}, 0, False, clock_ms=9_000)
    assert end["clock"] == 9_000 and end["frontier"] == 1_001
    (split,) = reader("tx").splits(start, end)
    assert split.clock_ms == 9_000
    assert reader("tx").splits(start, {**end, "clock": None})[0].clock_ms is None
