"""A Spark checkpoint as it stood at a committed micro-batch: copied while its query runs, and restored into
a new checkpoint directory.

Spark writes a query's checkpoint per micro-batch id. For batch ``B``:

- ``offsets/B``: the sources' end offsets of ``B``, written when ``B`` is planned, before it runs;
- ``commits/B``: written once ``B``'s output and state are committed;
- ``state/<operator>/<partition>/V.changelog`` and ``V.zip`` (RocksDB, with changelog checkpointing;
  ``V.delta`` and ``V.snapshot`` with the HDFS-backed provider; ``V_<id>.*`` with checkpoint format 2):
  the state store's version ``V = B + 1`` is written by batch ``B`` (a snapshot of a version may come
  later, from the store's maintenance); a snapshot's RocksDB files live in ``SSTs/``, written before it;
- ``state/<operator>/_metadata/v2/B`` and ``state/<operator>/_stateSchema/<store>/B_<uuid>``: operator
  metadata and state schemas, written when batch ``B`` starts with them;
- beside each file Hadoop's checksum ``.<name>.crc``, and ``.<name>.<uuid>.tmp`` while a file is written.

The rest (``metadata``, ``sources/``, SST files, the job's own files beside the query) belongs to no batch.
:func:`copy_committed` copies what belongs to the batches up to the last committed one and nothing of a
later, in-flight batch, so a query started from the copy runs the next batch afresh: its plan, state and
output follow the committed batch exactly as a restart of the original would. The job's own files are
copied too, except its sinks' ids (a query started from the copy is a new writer, see
``infra.spark.kafka_sink.config.checkpoint_sink_id``), and its per-batch records lose the in-flight batches'
values (``infra.spark.checkpoints.per_batch_until``).

The operator metadata names its schema files by absolute path: a copy points them at its own files (a
state reader can read it where it is), and :func:`restore` copies a copy into a new checkpoint directory
and points them at that directory's files, so the restored checkpoint needs nothing of the one it was taken
from, nor of the copy (either may be gone, moved, or on another machine).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from fnmatch import fnmatch
from pathlib import Path, PurePosixPath
from typing import Any

from contracts.errors import ConfigError, NotFoundError, StateError
from infra.spark.checkpoints import QUERY_DIR, check_intact, per_batch_until
from infra.spark.kafka_sink.config import SINK_ID_FILES

#: Files of a checkpoint's state store, by version: ``V.changelog``, ``V_<id>.zip``...
_STORE_FILE = re.compile(r"^(\d+)(?:_[^.]*)?\.(changelog|delta|zip|snapshot)$")
#: State store files that hold a whole version (the others hold the changes from the version before).
_SNAPSHOTS = ("zip", "snapshot")
#: A state schema file: ``<batch>_<uuid>``.
_SCHEMA_FILE = re.compile(r"^(\d+)_")


class NothingCommittedError(StateError):
    """A checkpoint has no committed micro-batch yet: there is nothing consistent to copy."""


class IncompleteCopyError(StateError):
    """A copy lacks state files that its committed batch needs (the checkpoint changed under the copy)."""


@dataclass
class Copied:
    """What :func:`copy_committed` copied: up to which batch; the files and bytes of the copy."""

    batch: int
    files: int = 0
    bytes: int = 0
    #: Files listed but gone before they were read (the query's maintenance removes old versions).
    vanished: list[str] = field(default_factory=list)


def batch_of(relative: PurePosixPath) -> int | None:
    """The micro-batch that wrote a file of a query's checkpoint (``relative`` to the query's directory),
    or None when the file belongs to no batch. Checksums belong to their file's batch."""
    parts = relative.parts
    name = unchecked(parts[-1])
    if len(parts) == 2 and parts[0] in ("offsets", "commits"):
        return int(name) if name.isdigit() else None
    if len(parts) < 4 or parts[0] != "state":
        return None
    if parts[2] == "_metadata":  # state/<op>/_metadata/v2/<batch>
        return int(name) if len(parts) == 5 and parts[3] == "v2" and name.isdigit() else None
    if parts[2] == "_stateSchema":  # state/<op>/_stateSchema/<store>/<batch>_<uuid>
        schema = _SCHEMA_FILE.match(name)
        return int(schema.group(1)) if schema else None
    store = _STORE_FILE.match(name)  # state/<op>/<partition>[/<store>]/<version>.<kind>
    if store and len(parts) in (4, 5) and parts[-2] not in ("SSTs", "_metadata"):
        return int(store.group(1)) - 1
    return None


def unchecked(name: str) -> str:
    """The name of the file a checksum file (``.<name>.crc``) checks; other names as they are."""
    return name[1:-4] if name.startswith(".") and name.endswith(".crc") else name


def is_partial(name: str) -> bool:
    """Whether a file is one being written (Hadoop's ``.<name>.<uuid>.tmp``, the project's ``*.tmp``)."""
    return unchecked(name).endswith(".tmp")


def last_committed(query: Path) -> int | None:
    """The last batch a query committed (None: none yet)."""
    commits = query / "commits"
    batches = [int(p.name) for p in commits.iterdir() if p.name.isdigit()] if commits.is_dir() else []
    return max(batches, default=None)


def copy_committed(checkpoint: Path, to: Path, left_out: tuple[str, ...] = ()) -> Copied:
    """Copy a job's checkpoint directory as it stood when its query committed its last batch, into ``to``.
    The query may keep running meanwhile.

    Args:
        checkpoint: the job's checkpoint directory: the query's checkpoint in ``QUERY_DIR``, the job's files
            beside it.
        to: where the copy goes (created).
        left_out: glob patterns of the job's files not to copy (its sinks' ids never are).

    Raises:
        NotFoundError: ``checkpoint`` holds no query checkpoint.
        NothingCommittedError: the query has committed no batch yet.
        DamagedCheckpointError: a file its last committed batch needs is missing or cut short.
        IncompleteCopyError: the copy lacks state its batch needs (the query's maintenance removed it while
            it was copied): take the copy again.
    """
    query = checkpoint / QUERY_DIR
    if not (query / "offsets").is_dir():
        raise NotFoundError(f"no checkpoint at {checkpoint}")
    batch = last_committed(query)
    if batch is None:
        raise NothingCommittedError(f"checkpoint {checkpoint} has no committed micro-batch yet")
    check_intact(checkpoint)  # a copy of a damaged checkpoint would fail only when a job starts from it
    copied = Copied(batch)
    left_out = (SINK_ID_FILES, *left_out)
    # Top-down: a directory's files are listed before its subdirectories, so the SST files of every snapshot
    # listed are written (they are, before the snapshot) by the time SSTs/ is listed.
    for source in _files(checkpoint):
        relative = PurePosixPath(source.relative_to(checkpoint).as_posix())
        if is_partial(relative.name):
            continue
        content: str | None = None
        if relative.parts[0] == QUERY_DIR:
            written_by = batch_of(PurePosixPath(*relative.parts[1:]))
            if written_by is not None and written_by > batch:
                continue
        elif len(relative.parts) == 1:
            if any(fnmatch(relative.name, pattern) for pattern in left_out):
                continue
            if relative.suffix == ".json":
                try:
                    content = per_batch_until(source.read_text(), batch)
                except FileNotFoundError:
                    copied.vanished.append(str(relative))
                    continue
        target = to / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            if content is None:
                shutil.copyfile(source, target)
            else:
                target.write_text(content)
        except FileNotFoundError:
            copied.vanished.append(str(relative))
    missing = missing_state(to / QUERY_DIR, batch)
    if missing:
        raise IncompleteCopyError(
            f"the copy of {checkpoint} at batch {batch} lacks state ({'; '.join(missing[:3])}): its query "
            "removed files while they were copied; take it again"
        )
    relocate_schemas(to / QUERY_DIR, to.resolve() / QUERY_DIR)  # readable where it is, as a checkpoint
    sizes = [path.stat().st_size for path in _files(to)]
    copied.files, copied.bytes = len(sizes), sum(sizes)
    return copied


def _files(root: Path) -> Iterator[Path]:
    for directory, subdirectories, names in os.walk(root):
        subdirectories.sort()
        for name in sorted(names):
            yield Path(directory) / name


def missing_state(query: Path, batch: int) -> list[str]:
    """Why the state stores of a query's checkpoint cannot be loaded as batch ``batch`` left them: for each
    store that lacks a version between its last snapshot and ``batch + 1``, which (empty: all can)."""
    versions: dict[Path, dict[int, set[str]]] = defaultdict(lambda: defaultdict(set))
    state = query / "state"
    for path in _files(state) if state.is_dir() else ():
        relative = PurePosixPath(path.relative_to(query).as_posix())
        store = _STORE_FILE.match(relative.name)
        if store and batch_of(relative) is not None:
            versions[path.parent][int(store.group(1))].add(store.group(2))
    problems = []
    wanted = batch + 1
    for store_dir, kinds in sorted(versions.items()):
        base = max((v for v, found in kinds.items() if v <= wanted and found & {*_SNAPSHOTS}), default=0)
        gaps = [v for v in range(base + 1, wanted + 1) if not kinds.get(v, set()) - {*_SNAPSHOTS}]
        if gaps:
            where = store_dir.relative_to(query).as_posix()
            problems.append(f"{where}: no version {', '.join(map(str, gaps[:3]))}")
    return problems


def read_offsets(query: Path, batch: int) -> list[Any]:
    """The end offsets of each source of a query in batch ``batch`` (``offsets/<batch>``: a version line,
    the batch's metadata, then one line per source: its offset as JSON, or None for a source that has
    none)."""
    lines = (query / "offsets" / str(batch)).read_text().splitlines()
    return [None if line.strip() == "-" else _json_or_text(line) for line in lines[2:]]


def read_batch_conf(query: Path, batch: int) -> dict[str, str]:
    """The SQL settings a query ran batch ``batch`` with, as its offset log records them: those Spark keeps
    for the life of a checkpoint, whatever a restart asks for (``spark.sql.shuffle.partitions``, the
    partitions of its state stores, among them)."""
    lines = (query / "offsets" / str(batch)).read_text().splitlines()
    conf = json.loads(lines[1]).get("conf", {}) if len(lines) > 1 else {}
    return {str(name): str(value) for name, value in conf.items()}


def _json_or_text(line: str) -> Any:
    try:
        return json.loads(line)
    except ValueError:
        return line


def restore(copy: Path, checkpoint: Path, marker: tuple[str, str] | None = None) -> None:
    """Make ``checkpoint`` (missing or empty) a checkpoint of the copy ``copy`` (:func:`copy_committed`).

    The copy goes to a sibling directory first, its state schema paths pointed at ``checkpoint``, and
    ``marker`` (a file name and its text) written last; the sibling then becomes ``checkpoint``: an
    interrupted restore leaves ``checkpoint`` as it was.

    Raises:
        ConfigError: ``checkpoint`` holds files.
    """
    if checkpoint.exists() and any(checkpoint.iterdir()):
        raise ConfigError(f"checkpoint {checkpoint} is not empty")
    staging = checkpoint.with_name(f".{checkpoint.name}.restoring")
    shutil.rmtree(staging, ignore_errors=True)
    shutil.copytree(copy, staging)
    relocate_schemas(staging / QUERY_DIR, checkpoint.resolve() / QUERY_DIR)
    if marker is not None:
        (staging / marker[0]).write_text(marker[1])
    if checkpoint.exists():
        checkpoint.rmdir()
    checkpoint.parent.mkdir(parents=True, exist_ok=True)
    staging.rename(checkpoint)


def relocate_schemas(query: Path, location: Path) -> int:
    """Point the state schema paths of the operator metadata in ``query`` at the schema files under
    ``location`` (where ``query`` will be read from); the number of files changed. Their checksums go: a
    file without one is read unchecked."""
    changed = 0
    for path in sorted(query.glob("state/*/_metadata/v2/*")):
        if not path.name.isdigit():
            continue
        version, _, body = path.read_text().partition("\n")
        metadata = json.loads(body)
        for store in metadata.get("stateStoreInfo", []):
            store["stateSchemaFilePaths"] = [
                _relocated(p, location) for p in store.get("stateSchemaFilePaths", [])
            ]
        path.write_text(f"{version}\n{json.dumps(metadata, separators=(',', ':'))}")
        path.with_name(f".{path.name}.crc").unlink(missing_ok=True)
        changed += 1
    return changed


def _relocated(schema_path: str, location: Path) -> str:
    """``file:<location>/state/<op>/_stateSchema/<store>/<file>`` for a schema path of another location."""
    parts = PurePosixPath(schema_path.split(":", 1)[-1]).parts
    if "_stateSchema" not in parts:
        return schema_path
    start = len(parts) - 1 - parts[::-1].index("_stateSchema") - 2  # state/<op>/_stateSchema/...
    return f"file:{location.joinpath(*parts[start:]).as_posix()}"
