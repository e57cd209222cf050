"""Savepoints of the streaming jobs: a job's state, source offsets, event-time frontier and layout as one
committed micro-batch left them, taken while the job runs; a job started from one continues from there.

A savepoint is a directory: ``savepoint.json`` (what it holds, :class:`Savepoint`) and ``checkpoint/``, the
job's checkpoint as it stood when its last committed micro-batch ended (``infra.spark.checkpoint``). It can live
anywhere the job's Spark sees (a local directory, a mount the cluster shares) and be moved as a whole.

A job starts from one in a new, empty checkpoint directory (``start_from``) once the savepoint is found to
fit the job: the same job, the same input topics, state kept in this version's layout
(``features.state_layout``: an earlier layout's is refused, with the way to move it) and feature specs its
state can serve (``features.compat``). In the same layout (bucket counts and shuffle partitions) the checkpoint becomes the
savepoint's copy, and the job goes on as a restart would. In another layout it is *rescaled*: the
checkpoint starts a new query whose first micro-batch takes the savepoint's state re-keyed into the new
buckets (``features.rescale``) and whose source starts at the savepoint's end offset; the checkpoint
records the layout change and, once that batch has committed, needs the savepoint no more. Either way its
sink gets a new id: the job the savepoint was taken from may have written later batches, and may even
still run. Run again with the same savepoint, a job resumes the checkpoint that its first start made (a
rescaled one whose first micro-batch did not commit starts it again, from the savepoint, with or without
``--from-savepoint``).
"""

from __future__ import annotations

import json
import shutil
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from contracts.errors import ConfigError, NotFoundError, StateError
from features.compat import SPECS_FILE, check_specs, read_specs
from features.definitions import FeatureParams
from features.entries import Layout
from features.rescale import Rescale
from features.state_layout import check_current, earlier_layout
from infra.spark.checkpoint import (
    LAYOUT_FILE,
    QUERY_DIR,
    NothingCommittedError,
    bind_layout,
    copy_committed,
    last_committed,
    read_batch_conf,
    restore,
)
from infra.spark.offset_log import Position, position_at, settle_ending

#: What a savepoint holds, in its directory.
SAVEPOINT_FILE = "savepoint.json"
#: The copy of the job's checkpoint, in a savepoint's directory.
CHECKPOINT_COPY = "checkpoint"
#: Written in a checkpoint started from a savepoint: which one (a second start from it resumes instead).
RESTORED_FILE = "restored-from.json"
#: The version of ``savepoint.json``'s format (2: with ``shuffle_partitions``; the savepoints of format 1
#: predate this version's state layout).
FORMAT = 2
#: The Spark setting a checkpoint keeps for its life, which a rescale changes with the bucket counts.
SHUFFLE_PARTITIONS = "spark.sql.shuffle.partitions"


class SavepointMismatchError(StateError):
    """A savepoint does not fit the job asked to start from it (another job, layout, input or features)."""


@dataclass(frozen=True)
class Savepoint:
    """What a savepoint holds (``savepoint.json``)."""

    #: Its directory (not stored: a savepoint can be moved).
    path: Path = field(compare=False)
    id: str
    job: str
    namespace: str
    #: When it was taken, UTC ISO 8601.
    created_at: str
    #: The checkpoint directory it was taken from.
    checkpoint: str
    #: The last micro-batch committed when it was taken: a job started from it runs batch ``batch + 1`` next.
    batch: int
    #: The sources' end offsets of that batch, per ``topic/partition``: where the job reads on.
    offsets: dict[str, int]
    #: The event-time frontier at the end of that batch, UTC ms (None: no event yet).
    frontier_ms: int | None
    #: That batch was the last of an ``availableNow`` run (``--once``): it released every event held.
    final: bool
    #: What routes events to state (``layout.json``; empty for a job without keyed state).
    layout: dict[str, int]
    #: The feature specs its state was built for (``features.compat.spec_record``; None: no feature state).
    features: dict[str, Any] | None
    files: int
    size_bytes: int
    #: The partitions of its Spark shuffles and state stores.
    shuffle_partitions: int
    format: int = FORMAT

    def to_json(self) -> dict[str, Any]:
        return {name: value for name, value in asdict(self).items() if name != "path"}

    @property
    def topics(self) -> set[str]:
        """The topics the job read."""
        return Position(self.offsets).topics


def default_location(home: Path, job: str, namespace: str = "", now: datetime | None = None) -> Path:
    """``FRAUD_HOME/savepoints/[<namespace>.]<job>-<UTC time>``."""
    stamp = (now or datetime.now(UTC)).strftime("%Y%m%dT%H%M%SZ")
    return home / "savepoints" / f"{namespace + '.' if namespace else ''}{job}-{stamp}"


def take(job: str, namespace: str, checkpoint: Path, to: Path) -> Savepoint:
    """Take a savepoint of the job whose checkpoint is ``checkpoint`` into ``to`` (new, or empty).

    Raises:
        ConfigError: ``to`` holds files.
        NotFoundError: there is no checkpoint of the job at ``checkpoint``.
        StateError: the job has committed no micro-batch yet, or its checkpoint changed under the copy.
    """
    if to.exists() and (not to.is_dir() or any(to.iterdir())):
        raise ConfigError(f"{to} is not an empty directory: a savepoint goes to a new one")
    made = not to.exists()
    to.mkdir(parents=True, exist_ok=True)
    copy = to / CHECKPOINT_COPY
    try:
        try:
            copied = copy_committed(checkpoint, copy, left_out=(RESTORED_FILE,))
        except NotFoundError:
            raise NotFoundError(
                f"no checkpoint of the {job} job at {checkpoint} (--checkpoint and --namespace say where "
                "the job keeps it)"
            ) from None
        except NothingCommittedError as exc:
            raise NothingCommittedError(f"{exc}: the {job} job has nothing to save yet") from None
        settle_ending(copy)  # what a run of a time range read past its end is not the savepoint's
        at = position_at(copy / QUERY_DIR, copied.batch)
        layout = copy / LAYOUT_FILE
        shuffle = read_batch_conf(copy / QUERY_DIR, copied.batch)[SHUFFLE_PARTITIONS]
        savepoint = Savepoint(
            path=to,
            id=uuid.uuid4().hex,
            job=job,
            namespace=namespace,
            created_at=datetime.now(UTC).isoformat(timespec="seconds"),
            checkpoint=str(checkpoint),
            batch=copied.batch,
            offsets=dict(sorted(at.offsets.items())),
            frontier_ms=at.frontier_ms,
            final=at.final,
            layout=json.loads(layout.read_text()) if layout.exists() else {},
            features=read_specs(copy),
            files=copied.files,
            size_bytes=copied.bytes,
            shuffle_partitions=int(shuffle),
        )
        written = to / f".{SAVEPOINT_FILE}.tmp"
        written.write_text(json.dumps(savepoint.to_json(), indent=1) + "\n")
        written.replace(to / SAVEPOINT_FILE)  # last: a directory with it is a whole savepoint
    except BaseException:
        if made:
            shutil.rmtree(to, ignore_errors=True)
        else:
            shutil.rmtree(copy, ignore_errors=True)
        raise
    return savepoint


def read(path: Path) -> Savepoint:
    """The savepoint in the directory ``path``.

    Raises:
        NotFoundError: nothing is at ``path``.
        ConfigError: ``path`` is not a savepoint, or one of a newer format.
        EarlierLayoutError: the savepoint is of a format older than this version's layout.
    """
    if not path.exists():
        raise NotFoundError(f"no savepoint at {path}")
    file = path / SAVEPOINT_FILE
    if not file.is_file():
        raise ConfigError(f"{path} is not a savepoint: it has no {SAVEPOINT_FILE}")
    try:
        values = json.loads(file.read_text())
        found = values.get("format", 1)
        if found > FORMAT:
            raise ConfigError(f"savepoint {path} has format {values['format']}, newer than this version's")
        if found < FORMAT:  # written before this version's layout
            raise earlier_layout(f"savepoint {path}")
        return Savepoint(path=path, **values)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"{file} cannot be read as a savepoint: {exc}") from None


def find(under: Path) -> list[Savepoint]:
    """The savepoints in the directories under ``under`` (and ``under`` itself), oldest first."""
    if not under.is_dir():
        return []
    places = [under, *sorted(p for p in under.iterdir() if p.is_dir())]
    found = [read(place) for place in places if (place / SAVEPOINT_FILE).is_file()]
    return sorted(found, key=lambda savepoint: savepoint.created_at)


def delete(path: Path) -> Savepoint:
    """Delete the savepoint at ``path`` (refused for a directory that is not one); the deleted savepoint."""
    savepoint = read(path)
    shutil.rmtree(path)
    return savepoint


def check_fits(
    savepoint: Savepoint,
    job: str,
    layout: Mapping[str, int] | None,
    params: FeatureParams | None,
    inputs: Sequence[str],
) -> None:
    """Raise :class:`SavepointMismatchError` (or ``features.compat.FeatureSpecsError``,
    ``features.entry_store.EarlierLayoutError``) unless the job ``job`` with ``layout`` (None: no keyed
    state), feature ``params`` (None: no feature state) and input topics ``inputs`` can continue from
    ``savepoint``: its features may differ from the state's when the state keeps the history they need
    (``features.compat.check_specs``), its layout's counts may differ when it is this version's layout
    (``features.state_layout``: the job is rescaled into them, :func:`start_from`)."""
    where = f"savepoint {savepoint.path}"
    if savepoint.job != job:
        raise SavepointMismatchError(f"{where} is of the {savepoint.job} job, not of the {job} job")
    if layout is not None:
        check_current(savepoint.layout, where)
    unread = sorted(savepoint.topics - set(inputs))
    if unread:
        raise SavepointMismatchError(
            f"{where} read {', '.join(sorted(savepoint.topics))}; this job reads {', '.join(inputs)}: "
            "check FRAUD_TOPICS__* (the savepoint's offsets are positions in its topics)"
        )
    if params is not None and savepoint.features is not None:
        check_specs(savepoint.features, params, where)


def layout_change(
    savepoint: Savepoint, layout: Mapping[str, int] | None, shuffle_partitions: int
) -> str | None:
    """What differs between the savepoint's layout and the job's (``layout``: its bucket counts, None for a
    job without keyed state; ``shuffle_partitions``: its Spark shuffle partitions), e.g. ``card_buckets 6
    -> 12``; None when nothing does and the savepoint restores by copy. A new page size is no change: the
    copy's first run records it (``features.entries.Layout.TUNABLE``)."""
    if layout is None:
        return None
    changes = [
        f"{name} {savepoint.layout[name]} -> {count}"
        for name, count in layout.items()
        if name not in Layout.TUNABLE and savepoint.layout[name] != count
    ]
    if savepoint.shuffle_partitions != shuffle_partitions:
        changes.append(f"shuffle partitions {savepoint.shuffle_partitions} -> {shuffle_partitions}")
    return ", ".join(changes) or None


How = Literal["copied", "resumed", "rescaled"]


@dataclass(frozen=True)
class Start:
    """How a job starts from a savepoint (:func:`start_from`)."""

    savepoint: Savepoint
    #: ``copied``: the checkpoint is the savepoint's copy, made now; ``resumed``: the checkpoint an earlier
    #: start made goes on; ``rescaled``: a new query starts in the checkpoint, its first micro-batch
    #: re-keys the savepoint's state (now, or again: its first micro-batch has not committed).
    how: How
    #: What a rescale changes (:func:`layout_change`).
    change: str | None = None
    #: For ``rescaled``: where the first micro-batch's state and the source's position come from.
    rescale: Rescale | None = None


def start_from(
    path: Path,
    checkpoint: Path,
    job: str,
    layout: Mapping[str, int] | None,
    params: FeatureParams | None,
    inputs: Sequence[str],
    shuffle_partitions: int,
) -> Start:
    """Start the job's ``checkpoint`` (new and empty) from the savepoint at ``path``, after checking that it
    fits the job (:func:`check_fits`): in the savepoint's layout by making it the savepoint's copy; in
    another (``layout``, ``shuffle_partitions``) by recording the rescale and the new layout in it, for a
    new query to start there (:class:`Start`). A checkpoint that an earlier start from the same savepoint
    made is resumed.

    Raises:
        SavepointMismatchError: the savepoint does not fit the job, or ``checkpoint`` holds another state.
    """
    savepoint = read(path)
    check_fits(savepoint, job, layout, params, inputs)
    change = layout_change(savepoint, layout, shuffle_partitions)
    if checkpoint.exists() and any(checkpoint.iterdir()):
        marker = checkpoint / RESTORED_FILE
        origin = json.loads(marker.read_text()) if marker.is_file() else {}
        if origin.get("id") != savepoint.id:
            raise SavepointMismatchError(
                f"checkpoint {checkpoint} is not empty: a job starts from a savepoint in a new checkpoint "
                "directory (give another --checkpoint or --namespace, or delete it)"
            )
        if "rescaled" in origin and last_committed(checkpoint / QUERY_DIR) is None:
            return Start(savepoint, "rescaled", origin["rescaled"], rescale_of(savepoint))
        return Start(savepoint, "resumed")
    origin = {"id": savepoint.id, "savepoint": str(path.resolve()), "batch": savepoint.batch}
    if change is None or layout is None:
        restore(path / CHECKPOINT_COPY, checkpoint, (RESTORED_FILE, json.dumps(origin) + "\n"))
        return Start(savepoint, "copied")
    rescale = rescale_of(savepoint)
    bind_layout(checkpoint, layout)
    if savepoint.features is not None:  # what the state was built for, as a copy would say it
        (checkpoint / SPECS_FILE).write_text(json.dumps(savepoint.features, indent=1) + "\n")
    marker = checkpoint / f".{RESTORED_FILE}.tmp"
    marker.write_text(json.dumps({**origin, "rescaled": change}) + "\n")
    marker.replace(checkpoint / RESTORED_FILE)
    return Start(savepoint, "rescaled", change, rescale)


def rescale_of(savepoint: Savepoint) -> Rescale:
    """Where a rescaled job takes its first state and input position from: the savepoint's copy of the
    query checkpoint at its micro-batch, and where that batch left the job's input.

    Raises:
        SavepointMismatchError: the savepoint's query keeps no frontier (it is not a job with keyed state).
    """
    query = savepoint.path / CHECKPOINT_COPY / QUERY_DIR
    position = position_at(query, savepoint.batch)
    if position.frontier is None:
        raise SavepointMismatchError(
            f"savepoint {savepoint.path} keeps no event-time frontier: only a job with keyed state is rescaled"
        )
    return Rescale(query, savepoint.batch, position)


def unfinished_rescale(checkpoint: Path) -> Path | None:
    """The savepoint a checkpoint was rescaled from, while the checkpoint's first micro-batch, which takes
    its state from it, has not committed (None: the checkpoint needs no savepoint)."""
    marker = checkpoint / RESTORED_FILE
    if not marker.is_file() or last_committed(checkpoint / QUERY_DIR) is not None:
        return None
    origin = json.loads(marker.read_text())
    return Path(origin["savepoint"]) if "rescaled" in origin else None


def iso_ms(ms: int | None) -> str:
    """UTC ISO 8601 of epoch milliseconds ("-" for None)."""
    return "-" if ms is None else datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="seconds")
