"""A streaming job's checkpoint is bound to the layout its state was written with.

Stateful jobs route events to state by a key computed from settings (the feature job hashes cards and
terminals into a number of buckets). Spark checks the state schema on restart, not the routing: resumed
with other bucket counts, a job would read each card's history from the wrong bucket and compute wrong
features without an error. So the first run writes its layout next to the checkpoint, and later runs
must match it.

A job without state can still depend on a layout: the scoring job's write tasks follow its read tasks,
and the sink's exactly-once markers are per write task. A micro-batch re-run after a crash must split
its rows as the first attempt did, whatever the cores of the machine it restarts on: such a layout is
pinned (recorded by the first run, used as recorded by the later ones). Choices made per micro-batch
(the model version that scores it, the time it is stamped with) are recorded the same way, per batch id
(:class:`PerBatch`).
"""

from __future__ import annotations

import json
import os
import struct
import zipfile
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Any

from contracts.errors import StateError

LAYOUT_FILE = "layout.json"
#: Spark's own checkpoint of a job's query (offsets, commits, state), inside the job's checkpoint directory
#: beside the job's files.
QUERY_DIR = "query"


def query_location(checkpoint: Path) -> Path:
    """Where a job's query keeps Spark's checkpoint (its ``checkpointLocation``)."""
    return checkpoint / QUERY_DIR


class CheckpointLayoutError(StateError, ValueError):
    """A checkpoint was written with another layout than the one this run asks for."""


def replace_text(path: Path, text: str) -> None:
    """Write ``path`` whole or not at all: a temporary file beside it, then renamed over it."""
    temporary = path.with_suffix(".tmp")
    temporary.write_text(text)
    os.replace(temporary, path)


def bind_layout(
    checkpoint: Path,
    layout: Mapping[str, int],
    made_before_layouts: Mapping[str, int] | None = None,
    tunable: Collection[str] = (),
) -> None:
    """Record ``layout`` in a new checkpoint, or check that an existing one was written with it.

    Args:
        checkpoint: the job's checkpoint directory (created if missing).
        layout: what routes events to state, e.g. ``{"card_buckets": 6, "terminal_buckets": 6}``.
        made_before_layouts: the layout of checkpoints written before layouts were recorded (a checkpoint
            with content but no layout file); ``None``: such a checkpoint is an error.
        tunable: names in the layout whose value may change between runs (it shapes what is written from
            now on, not where state is found): a new value is recorded. A name that only one of the two
            layouts has still differs.

    Raises:
        CheckpointLayoutError: the checkpoint holds state of another layout.
    """
    checkpoint.mkdir(parents=True, exist_ok=True)
    path = checkpoint / LAYOUT_FILE
    wanted = dict(layout)
    if path.exists():
        found = json.loads(path.read_text())
    elif any(checkpoint.iterdir()):
        if made_before_layouts is None:
            raise CheckpointLayoutError(
                f"checkpoint {checkpoint} has no {LAYOUT_FILE}: it was not written by this job; "
                "use a new checkpoint directory"
            )
        found = dict(made_before_layouts)
    else:
        found = wanted
    if fixed_part(found, tunable) != fixed_part(wanted, tunable):
        raise CheckpointLayoutError(
            f"checkpoint {checkpoint} holds state written with {found}, this run asks for {wanted}: "
            "resume it with the same settings, or rescale it through a savepoint (`fraud savepoint create`, "
            "then run with `--from-savepoint` into a new checkpoint)"
        )
    if not path.exists() or found != wanted:
        replace_text(path, json.dumps(wanted, sort_keys=True) + "\n")


def fixed_part(layout: Mapping[str, int], tunable: Collection[str]) -> dict[str, int | None]:
    """The layout without the values of its ``tunable`` names (which are kept as present, value None)."""
    return {name: None if name in tunable else value for name, value in layout.items()}


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
        last = _ids(query / "commits")
        if last:
            _check_state(query / "state", max(last) + 1)
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


def _ids(folder: Path) -> list[int]:
    """The batch ids a log folder holds (Spark names its entries by batch id; hidden ``.crc`` files aside)."""
    if not folder.is_dir():
        return []
    return sorted(int(path.name) for path in folder.iterdir() if path.name.isdigit())


def _check_logs(query: Path) -> None:
    offsets, commits = _ids(query / "offsets"), _ids(query / "commits")
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
