"""Savepoints of the streaming jobs, and how a job starts: from its checkpoint, or from a savepoint.

A savepoint is a job's state, source offsets, event-time frontier and layout as one committed micro-batch
left them, taken while the job runs; a job started from one continues from there. It is a directory:
``savepoint.json`` (what it holds, :class:`Savepoint`) and ``checkpoint/``, the job's checkpoint as it stood
when its last committed micro-batch ended (``infra.spark.checkpoint``). It can live anywhere the job's Spark
sees (a local directory, a mount the cluster shares) and be moved as a whole.

Every run of a job starts through :func:`plan_start`, before Spark starts. Without a savepoint, the job's
checkpoint starts or resumes as it is. With one, the job starts in a new, empty checkpoint directory once the
savepoint is found to fit the job (:func:`check_fits`): the same job, the same input topics, state kept in
this version's layout (``features.state_layout``: an earlier layout's is refused, with the way to move it)
and feature specs its state can serve (``features.compat``). In the same layout (bucket counts and shuffle
partitions) the checkpoint becomes the savepoint's copy, and the job goes on as a restart would. In another
layout it is *rescaled*: the checkpoint starts a new query whose first micro-batch takes the savepoint's
state re-keyed into the new buckets (``features.rescale``) and whose source starts at the savepoint's end
offset; the checkpoint records the layout change and, once that batch has committed, needs the savepoint no
more. Either way its sink gets a new id: the job the savepoint was taken from may have written later
batches, and may even still run. Run again with the same savepoint, a job resumes the checkpoint that its
first start made (a rescaled one whose first micro-batch did not commit starts it again, from the
savepoint, with or without ``--from-savepoint``). Either way the checkpoint is then checked whole and bound
to the job's state, once (``features.state_layout.bind``).
"""

from __future__ import annotations

import json
import shutil
import uuid
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, ClassVar, Literal, Protocol

from contracts.errors import ConfigError, NotFoundError, StateError
from contracts.settings import JobName
from features.rescale import Rescale
from features.state_layout import (
    Start,
    StateRecord,
    StateSpec,
    bind,
    check,
    earlier_layout,
    layout_changes,
    recorded,
)
from infra.spark.checkpoint import (
    QUERY_DIR,
    NothingCommittedError,
    check_intact,
    copy_committed,
    last_committed,
    query_location,
    read_batch_conf,
    replace_text,
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

    @property
    def state(self) -> StateRecord:
        """What it records of its keyed state (``features.state_layout``)."""
        return StateRecord(self.layout, self.features)


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
        state = recorded(copy) or StateRecord({})
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
            layout=dict(state.layout),
            features=state.specs,
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


class JobToStart(Protocol):
    """What a start needs of a job (``fraud.jobs.Job`` has it): its name, checkpoint, input topics and the
    state it keeps (None: no keyed state)."""

    name: ClassVar[JobName]

    @property
    def checkpoint(self) -> Path: ...
    @property
    def inputs(self) -> tuple[str, ...]: ...
    @property
    def state(self) -> StateSpec | None: ...


def check_fits(savepoint: Savepoint, job: JobToStart) -> None:
    """Raise unless ``job`` can continue from ``savepoint``: the same job and input topics, and for a job
    with keyed state, a state kept in this version's layout (its counts may differ: the job is rescaled
    into its own) with the history its features need (``features.state_layout.check``).

    Raises:
        SavepointMismatchError: another job, or other input topics.
        EarlierLayoutError: the savepoint's state is kept in an earlier layout (one line: how to move it).
        FeatureSpecsError: the job's features look further back than the savepoint's state keeps events.
    """
    where = f"savepoint {savepoint.path}"
    if savepoint.job != job.name:
        raise SavepointMismatchError(f"{where} is of the {savepoint.job} job, not of the {job.name} job")
    unread = sorted(savepoint.topics - set(job.inputs))
    if unread:
        raise SavepointMismatchError(
            f"{where} read {', '.join(sorted(savepoint.topics))}; this job reads {', '.join(job.inputs)}: "
            "check FRAUD_TOPICS__* (the savepoint's offsets are positions in its topics)"
        )
    if job.state is not None:
        check(savepoint.state, job.state, where)


def layout_change(savepoint: Savepoint, state: StateSpec | None, shuffle_partitions: int) -> str | None:
    """What differs between the savepoint's layout and the job's (``state``: None for a job without keyed
    state; ``shuffle_partitions``: its Spark shuffle partitions), e.g. ``card_buckets 6 -> 12``; None when
    nothing does and the savepoint restores by copy. A new page size is no change: the copy's first run
    records it (``features.entries.Layout.TUNABLE``)."""
    if state is None:
        return None
    changes = layout_changes(savepoint.layout, state.layout)
    if savepoint.shuffle_partitions != shuffle_partitions:
        changes.append(f"shuffle partitions {savepoint.shuffle_partitions} -> {shuffle_partitions}")
    return ", ".join(changes) or None


How = Literal["copied", "resumed", "rescaled"]


@dataclass(frozen=True)
class Plan:
    """How a job starts (:func:`plan_start`): its query's start, and what a savepoint has to do with it."""

    start: Start
    #: ``copied``: the checkpoint is the savepoint's copy, made now; ``resumed``: the checkpoint an earlier
    #: start from the savepoint made goes on; ``rescaled``: a new query starts in the checkpoint, its first
    #: micro-batch re-keys the savepoint's state (now, or again: its first micro-batch has not committed).
    #: None: the checkpoint is started or resumed without one.
    how: How | None = None
    savepoint: Savepoint | None = None
    #: What a rescale changes (:func:`layout_change`).
    change: str | None = None

    def describe(self, checkpoint: Path) -> str | None:
        """The line that tells what a start from the savepoint does (None: there is none)."""
        if self.savepoint is None:
            return None
        where = (
            f"savepoint {self.savepoint.path} (batch {self.savepoint.batch}, frontier "
            f"{iso_ms(self.savepoint.frontier_ms)})"
        )
        if self.how == "copied":
            return f"Starting from {where} in checkpoint {checkpoint}."
        if self.how == "resumed":
            return f"Resuming checkpoint {checkpoint}, started from {where}."
        return (
            f"Starting from {where} in checkpoint {checkpoint}, rescaled ({self.change}): the first "
            "micro-batch re-keys the savepoint's state."
        )


def plan_start(job: JobToStart, from_savepoint: Path | None, shuffle_partitions: int) -> Plan:
    """Make ``job``'s checkpoint ready for its query, before Spark starts, and say how the query starts.

    From its checkpoint as it is (a new one, or a restart); or from the savepoint at ``from_savepoint`` once
    it fits the job (:func:`check_fits`), into a new, empty checkpoint: in the savepoint's layout (bucket
    counts, ``shuffle_partitions``) the checkpoint becomes the savepoint's copy, in another the query is
    rescaled (its first micro-batch re-keys the savepoint's state, ``features.rescale``). A checkpoint an
    earlier start from the same savepoint made is resumed, and rescaled again, with or without
    ``from_savepoint``, while its first micro-batch has not committed. Then the checkpoint is checked whole
    (``infra.spark.checkpoint.check_intact``) and bound to the job's state (``features.state_layout.bind``).

    Raises:
        StateError: the savepoint does not fit the job, the checkpoint holds another state (of another
            savepoint, an earlier layout, other counts or features), or it is damaged.
    """
    checkpoint = job.checkpoint
    origin = restored_from(checkpoint)
    unfinished = "rescaled" in origin and last_committed(query_location(checkpoint)) is None
    path = from_savepoint or (Path(origin["savepoint"]) if unfinished else None)
    plan = (
        Plan(Start()) if path is None else _plan_from(read(path), job, origin, unfinished, shuffle_partitions)
    )
    if plan.savepoint is not None and plan.how == "copied":
        restore(plan.savepoint.path / CHECKPOINT_COPY, checkpoint, (RESTORED_FILE, _origin(plan.savepoint)))
    check_intact(checkpoint)
    if job.state is not None:
        bind(checkpoint, job.state)
    if plan.savepoint is not None and plan.how == "rescaled" and not origin:
        # Recorded last: a checkpoint that names the savepoint it is rescaled from has its layout.
        replace_text(checkpoint / RESTORED_FILE, _origin(plan.savepoint, plan.change))
    return plan


def _plan_from(
    savepoint: Savepoint, job: JobToStart, origin: dict[str, Any], unfinished: bool, shuffle_partitions: int
) -> Plan:
    """How ``job`` starts from ``savepoint`` in its checkpoint, whose start from a savepoint is ``origin``
    (``restored-from.json``; empty: none), ``unfinished`` while that start's rescale has not committed."""
    check_fits(savepoint, job)
    if job.checkpoint.exists() and any(job.checkpoint.iterdir()):
        if origin.get("id") != savepoint.id:
            raise SavepointMismatchError(
                f"checkpoint {job.checkpoint} is not empty: a job starts from a savepoint in a new checkpoint "
                "directory (give another --checkpoint or --namespace, or delete it)"
            )
        if unfinished:
            return Plan(Start(rescale_of(savepoint)), "rescaled", savepoint, origin["rescaled"])
        return Plan(Start(), "resumed", savepoint)
    change = layout_change(savepoint, job.state, shuffle_partitions)
    if change is None:
        return Plan(Start(), "copied", savepoint)
    return Plan(Start(rescale_of(savepoint)), "rescaled", savepoint, change)


def _origin(savepoint: Savepoint, rescaled: str | None = None) -> str:
    """The text of ``restored-from.json`` in a checkpoint started from ``savepoint``: which one, and what a
    rescale changed."""
    origin = {"id": savepoint.id, "savepoint": str(savepoint.path.resolve()), "batch": savepoint.batch}
    return json.dumps(origin if rescaled is None else {**origin, "rescaled": rescaled}) + "\n"


def restored_from(checkpoint: Path) -> dict[str, Any]:
    """Which savepoint ``checkpoint`` was started from (``restored-from.json``: its id and path, and what a
    rescale changed); empty when it was not."""
    marker = checkpoint / RESTORED_FILE
    return json.loads(marker.read_text()) if marker.is_file() else {}


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


def iso_ms(ms: int | None) -> str:
    """UTC ISO 8601 of epoch milliseconds ("-" for None)."""
    return "-" if ms is None else datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="seconds")
