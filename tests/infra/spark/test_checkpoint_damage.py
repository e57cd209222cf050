"""A damaged checkpoint is found before Spark starts, naming the file (pure logic, files written here in
the shapes Spark writes them)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from contracts.errors import StateError
from infra.spark.checkpoint import DamagedCheckpointError, check_intact
from tests.support.checkpoints import a_zip, lz4_stream


def checkpoint(tmp_path: Path, batches: int = 3, committed: int = 3) -> Path:
    """A checkpoint of a stateful query with ``batches`` offsets entries, the first ``committed`` committed,
    one state partition with a snapshot at version 2 and changelogs of every version."""
    query = tmp_path / "cp" / "query"
    for folder in ("offsets", "commits", "state/0/0"):
        (query / folder).mkdir(parents=True)
    for batch in range(batches):
        (query / "offsets" / str(batch)).write_text(
            f'v1\n{{"batchWatermarkMs":0}}\n{{"offsets":{{"t/0":{batch}}}}}'
        )
    for batch in range(committed):
        (query / "commits" / str(batch)).write_text('v1\n{"nextBatchWatermarkMs":0}')
    store = query / "state" / "0" / "0"
    for version in range(1, batches + 1):
        (store / f"{version}.changelog").write_bytes(lz4_stream(b"put", json.dumps(version).encode()))
    (store / "2.zip").write_bytes(a_zip(metadata="{}"))
    return tmp_path / "cp"


def test_a_whole_checkpoint_and_a_new_one_pass(tmp_path: Path) -> None:
    check_intact(checkpoint(tmp_path))
    check_intact(tmp_path / "new")
    check_intact(checkpoint(tmp_path / "in-flight", batches=4, committed=3))  # a batch cut off: re-run


def test_the_newest_offsets_file_deleted_is_named_with_what_to_do(tmp_path: Path) -> None:
    cp = checkpoint(tmp_path)
    (cp / "query" / "offsets" / "2").unlink()
    with pytest.raises(DamagedCheckpointError) as damaged:
        check_intact(cp)
    text = str(damaged.value)
    assert "query/offsets/2 is missing: micro-batch 2 was committed" in text
    assert "restore a savepoint" in text and "start over in a new checkpoint" in text
    assert isinstance(damaged.value, StateError) and damaged.value.exit_code == 5


def test_a_gap_in_a_log_and_a_cut_entry_are_named(tmp_path: Path) -> None:
    cp = checkpoint(tmp_path, batches=5, committed=5)
    (cp / "query" / "commits" / "2").unlink()
    with pytest.raises(DamagedCheckpointError, match=r"query/commits/2 is missing"):
        check_intact(cp)
    cp = checkpoint(tmp_path / "cut")
    (cp / "query" / "offsets" / "2").write_text('v1\n{"batchWatermarkMs":0}\n{"offs')
    with pytest.raises(DamagedCheckpointError, match=r"query/offsets/2 is cut short or unreadable"):
        check_intact(cp)


def test_a_truncated_or_missing_changelog_and_a_cut_snapshot_are_named(tmp_path: Path) -> None:
    cp = checkpoint(tmp_path)
    changelog = cp / "query" / "state" / "0" / "0" / "3.changelog"
    changelog.write_bytes(changelog.read_bytes()[:-10])
    with pytest.raises(DamagedCheckpointError, match=r"query/state/0/0/3.changelog is cut short"):
        check_intact(cp)
    changelog.unlink()
    with pytest.raises(DamagedCheckpointError, match=r"query/state/0/0/3.changelog is missing"):
        check_intact(cp)
    cp = checkpoint(tmp_path / "snapshot")
    snapshot = cp / "query" / "state" / "0" / "0" / "2.zip"
    snapshot.write_bytes(snapshot.read_bytes()[:20])
    with pytest.raises(DamagedCheckpointError, match=r"query/state/0/0/2.zip is cut short or unreadable"):
        check_intact(cp)


def test_files_older_than_the_snapshot_and_newer_than_the_commit_are_not_needed(tmp_path: Path) -> None:
    cp = checkpoint(tmp_path, batches=4, committed=3)
    store = cp / "query" / "state" / "0" / "0"
    (store / "1.changelog").write_bytes(b"LZ4Block")  # before the snapshot: Spark does not read it
    (store / "4.changelog").write_bytes(b"")  # a batch in flight: written again by its re-run
    check_intact(cp)
