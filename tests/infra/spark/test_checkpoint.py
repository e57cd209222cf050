"""A query's checkpoint on disk: its logs read, the job's records beside it (its layout, pinned and per-batch
values), a copy as its last committed micro-batch left it (which files belong to which batch, what a copy
holds and leaves out, the state it must hold) and a copy restored into a new directory."""

from __future__ import annotations

import json
from pathlib import Path, PurePosixPath

import pytest

from contracts.errors import ConfigError, NotFoundError, StateError
from infra.spark import checkpoint as checkpoint_module
from infra.spark.checkpoint import (
    QUERY_DIR,
    DamagedCheckpointError,
    IncompleteCopyError,
    NothingCommittedError,
    batch_of,
    check_intact,
    copy_committed,
    last_committed,
    missing_state,
    offset_entry,
    per_batch_until,
    pinned_layout,
    read_batch_conf,
    relocated_metadata,
    restore,
)
from infra.spark.offset_log import planned_frontiers
from tests.support.checkpoints import IN_FLIGHT_SCHEMA, SCHEMA, end_offsets, spark_checkpoint

LAYOUT = {"card_buckets": 6, "terminal_buckets": 6}


def test_an_offset_log_entry_with_a_source_that_had_no_offsets(tmp_path: Path) -> None:
    (tmp_path / "offsets").mkdir()
    (tmp_path / "offsets" / "3").write_text(
        'v1\n{"conf": {"spark.sql.shuffle.partitions": 2}}\n-\n{"a": 1}\n'
    )
    entry = offset_entry(tmp_path, 3)
    assert entry.sources == (None, {"a": 1})
    assert read_batch_conf(tmp_path, 3) == {"spark.sql.shuffle.partitions": "2"}
    (tmp_path / "offsets" / "4").write_text("{}")
    with pytest.raises(StateError, match="offset-log"):
        offset_entry(tmp_path, 4)


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


@pytest.mark.parametrize(
    ("path", "batch"),
    [
        ("offsets/7", 7),
        ("offsets/.7.crc", 7),
        ("commits/12", 12),
        ("commits/.12.crc", 12),
        ("state/0/1/8.changelog", 7),  # state version 8 is written by batch 7
        ("state/0/1/.8.changelog.crc", 7),
        ("state/0/1/8.zip", 7),
        ("state/0/1/8_5f2c1a.zip", 7),  # checkpoint format 2
        ("state/1/0/3.delta", 2),  # the HDFS-backed store
        ("state/1/0/3.snapshot", 2),
        ("state/1/0/left-keyToNumValues/3.delta", 2),  # a store of a join
        ("state/0/_metadata/v2/5", 5),
        ("state/0/_metadata/v2/.5.crc", 5),
        (f"state/0/_stateSchema/default/{SCHEMA}", 0),
        (f"state/0/_stateSchema/default/.{IN_FLIGHT_SCHEMA}.crc", 5),
        ("state/0/0/SSTs/000008-7b504904-48d2-4daa-b671-5814d46fb27b.sst", None),
        ("state/0/_metadata/metadata", None),
        ("state/0/0/_metadata/8", None),
        ("metadata", None),
        ("sources/0/0", None),
        ("offsets/notes", None),
    ],
)
def test_each_file_belongs_to_the_batch_that_wrote_it(path: str, batch: int | None) -> None:
    assert batch_of(PurePosixPath(path)) == batch


def files(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()}


def test_a_copy_holds_the_committed_batches_and_nothing_of_the_one_in_flight(tmp_path: Path) -> None:
    checkpoint = spark_checkpoint(tmp_path / "features", committed=4, in_flight=True)
    copied = copy_committed(checkpoint, tmp_path / "copy")
    copy = tmp_path / "copy"
    assert copied.batch == 4 and copied.files == len(files(copy)) and not copied.vanished
    assert copied.bytes == sum(p.stat().st_size for p in copy.rglob("*") if p.is_file())
    left_out = files(checkpoint) - files(copy)
    store = "query/state/{op}/{p}/{name}"
    in_flight = {
        "query/offsets/5",
        "query/offsets/.5.crc",
        *(
            f"query/state/{op}/{name}"
            for op in (0, 1)
            for name in (
                "_metadata/v2/5",
                "_metadata/v2/.5.crc",
                f"_stateSchema/default/{IN_FLIGHT_SCHEMA}",
                f"_stateSchema/default/.{IN_FLIGHT_SCHEMA}.crc",
            )
        ),
        *(
            store.format(op=op, p=p, name=name)
            for op in (0, 1)
            for p in (0, 1)
            for name in ("6.changelog", ".6.changelog.crc", ".7.changelog.0e7a.tmp")
        ),
    }
    # The copy's operator metadata names its own schema files: their checksums go.
    relocated = {f"query/state/{op}/_metadata/v2/.0.crc" for op in (0, 1)}
    assert left_out == in_flight | relocated | {"fraud-sink-features.id", "scored-at.tmp"}
    assert files(copy) >= {"query/commits/4", "query/offsets/4", "query/state/0/1/5.changelog", "layout.json"}
    # The per-batch records lose the batch in flight; the others are copied as they are.
    assert json.loads((copy / "model-versions.json").read_text()) == {str(b): 1 for b in range(5)}
    assert sorted(planned_frontiers(copy / QUERY_DIR)) == list(range(5)), (
        "the frontiers, as per-batch records"
    )
    for name in ("pinned.json", "layout.json", "feature-specs.json"):
        assert (copy / name).read_text() == (checkpoint / name).read_text()
    assert last_committed(copy / QUERY_DIR) == 4
    assert schema_paths(copy / QUERY_DIR / "state/0/_metadata/v2/0") == [
        f"file:{(copy / QUERY_DIR / 'state/0/_stateSchema/default' / SCHEMA).resolve()}"
    ]
    assert list(offset_entry(copy / QUERY_DIR, 4).sources) == end_offsets(4)


def test_a_checkpoint_between_batches_is_copied_whole_but_the_sink_id(tmp_path: Path) -> None:
    checkpoint = spark_checkpoint(tmp_path / "features", committed=3, in_flight=False)
    copy_committed(checkpoint, tmp_path / "copy", left_out=("pinned.json",))
    assert files(checkpoint) - files(tmp_path / "copy") == {
        "fraud-sink-features.id",
        "pinned.json",
        "scored-at.tmp",
        *(f"query/state/{op}/{p}/.5.changelog.0e7a.tmp" for op in (0, 1) for p in (0, 1)),
        *(f"query/state/{op}/_metadata/v2/.0.crc" for op in (0, 1)),
    }


def test_no_checkpoint_and_nothing_committed_are_told_apart(tmp_path: Path) -> None:
    with pytest.raises(NotFoundError, match="no checkpoint at"):
        copy_committed(tmp_path / "missing", tmp_path / "copy")
    (tmp_path / "new" / QUERY_DIR / "offsets").mkdir(parents=True)
    with pytest.raises(NothingCommittedError, match="no committed micro-batch"):
        copy_committed(tmp_path / "new", tmp_path / "copy")


def test_a_copy_without_the_state_its_batch_needs_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    checkpoint = spark_checkpoint(tmp_path / "features", committed=4)

    def checked_then_removed(path: Path) -> None:  # the query's maintenance removes it once checked
        check_intact(path)
        (path / QUERY_DIR / "state/1/0/3.changelog").unlink()

    monkeypatch.setattr(checkpoint_module, "check_intact", checked_then_removed)
    with pytest.raises(IncompleteCopyError, match=r"state/1/0: no version 3"):
        copy_committed(checkpoint, tmp_path / "copy")


def test_a_damaged_checkpoint_is_not_copied(tmp_path: Path) -> None:
    checkpoint = spark_checkpoint(tmp_path / "features", committed=4)
    (checkpoint / QUERY_DIR / "state/1/0/3.changelog").write_bytes(b"LZ4Block")
    with pytest.raises(DamagedCheckpointError, match=r"query/state/1/0/3.changelog is cut short"):
        copy_committed(checkpoint, tmp_path / "copy")
    assert not (tmp_path / "copy").exists()


def test_a_snapshot_makes_the_changes_before_it_unneeded(tmp_path: Path) -> None:
    query = spark_checkpoint(tmp_path / "features", committed=4, in_flight=False) / QUERY_DIR
    assert missing_state(query, 4) == []
    for version in (1, 2, 3):  # what the store's maintenance deletes once version 4 has a snapshot
        (query / f"state/0/0/{version}.changelog").unlink()
    (query / "state/0/0/1.zip").unlink()
    assert missing_state(query, 4) == ["state/0/0: no version 1, 2, 3"]
    (query / "state/0/0/3_ab12.zip").write_bytes(b"PK")
    assert missing_state(query, 4) == []
    assert missing_state(query, 5) == [f"state/{op}/{p}: no version 6" for op in (0, 1) for p in (0, 1)]


def test_a_restored_copy_reads_its_own_schemas_and_nothing_of_the_original(tmp_path: Path) -> None:
    checkpoint = spark_checkpoint(tmp_path / "features", committed=4)
    copy_committed(checkpoint, tmp_path / "savepoint" / "copy")
    target = tmp_path / "new" / "features"
    restore(tmp_path / "savepoint" / "copy", target, ("restored-from.json", '{"id": "x"}'))
    assert (target / "restored-from.json").read_text() == '{"id": "x"}'
    assert not list(target.parent.glob(".*restoring"))
    metadata = target / QUERY_DIR / "state/1/_metadata/v2/0"
    assert metadata.read_text().startswith("v2\n")
    assert schema_paths(metadata) == [
        f"file:{(target / QUERY_DIR / 'state/1/_stateSchema/default' / SCHEMA).resolve()}"
    ]
    assert not metadata.with_name(".0.crc").exists(), "a stale checksum would fail the read"
    for path in target.rglob("*"):
        if path.is_file():
            text = path.read_bytes().decode(errors="replace")
            assert str(checkpoint) not in text and str(tmp_path / "savepoint") not in text, path


def schema_paths(metadata: Path) -> list[str]:
    """The state schema paths an operator metadata file (``_metadata/v2/<batch>``) names."""
    paths: list[str] = json.loads(metadata.read_text().partition("\n")[2])["stateStoreInfo"][0][
        "stateSchemaFilePaths"
    ]
    return paths


def test_a_restore_needs_an_empty_directory(tmp_path: Path) -> None:
    checkpoint = spark_checkpoint(tmp_path / "features", committed=1, in_flight=False)
    copy_committed(checkpoint, tmp_path / "copy")
    (tmp_path / "empty").mkdir()
    restore(tmp_path / "copy", tmp_path / "empty")
    assert (tmp_path / "empty" / QUERY_DIR / "commits" / "1").exists()
    with pytest.raises(ConfigError, match="not empty"):
        restore(tmp_path / "copy", tmp_path / "empty")


def test_a_schema_path_is_relocated_from_the_operator_on_and_others_left_alone(tmp_path: Path) -> None:
    metadata = tmp_path / "0"
    stores = [
        {
            "storeName": "default",
            "stateSchemaFilePaths": ["file:/old/place/query/state/0/_stateSchema/default/0_x"],
        },
        {"storeName": "other", "stateSchemaFilePaths": ["file:/somewhere/else"]},
    ]
    metadata.write_text("v2\n" + json.dumps({"stateStoreInfo": stores}))
    version, _, body = relocated_metadata(metadata, tmp_path / "new").partition("\n")
    assert version == "v2"
    assert [store["stateSchemaFilePaths"] for store in json.loads(body)["stateStoreInfo"]] == [
        [f"file:{tmp_path / 'new' / 'state/0/_stateSchema/default/0_x'}"],
        ["file:/somewhere/else"],
    ]
