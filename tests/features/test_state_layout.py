"""What a checkpoint records of its state, bound once per start: the one layout this version reads (state
kept in an earlier one, a checkpoint's or a savepoint's, is refused in one line that says how to move it),
its bucket and slot counts kept for its life, the page size taken anew, the feature specs it serves."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from features.compat import SPECS_FILE, FeatureSpecsError, check_specs, read_specs, spec_record
from features.definitions import DAY_MS, DEFAULT_PARAMS, FeatureParams
from features.entries import Layout
from features.entry_store import LAST_READER_OF_EARLIER_LAYOUTS, EarlierLayoutError
from features.state_layout import (
    LAYOUT_FILE,
    CheckpointLayoutError,
    StateRecord,
    StateSpec,
    bind,
    check_current,
    layout_changes,
    recorded,
)

#: The layouts of earlier versions, as their checkpoints recorded them.
EARLIER = {
    "one value per bucket": {"card_buckets": 6, "terminal_buckets": 6},
    "an entry per slot": {
        "card_buckets": 6,
        "terminal_buckets": 6,
        "card_slots": 16384,
        "terminal_slots": 16384,
    },
    "pages stored as bytes": {
        "card_buckets": 6,
        "terminal_buckets": 6,
        "card_slots": 65536,
        "terminal_slots": 65536,
        "page_bytes": 32768,
    },
    "another entry format": {**Layout().as_record(), "entry_format": 1},
}
SPEC = StateSpec(Layout(), DEFAULT_PARAMS)


def refusal(where: str) -> str:
    return (
        f"{where} keeps its state in an earlier layout than this version's (entry_format 2): take a savepoint "
        f"with kappa-fraud at commit {LAST_READER_OF_EARLIER_LAYOUTS} (the last version that reads both "
        "layouts: `fraud savepoint create features`, then `fraud features run --from-savepoint PATH "
        "--checkpoint NEW` there), or replay into a new checkpoint with `--from TIME`"
    )


@pytest.mark.parametrize("kept_as", list(EARLIER))
def test_an_earlier_layout_is_refused_in_one_line_with_the_way_to_move_it(kept_as: str) -> None:
    with pytest.raises(EarlierLayoutError) as refused:
        check_current(EARLIER[kept_as], "savepoint /s")
    assert str(refused.value) == refusal("savepoint /s")
    assert "\n" not in str(refused.value)


def test_this_versions_layout_passes_whatever_its_counts() -> None:
    check_current(Layout().as_record(), "here")
    check_current(Layout(card_buckets=12, terminal_slots=8).as_record(), "here")


def test_a_checkpoint_of_an_earlier_layout_is_refused_and_a_new_one_takes_this_versions(
    tmp_path: Path,
) -> None:
    (tmp_path / LAYOUT_FILE).write_text(json.dumps(EARLIER["pages stored as bytes"]))
    with pytest.raises(EarlierLayoutError) as refused:
        bind(tmp_path, SPEC)
    assert str(refused.value) == refusal(f"checkpoint {tmp_path}")
    (tmp_path / LAYOUT_FILE).unlink()
    (tmp_path / "query").mkdir()
    with pytest.raises(EarlierLayoutError, match="earlier layout"):
        bind(tmp_path, SPEC)  # a checkpoint of a version that recorded no layout
    (tmp_path / "query").rmdir()
    assert recorded(tmp_path) is None
    assert bind(tmp_path, SPEC) == []  # an empty checkpoint takes this version's layout
    assert recorded(tmp_path) == StateRecord(Layout().as_record(), spec_record(DEFAULT_PARAMS))


def test_a_checkpoint_keeps_its_counts_and_takes_a_new_page_size(tmp_path: Path) -> None:
    bind(tmp_path, SPEC)
    (tmp_path / "query").mkdir()
    bind(tmp_path, SPEC)
    with pytest.raises(
        CheckpointLayoutError, match=r"'card_buckets': 6.*'card_buckets': 8.*rescale it through a savepoint"
    ):
        bind(tmp_path, StateSpec(Layout(card_buckets=8), DEFAULT_PARAMS))
    with pytest.raises(CheckpointLayoutError, match="card_slots"):
        bind(tmp_path, StateSpec(Layout(card_slots=1024), DEFAULT_PARAMS))
    bind(tmp_path, StateSpec(Layout(page_bytes=8_192), DEFAULT_PARAMS))
    assert json.loads((tmp_path / LAYOUT_FILE).read_text())["page_bytes"] == 8_192
    assert layout_changes(Layout().as_record(), Layout(card_buckets=12, page_bytes=1)) == [
        "card_buckets 6 -> 12"
    ]


def test_a_checkpoint_records_the_specs_of_each_job_that_takes_its_state_over(tmp_path: Path) -> None:
    assert bind(tmp_path, SPEC) == []
    assert (
        json.loads((tmp_path / SPECS_FILE).read_text()) == read_specs(tmp_path) == spec_record(DEFAULT_PARAMS)
    )
    late = FeatureParams(allowed_lateness_ms=5)
    assert bind(tmp_path, StateSpec(Layout(), late)) == []  # lateness is not in the specs ...
    assert read_specs(tmp_path) == spec_record(late)  # ... but in the parameters recorded
    with pytest.raises(FeatureSpecsError, match=r"checkpoint .* other features \(changed windows: terminal"):
        bind(tmp_path, StateSpec(Layout(), FeatureParams(label_delay_ms=10 * DAY_MS)))
    assert read_specs(tmp_path) == spec_record(late)
    shorter = FeatureParams(window_days=(1, 7))
    assert bind(tmp_path, StateSpec(Layout(), shorter)) == check_specs(
        spec_record(DEFAULT_PARAMS), shorter, "here"
    )
    assert read_specs(tmp_path) == spec_record(shorter), "the state is kept for the new features from now on"
    with pytest.raises(FeatureSpecsError, match="the card features look back 30 d, the state keeps 7 d"):
        bind(tmp_path, SPEC)
