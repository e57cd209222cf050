"""The one layout this version reads: state kept in an earlier one, a checkpoint's or a savepoint's, is
refused in one line that says how to move it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from contracts.settings import Topics
from features.definitions import DEFAULT_PARAMS
from features.entries import Layout
from features.entry_store import LAST_READER_OF_EARLIER_LAYOUTS, EarlierLayoutError
from features.job import FeatureJobConfig, prepare_checkpoint
from features.state_layout import check_current
from infra.redis.connection import RedisTarget
from infra.spark.checkpoint import LAYOUT_FILE

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
    config = FeatureJobConfig(
        kafka_config={},
        topics=Topics(),
        checkpoint=tmp_path,
        redis=RedisTarget("redis://127.0.0.1:1", "", 60),
        params=DEFAULT_PARAMS,
        max_event_bytes=16_384,
    )
    (tmp_path / LAYOUT_FILE).write_text(json.dumps(EARLIER["pages stored as bytes"]))
    with pytest.raises(EarlierLayoutError) as refused:
        prepare_checkpoint(config)
    assert str(refused.value) == refusal(f"checkpoint {tmp_path}")
    (tmp_path / LAYOUT_FILE).unlink()
    (tmp_path / "query").mkdir()
    with pytest.raises(EarlierLayoutError, match="earlier layout"):
        prepare_checkpoint(config)  # a checkpoint of a version that recorded no layout
    (tmp_path / "query").rmdir()
    prepare_checkpoint(config)  # an empty checkpoint takes this version's layout
    assert json.loads((tmp_path / LAYOUT_FILE).read_text()) == config.layout.as_record()
