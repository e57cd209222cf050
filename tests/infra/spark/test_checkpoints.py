"""A checkpoint stays bound to the layout (bucket counts) its state was written with."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from infra.spark.checkpoints import (
    LAYOUT_FILE,
    CheckpointLayoutError,
    bind_layout,
    per_batch_until,
    pinned_layout,
)

LAYOUT = {"card_buckets": 6, "terminal_buckets": 6}
OLD = {"card_buckets": 16, "terminal_buckets": 16}


def test_a_new_checkpoint_records_its_layout_and_accepts_it_again(tmp_path: Path) -> None:
    checkpoint = tmp_path / "features"
    bind_layout(checkpoint, LAYOUT, made_before_layouts=OLD)
    assert (checkpoint / LAYOUT_FILE).exists()
    (checkpoint / "query").mkdir()
    bind_layout(checkpoint, dict(LAYOUT), made_before_layouts=OLD)


def test_another_layout_is_refused_with_what_the_checkpoint_holds(tmp_path: Path) -> None:
    bind_layout(tmp_path, LAYOUT)
    with pytest.raises(
        CheckpointLayoutError, match=r"card_buckets': 6.*card_buckets': 8.*through a savepoint"
    ):
        bind_layout(tmp_path, {"card_buckets": 8, "terminal_buckets": 6})


def test_a_tunable_value_may_change_and_is_recorded(tmp_path: Path) -> None:
    paged = {**LAYOUT, "page_bytes": 32_768}
    bind_layout(tmp_path, paged, tunable=("page_bytes",))
    (tmp_path / "query").mkdir()
    bind_layout(tmp_path, {**LAYOUT, "page_bytes": 8_192}, tunable=("page_bytes",))
    assert json.loads((tmp_path / LAYOUT_FILE).read_text())["page_bytes"] == 8_192
    with pytest.raises(CheckpointLayoutError, match="page_bytes"):
        bind_layout(tmp_path, paged)  # not tunable for this caller
    with pytest.raises(CheckpointLayoutError, match="through a savepoint"):
        bind_layout(tmp_path, LAYOUT, tunable=("page_bytes",))  # a layout without it is another kind


def test_a_checkpoint_from_before_layouts_has_the_old_layout(tmp_path: Path) -> None:
    (tmp_path / "query").mkdir()
    with pytest.raises(CheckpointLayoutError, match="16"):
        bind_layout(tmp_path, LAYOUT, made_before_layouts=OLD)
    assert not (tmp_path / LAYOUT_FILE).exists()
    bind_layout(tmp_path, OLD, made_before_layouts=OLD)
    bind_layout(tmp_path, OLD)  # recorded now
    with pytest.raises(CheckpointLayoutError, match="not written by this job"):
        other = tmp_path / "other"
        (other / "offsets").mkdir(parents=True)
        bind_layout(other, LAYOUT)


def test_a_pinned_layout_is_the_first_runs_whatever_a_restart_asks_for(tmp_path: Path) -> None:
    checkpoint = tmp_path / "scoring"
    assert pinned_layout(checkpoint, {"read_tasks": 2}) == {"read_tasks": 2}
    assert pinned_layout(checkpoint, {"read_tasks": 8}) == {"read_tasks": 2}, "a restart on 8 cores"
    assert pinned_layout(checkpoint, {"read_tasks": 8, "extra": 1}) == {"read_tasks": 2, "extra": 1}
    assert pinned_layout(checkpoint, {"read_tasks": 1, "extra": 5}) == {"read_tasks": 2, "extra": 1}


def test_per_batch_records_are_recognised_and_trimmed() -> None:
    assert json.loads(per_batch_until('{"3": 1, "4": 2, "5": 2}', 4) or "") == {"3": 1, "4": 2}
    for other in ('{"read_tasks": 2}', "{}", "[1, 2]", "not json", '{"1": 1, "x": 2}'):
        assert per_batch_until(other, 4) is None
