from infra.spark_source import NO_FRONTIER, _frontier, _share


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
    chosen = _share(begin, available, budget=100)
    assert chosen == {"a/0": 10 + 75, "a/1": 25, "a/2": 5}
    assert sum(chosen[k] - begin[k] for k in begin) <= 100
    assert _share({"a/0": 0, "a/1": 0}, {"a/0": 1000, "a/1": 1}, budget=10) == {"a/0": 9, "a/1": 1}
