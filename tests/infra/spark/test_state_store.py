"""Reading a query checkpoint's files without Spark: the last committed batch, its source offsets, and
the view through which a moved copy's state is read."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from infra.spark.state_store import (
    CheckpointNotFoundError,
    committed_batch,
    moved_schema_files,
    relocated_view,
)


def offsets_entry(frontier: int) -> str:
    return f'v1\n{{"batchWatermarkMs":0}}\n{{"offsets": {{"tx/0": 5}}, "frontier": {frontier}}}\n'


def a_query(root: Path, offsets: int, commits: int) -> Path:
    """A query checkpoint with ``offsets`` batches planned and the first ``commits`` committed, plus the
    checksum and temporary files Spark leaves beside them."""
    query = root / "query"
    (query / "offsets").mkdir(parents=True)
    (query / "commits").mkdir()
    for batch in range(offsets):
        (query / "offsets" / str(batch)).write_text(offsets_entry(100 + batch))
        (query / "offsets" / f".{batch}.crc").write_bytes(b"crc")
    for batch in range(commits):
        (query / "commits" / str(batch)).write_text('v1\n{"nextBatchWatermarkMs":0}\n')
    (query / "commits" / f".{commits}.0b1c.tmp").write_text("being written")
    return query


def test_the_last_committed_batch_never_the_one_in_flight(tmp_path: Path) -> None:
    query = a_query(tmp_path, offsets=12, commits=11)

    batch = committed_batch(query)

    assert batch.batch_id == 10  # batch 11 is planned, not committed
    assert batch.source_offsets == ({"offsets": {"tx/0": 5}, "frontier": 110},)


def test_no_checkpoint_and_nothing_committed_are_told_apart(tmp_path: Path) -> None:
    with pytest.raises(CheckpointNotFoundError, match="no checkpoint at"):
        committed_batch(tmp_path / "nowhere" / "query")
    with pytest.raises(CheckpointNotFoundError, match="nothing committed yet"):
        committed_batch(a_query(tmp_path, offsets=1, commits=0))


def operator_metadata(schema_uri: str) -> str:
    info = {
        "operatorInfo": {"operatorId": 1, "operatorName": "transformWithStateInPandasExec"},
        "stateStoreInfo": [
            {"storeName": "default", "numPartitions": 2, "stateSchemaFilePaths": [schema_uri]}
        ],
        "operatorPropertiesJson": "{}",
    }
    return "v2\n" + json.dumps(info)


def a_stateful_query(root: Path, recorded_root: Path) -> Path:
    """A query with one operator whose metadata names its schema file under ``recorded_root``."""
    query = a_query(root, offsets=2, commits=2)
    operator = query / "state" / "1"
    schema = operator / "_stateSchema" / "default" / "0_abc"
    schema.parent.mkdir(parents=True)
    schema.write_text("schema")
    (operator / "0").mkdir()
    (operator / "0" / "2.changelog").write_bytes(b"changes")
    metadata = operator / "_metadata" / "v2"
    metadata.mkdir(parents=True)
    recorded = recorded_root / "query" / "state" / "1" / "_stateSchema" / "default" / "0_abc"
    (metadata / "0").write_text(operator_metadata(recorded.as_uri()))
    (metadata / ".0.crc").write_bytes(b"crc of the original")
    return query


def test_a_checkpoint_in_place_is_read_as_it_is(tmp_path: Path) -> None:
    assert not moved_schema_files(a_stateful_query(tmp_path, tmp_path))


def test_a_moved_copy_is_read_through_a_view_that_names_its_own_schema_files(tmp_path: Path) -> None:
    query = a_stateful_query(tmp_path / "copy", tmp_path / "original")
    assert moved_schema_files(query)
    view = tmp_path / "view"
    view.mkdir()

    relocated_view(query, view)

    assert (view / "offsets").resolve() == (query / "offsets").resolve()
    assert (view / "state" / "1" / "0" / "2.changelog").read_bytes() == b"changes"
    version, _, body = (view / "state" / "1" / "_metadata" / "v2" / "0").read_text().partition("\n")
    (schema_uri,) = json.loads(body)["stateStoreInfo"][0]["stateSchemaFilePaths"]
    assert version == "v2"
    assert schema_uri == f"file:{(query / 'state' / '1' / '_stateSchema' / 'default' / '0_abc').resolve()}"
    assert not (view / "state" / "1" / "_metadata" / "v2" / ".0.crc").exists()
    assert (query / "state" / "1" / "_metadata" / "v2" / "0").read_text() == operator_metadata(
        (tmp_path / "original" / "query" / "state" / "1" / "_stateSchema" / "default" / "0_abc").as_uri()
    ), "the copy itself was changed"
