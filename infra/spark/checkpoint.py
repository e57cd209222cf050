"""A Spark query's checkpoint on disk, as the jobs keep it: read, checked, copied and restored without Spark.

A job's checkpoint directory holds Spark's checkpoint of its query (:data:`QUERY_DIR`) and the job's own files
beside it (its layout, its sinks' ids, what it records per micro-batch). Spark writes the query's checkpoint
per micro-batch id. For batch ``B``:

- ``offsets/B``: a version line, the batch's metadata (its timestamp, the SQL settings the checkpoint keeps),
  then the sources' end offsets of ``B``, one line each; written when ``B`` is planned, before it runs;
- ``commits/B``: written once ``B``'s output and state are committed;
- ``state/<operator>/<partition>/V.changelog`` and ``V.zip`` (RocksDB, with changelog checkpointing;
  ``V.delta`` and ``V.snapshot`` with the HDFS-backed provider; ``V_<id>.*`` with checkpoint format 2):
  the state store's version ``V = B + 1`` is written by batch ``B`` (a snapshot of a version may come
  later, from the store's maintenance); a snapshot's RocksDB files live in ``SSTs/``, written before it;
  a changelog is an LZ4 block stream (Spark's default codec) that ends with an empty block;
- ``state/<operator>/_metadata/v2/B`` and ``state/<operator>/_stateSchema/<store>/B_<uuid>``: operator
  metadata and state schemas, written when batch ``B`` starts with them; the metadata names its schema
  files by absolute path;
- beside each file Hadoop's checksum ``.<name>.crc``, and ``.<name>.<uuid>.tmp`` while a file is written.

These are Spark's formats as PySpark 4.2.0 writes them, the version ``infra.spark.internals.CHECKED_ON``
names (a new Spark: read them again with it).

Here: the logs read (:func:`batch_ids`, :func:`offset_entry`); the job's records per batch
(:class:`PerBatch`) and of its first run (:func:`pinned_layout`); whether a restart finds every file it
needs whole (:func:`check_intact`); a copy as the checkpoint stood at its last committed micro-batch, taken
while its query runs (:func:`copy_committed`), and a copy restored into a new checkpoint directory
(:func:`restore`), their schema paths pointed at their own files (:func:`relocate_schemas`).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import zipfile
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from fnmatch import fnmatch
from pathlib import Path, PurePosixPath
from typing import Any

from contracts.errors import ConfigError, NotFoundError, StateError
from infra.spark.kafka_sink.config import SINK_ID_FILES

#: Spark's own checkpoint of a job's query (offsets, commits, state), inside the job's checkpoint directory
#: beside the job's files.
QUERY_DIR = "query"
#: The logs of a query's checkpoint: where each micro-batch read to, and which were committed.
OFFSETS, COMMITS = "offsets", "commits"


def query_location(checkpoint: Path) -> Path:
    """Where a job's query keeps Spark's checkpoint (its ``checkpointLocation``)."""
    return checkpoint / QUERY_DIR


def replace_text(path: Path, text: str) -> None:
    """Write ``path`` whole or not at all: a temporary file beside it, then renamed over it."""
    temporary = path.with_suffix(".tmp")
    temporary.write_text(text)
    os.replace(temporary, path)


# --- the logs ------------------------------------------------------------------------------------------


def batch_ids(query: Path, log: str) -> list[int]:
    """The micro-batch ids the query's log ``log`` (:data:`OFFSETS`, :data:`COMMITS`) holds, in order (Spark
    names its entries by batch id; its hidden ``.crc`` files aside)."""
    folder = query / log
    if not folder.is_dir():
        return []
    return sorted(int(path.name) for path in folder.iterdir() if path.name.isdigit())


def last_committed(query: Path) -> int | None:
    """The last micro-batch the query committed (None: none yet)."""
    return max(batch_ids(query, COMMITS), default=None)


def newest_batch(query: Path) -> int | None:
    """The newest micro-batch in the query's offset log, committed or not (None: none yet)."""
    return max(batch_ids(query, OFFSETS), default=None)


@dataclass(frozen=True)
class OffsetEntry:
    """One micro-batch's entry in the query's offset log: Spark's metadata of the batch (``batchTimestampMs``,
    ``conf``: the SQL settings the checkpoint keeps) and each source's end offset, as JSON (None: the source
    had none)."""

    metadata: dict[str, Any]
    sources: tuple[Any, ...]


def offset_entry(query: Path, batch: int) -> OffsetEntry:
    """Micro-batch ``batch`` of the query's offset log (``offsets/<batch>``).

    Raises:
        StateError: the file is not an offset-log entry.
    """
    text = (query / OFFSETS / str(batch)).read_text()
    lines = text.splitlines()
    if not lines or not lines[0].startswith("v"):
        raise StateError(f"not a Spark offset-log entry: {text[:40]!r}")
    metadata = json.loads(lines[1]) if len(lines) > 1 else {}
    return OffsetEntry(
        metadata, tuple(None if line.strip() in ("", "-") else json.loads(line) for line in lines[2:])
    )


def read_batch_conf(query: Path, batch: int) -> dict[str, str]:
    """The SQL settings a query ran batch ``batch`` with, as its offset log records them: those Spark keeps
    for the life of a checkpoint, whatever a restart asks for (``spark.sql.shuffle.partitions``, the
    partitions of its state stores, among them)."""
    conf = offset_entry(query, batch).metadata.get("conf", {})
    return {str(name): str(value) for name, value in conf.items()}


# --- what a job records beside its query ---------------------------------------------------------------
# (The feature job's layout and feature specs: ``features.state_layout``.)


def pinned_layout(checkpoint: Path, layout: Mapping[str, int], file: str = "pinned.json") -> dict[str, int]:
    """The layout the checkpoint's first run recorded (``layout`` itself, recorded now, on a first run);
    settings added since are recorded with their value in ``layout``."""
    checkpoint.mkdir(parents=True, exist_ok=True)
    path = checkpoint / file
    found = json.loads(path.read_text()) if path.exists() else {}
    pinned = {**layout, **found}
    if pinned != found:
        replace_text(path, json.dumps(pinned, sort_keys=True) + "\n")
    return pinned


class PerBatch:
    """A value per micro-batch id, kept in a JSON file of the checkpoint and recorded before the batch is
    written: a re-run of a batch (after a crash) gets the value its first run got.

    Spark re-runs only its last micro-batch or so; the ``kept`` newest batch ids are remembered. The file
    is a JSON object whose keys are all batch ids, which is how :func:`per_batch_until` recognises it.
    """

    def __init__(self, path: Path, kept: int = 100) -> None:
        self.path = path
        self.kept = kept
        self.values: dict[int, Any] = (
            {int(k): v for k, v in json.loads(path.read_text()).items()} if path.exists() else {}
        )

    def get(self, batch_id: int, choose: Callable[[], Any]) -> Any:
        """The value of ``batch_id``: the recorded one, or ``choose()``, recorded first."""
        if batch_id in self.values:
            return self.values[batch_id]
        value = self.values[batch_id] = choose()
        for old in sorted(self.values)[: -self.kept]:
            del self.values[old]
        replace_text(self.path, json.dumps(self.values))
        return value


def per_batch_until(text: str, last_batch: int) -> str | None:
    """A :class:`PerBatch` file's content without the values of batches after ``last_batch`` (what a copy
    of the checkpoint as it stood at that batch holds); None when ``text`` is not such a file's content."""
    try:
        values = json.loads(text)
    except ValueError:
        return None
    if not isinstance(values, dict) or not values or not all(key.isdigit() for key in values):
        return None
    return json.dumps({key: value for key, value in values.items() if int(key) <= last_batch})


# --- a restart's files, whole -----------------------------------------------------------------------


class DamagedCheckpointError(StateError):
    """A file Spark needs to resume a checkpoint is missing or cut short."""


#: Spark's LZ4 block stream (its default state store codec): every block starts with this.
LZ4_MAGIC = b"LZ4Block"
#: Magic, token, compressed length, original length, checksum.
_LZ4_HEADER = struct.Struct("<8sBiii")


def check_intact(checkpoint: Path) -> None:
    """Check, before Spark starts, that the files a restart of the checkpoint's query needs are there and
    whole: the offsets and commit logs (no gap, the newest entries readable, no commit without its offsets)
    and the state store files of the last committed micro-batch (its snapshot and the changelogs after it).
    Spark meets a missing or truncated file somewhere in a task, pages of traceback later, or misreads it
    (a commit without its offsets makes it plan that batch again, and the sink then finds its markers
    ahead of the batch).

    Raises:
        DamagedCheckpointError: naming the file and what to do.
    """
    query = query_location(checkpoint)
    try:
        _check_logs(query)
        last = last_committed(query)
        if last is not None:
            _check_state(query / "state", last + 1)
    except _Damaged as damage:
        raise DamagedCheckpointError(
            f"checkpoint {checkpoint} is damaged: {damage.file.relative_to(checkpoint)} {damage.what}; restore "
            "a savepoint into a new checkpoint (`--from-savepoint PATH --checkpoint NEW`) or start over in a "
            "new checkpoint (`--checkpoint NEW`, or delete this one)"
        ) from None


class _Damaged(Exception):
    def __init__(self, file: Path, what: str) -> None:
        super().__init__(what)
        self.file, self.what = file, what


def _check_logs(query: Path) -> None:
    offsets, commits = batch_ids(query, OFFSETS), batch_ids(query, COMMITS)
    for name, ids in (("offsets", offsets), ("commits", commits)):
        gaps = sorted(set(range(ids[0], ids[-1] + 1)) - set(ids)) if ids else []
        if gaps:
            raise _Damaged(query / name / str(gaps[0]), "is missing (the entries around it are there)")
    if commits and (not offsets or commits[-1] > offsets[-1]):
        raise _Damaged(
            query / "offsets" / str(commits[-1]),
            f"is missing: micro-batch {commits[-1]} was committed, but where it read to is gone",
        )
    newest = [query / "offsets" / str(i) for i in offsets[-2:]] + [
        query / "commits" / str(i) for i in commits[-1:]
    ]
    for entry in newest:
        lines = entry.read_text(errors="replace").splitlines()
        if len(lines) < 2 or not lines[0].startswith("v"):
            raise _Damaged(entry, "is cut short or unreadable")
        for line in lines[1:]:
            try:
                json.loads(line)
            except ValueError:
                raise _Damaged(entry, "is cut short or unreadable") from None


def _version_of(path: Path) -> int | None:
    """The state version of a store file: ``12.changelog``, ``12.zip``, or ``12_<id>.<suffix>``."""
    head = path.stem.partition("_")[0]
    return int(head) if head.isdigit() and path.suffix in (".changelog", ".zip") else None


def _check_state(state: Path, version: int) -> None:
    """Each state store partition under ``state`` can be loaded at ``version``: its newest snapshot at or
    below it, and a whole changelog of every version after that snapshot up to it."""
    if not state.is_dir():
        return
    for partition in sorted(p for p in state.glob("*/*") if p.is_dir() and p.name.isdigit()):
        files: dict[int, dict[str, Path]] = {}
        for path in partition.iterdir():
            found = _version_of(path)
            if found is not None and found <= version:
                files.setdefault(found, {})[path.suffix] = path
        if not files:
            continue
        snapshots = [v for v, kinds in files.items() if ".zip" in kinds]
        base = max(snapshots, default=0)
        if base:
            _check_snapshot(files[base][".zip"])
        for wanted in range(base + 1, version + 1):
            changelog = files.get(wanted, {}).get(".changelog")
            if changelog is None:
                if wanted == version or any(v > wanted for v in files):
                    raise _Damaged(partition / f"{wanted}.changelog", "is missing")
                continue
            _check_changelog(changelog)


def _check_snapshot(path: Path) -> None:
    try:
        with zipfile.ZipFile(path) as archive:
            archive.infolist()
    except (zipfile.BadZipFile, OSError):
        raise _Damaged(path, "is cut short or unreadable") from None


def _check_changelog(path: Path) -> None:
    """A changelog in Spark's LZ4 block stream ends with an empty block; one cut short does not. (A file of
    another codec is not checked.)"""
    data = path.read_bytes()
    if not data:
        raise _Damaged(path, "is empty")
    if not data.startswith(LZ4_MAGIC):
        return
    at = 0
    while at + _LZ4_HEADER.size <= len(data):
        magic, _, compressed, original, _ = _LZ4_HEADER.unpack_from(data, at)
        if magic != LZ4_MAGIC or compressed < 0 or original < 0:
            break
        if compressed == 0 and original == 0:
            return
        at += _LZ4_HEADER.size + compressed
    raise _Damaged(path, "is cut short")


# --- a copy at a committed micro-batch, and its restore ------------------------------------------------

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
    if len(parts) == 2 and parts[0] in (OFFSETS, COMMITS):
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


def copy_committed(checkpoint: Path, to: Path, left_out: tuple[str, ...] = ()) -> Copied:
    """Copy a job's checkpoint directory as it stood when its query committed its last batch, into ``to``.
    The query may keep running meanwhile.

    What belongs to the batches up to the last committed one is copied, nothing of a later, in-flight batch
    (the rest, ``metadata``, ``sources/`` and SST files, belongs to no batch), so a query started from the
    copy runs the next batch afresh: its plan, state and output follow the committed batch exactly as a
    restart of the original would. The job's own files are copied too, but its sinks' ids (a query started
    from the copy is a new writer, ``infra.spark.kafka_sink.config.checkpoint_sink_id``), and its per-batch
    records lose the in-flight batches' values (:func:`per_batch_until`). The copy's schema paths point at
    its own files: a state reader reads it where it is.

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
    if not (query / OFFSETS).is_dir():
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


def restore(copy: Path, checkpoint: Path, marker: tuple[str, str] | None = None) -> None:
    """Make ``checkpoint`` (missing or empty) a checkpoint of the copy ``copy`` (:func:`copy_committed`).

    The copy goes to a sibling directory first, its state schema paths pointed at ``checkpoint``, and
    ``marker`` (a file name and its text) written last; the sibling then becomes ``checkpoint``: an
    interrupted restore leaves ``checkpoint`` as it was. The restored checkpoint needs nothing of the one
    the copy was taken from, nor of the copy (either may be gone, moved, or on another machine).

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


# --- state schema paths ------------------------------------------------------------------------------


def operator_metadata_files(query: Path) -> list[Path]:
    """The operator metadata files of a query's checkpoint (``state/<operator>/_metadata/v2/<batch>``)."""
    return sorted(path for path in query.glob("state/*/_metadata/v2/*") if path.name.isdigit())


def read_operator_metadata(path: Path) -> tuple[str, dict[str, Any]]:
    """An operator metadata file's version line and its metadata."""
    version, _, body = path.read_text().partition("\n")
    return version, json.loads(body)


def schema_paths(metadata: Mapping[str, Any]) -> list[str]:
    """The state schema files operator metadata names."""
    return [
        path for store in metadata.get("stateStoreInfo", []) for path in store.get("stateSchemaFilePaths", [])
    ]


def relocated_metadata(path: Path, location: Path) -> str:
    """The text of the operator metadata file ``path`` with its state schema paths pointed at the schema
    files under ``location`` (the query's directory where it will be read from)."""
    version, metadata = read_operator_metadata(path)
    for store in metadata.get("stateStoreInfo", []):
        store["stateSchemaFilePaths"] = [
            _relocated(p, location) for p in store.get("stateSchemaFilePaths", [])
        ]
    return f"{version}\n{json.dumps(metadata, separators=(',', ':'))}"


def relocate_schemas(query: Path, location: Path) -> int:
    """Point the state schema paths of the operator metadata in ``query`` at the schema files under
    ``location`` (where ``query`` will be read from); the number of files changed. Their checksums go: a
    file without one is read unchecked."""
    files = operator_metadata_files(query)
    for path in files:
        path.write_text(relocated_metadata(path, location))
        path.with_name(f".{path.name}.crc").unlink(missing_ok=True)
    return len(files)


def _relocated(schema_path: str, location: Path) -> str:
    """``file:<location>/state/<op>/_stateSchema/<store>/<file>`` for a schema path of another location."""
    parts = PurePosixPath(schema_path.split(":", 1)[-1]).parts
    if "_stateSchema" not in parts:
        return schema_path
    start = len(parts) - 1 - parts[::-1].index("_stateSchema") - 2  # state/<op>/_stateSchema/...
    return f"file:{location.joinpath(*parts[start:]).as_posix()}"
