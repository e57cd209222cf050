"""A streaming query's committed state, read from its checkpoint without the query: the last committed
micro-batch, its source offsets, and the value-state variables of its ``transformWithState`` operators.

Read-only and safe beside the running query: it reads only a micro-batch the commit log records (a batch
in flight has an offset-log entry and state files being written, but no commit), at that batch's state
version, which Spark keeps until the query has committed ``minBatchesToRetain`` (100) batches more; it
writes nothing under the checkpoint.

Why Spark's state data source (``spark.read.format("statestore")``, Spark 4) and not a reader of the
files: the state lives in RocksDB. A checkpoint holds its snapshots (a zip of RocksDB metadata plus SST
files) and, between them, changelog files (lz4 frames of Spark's binary row encoding, with column-family
prefixes and format versions that change between Spark releases). Reading those would mean a RocksDB
binding for the SST files and re-implementing Spark's private encodings, which break on a Spark upgrade;
the data source is Spark's own, supported reader of them. Its cost is a Spark session (a local one: a few
seconds to start) and a small batch job per read.

A copy of a checkpoint (a savepoint) can be read in place, wherever it was moved: Spark's operator metadata
records the state schema files by absolute path, so when those paths are gone (the original checkpoint was
deleted or is elsewhere), the reader sees the copy through a temporary view whose metadata points at the
copy's own schema files; the copy itself is not touched.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from contracts.errors import NotFoundError, StateError
from infra.spark.checkpoint import (
    OFFSETS,
    last_committed,
    offset_entry,
    operator_metadata_files,
    read_operator_metadata,
    relocated_metadata,
    schema_paths,
)
from infra.spark.internals import start_state_store_coordinator

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

#: The directory of a query checkpoint's state, and where each stateful operator keeps its metadata there.
STATE = "state"
OPERATOR_METADATA = Path("_metadata") / "v2"


class CheckpointNotFoundError(NotFoundError):
    """No checkpoint at the path, or nothing committed in it yet."""


@dataclass(frozen=True)
class CommittedBatch:
    """The last micro-batch a query committed, and each of its sources' end offsets (None: the source
    had none)."""

    batch_id: int
    source_offsets: tuple[Any, ...]


def committed_batch(query_dir: Path) -> CommittedBatch:
    """The last committed micro-batch of the query checkpointed at ``query_dir``.

    Raises:
        CheckpointNotFoundError: no query checkpoint there, or no micro-batch committed yet.
    """
    if not (query_dir / OFFSETS).is_dir():
        raise CheckpointNotFoundError(f"no checkpoint at {query_dir.parent}: no job has run with it")
    batch_id = last_committed(query_dir)
    if batch_id is None:
        raise CheckpointNotFoundError(
            f"nothing committed yet in the checkpoint at {query_dir.parent}: its job has not finished a "
            "micro-batch"
        )
    return CommittedBatch(batch_id, offset_entry(query_dir, batch_id).sources)


class StateReader:
    """The value-state and map-state variables of a query's ``transformWithState`` operators at one
    committed batch.

    Use as a context manager: a copy read through a temporary view (see the module docstring) keeps the
    view until the block ends.
    """

    def __init__(self, spark: SparkSession, query_dir: Path, batch_id: int) -> None:
        self.spark = spark
        self.query_dir = query_dir
        self.batch_id = batch_id
        self._view: Path | None = None
        self._operators: dict[str, int] | None = None

    def __enter__(self) -> StateReader:
        start_state_store_coordinator(self.spark)  # the state data source needs it
        if moved_schema_files(self.query_dir):
            self._view = Path(tempfile.mkdtemp(prefix="fraud-state-view-"))
            relocated_view(self.query_dir, self._view)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._view is not None:
            shutil.rmtree(self._view, ignore_errors=True)
            self._view = None

    @property
    def path(self) -> str:
        """The directory Spark reads: the checkpoint, or its view."""
        return str(self._view or self.query_dir)

    def operator_of(self, state_var: str) -> int:
        """The id of the operator that keeps ``state_var`` (Spark's state metadata source).

        Raises:
            StateError: no operator of the checkpoint keeps it.
        """
        if self._operators is None:
            rows = (
                self.spark.read.format("state-metadata")
                .option("batchId", self.batch_id)
                .load(self.path)
                .select("operatorId", "operatorProperties")
                .collect()
            )
            self._operators = {
                variable["stateName"]: int(row["operatorId"])
                for row in rows
                for variable in json.loads(row["operatorProperties"] or "{}").get("stateVariables", [])
            }
        if state_var not in self._operators:
            known = ", ".join(sorted(self._operators)) or "none"
            raise StateError(
                f"the checkpoint at {self.query_dir.parent} keeps no state variable {state_var!r} "
                f"(it keeps: {known}): it is not this job's"
            )
        return self._operators[state_var]

    def _values(self, state_var: str) -> DataFrame:
        return (
            self.spark.read.format("statestore")
            .option("batchId", self.batch_id)
            .option("operatorId", self.operator_of(state_var))
            .option("stateVarName", state_var)
            .load(self.path)
        )

    def value_state(
        self, state_var: str, key_column: str, keys: Collection[Any]
    ) -> dict[Any, dict[str, Any]]:
        """The values of ``state_var`` of the grouping keys ``keys`` (their column ``key_column``): by key,
        the value's fields by name. Keys without a value are left out."""
        frame = self._values(state_var)
        rows = frame.where(frame["key"][key_column].isin(list(keys))).select("key", "value").collect()
        return {row["key"][key_column]: row["value"].asDict() for row in rows if row["value"] is not None}

    def all_values(self, state_var: str) -> list[tuple[Any, ...]]:
        """Every value of ``state_var``, whatever its key: each value's fields in order (collected in the
        driver)."""
        rows = self._values(state_var).select("value").collect()
        return [tuple(row["value"]) for row in rows if row["value"] is not None]

    def values_by_key(self, state_var: str, key_column: str) -> dict[Any, tuple[Any, ...]]:
        """Every value of the value-state variable ``state_var`` by its grouping key (its column
        ``key_column``), each value's fields in order (collected in the driver)."""
        rows = self._values(state_var).select("key", "value").collect()
        return {row["key"][key_column]: tuple(row["value"]) for row in rows if row["value"] is not None}

    def map_value(self, state_var: str, key_column: str, key: Any, user_key: Any) -> tuple[Any, ...] | None:
        """The value of one entry of the map-state variable ``state_var``: the grouping key ``key`` (its column
        ``key_column``) and the map key ``user_key`` (a one-field key); None when there is none."""
        frame = self._values(state_var)
        user_field = frame.schema["user_map_key"].dataType.names[0]  # type: ignore[attr-defined]
        rows = (
            frame.where((frame["key"][key_column] == key) & (frame["user_map_key"][user_field] == user_key))
            .select("user_map_value")
            .collect()
        )
        return tuple(rows[0]["user_map_value"]) if rows and rows[0]["user_map_value"] is not None else None

    def all_map_values(self, state_var: str, key_column: str) -> dict[Any, list[tuple[Any, ...]]]:
        """Every entry's value of the map-state variable ``state_var``, by grouping key (its column
        ``key_column``), each value's fields in order (collected in the driver)."""
        rows = self._values(state_var).select("key", "user_map_value").collect()
        found: dict[Any, list[tuple[Any, ...]]] = {}
        for row in rows:
            if row["user_map_value"] is not None:
                found.setdefault(row["key"][key_column], []).append(tuple(row["user_map_value"]))
        return found


def _local(uri: str) -> Path | None:
    """The local path of a ``file:`` URI (None for other file systems, which are not checked)."""
    parsed = urlparse(uri)
    return Path(parsed.path) if parsed.scheme in ("", "file") else None


def moved_schema_files(query_dir: Path) -> bool:
    """Whether the operator metadata of the checkpoint names local state schema files that are gone (a copy
    whose original was moved or deleted)."""
    for path in operator_metadata_files(query_dir):
        _, metadata = read_operator_metadata(path)
        for uri in schema_paths(metadata):
            local = _local(uri)
            if local is not None and not local.exists():
                return True
    return False


def relocated_view(query_dir: Path, view: Path) -> None:
    """Lay out in ``view`` the checkpoint at ``query_dir`` as Spark can read it: links to its files, but
    for the operator metadata, copied with the schema files' paths pointing into ``query_dir``.

    The copies go without their checksum files (Hadoop checks a file against its ``.crc`` when there is
    one; a missing one is not an error).
    """
    source = query_dir.resolve()
    for entry in source.iterdir():
        if entry.name != STATE:
            (view / entry.name).symlink_to(entry)
    for operator in (source / STATE).iterdir():
        target = view / STATE / operator.name
        target.mkdir(parents=True)
        for entry in operator.iterdir():
            if entry.name != OPERATOR_METADATA.parts[0]:
                (target / entry.name).symlink_to(entry)
    for path in operator_metadata_files(source):
        copied = view / path.relative_to(source)
        copied.parent.mkdir(parents=True, exist_ok=True)
        copied.write_text(relocated_metadata(path, source))
