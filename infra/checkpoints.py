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
from collections.abc import Callable, Mapping
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


def bind_layout(
    checkpoint: Path, layout: Mapping[str, int], made_before_layouts: Mapping[str, int] | None = None
) -> None:
    """Record ``layout`` in a new checkpoint, or check that an existing one was written with it.

    Args:
        checkpoint: the job's checkpoint directory (created if missing).
        layout: what routes events to state, e.g. ``{"card_buckets": 6, "terminal_buckets": 6}``.
        made_before_layouts: the layout of checkpoints written before layouts were recorded (a checkpoint
            with content but no layout file); ``None``: such a checkpoint is an error.

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
    if found != wanted:
        raise CheckpointLayoutError(
            f"checkpoint {checkpoint} holds state written with {found}, this run asks for {wanted}: "
            "resume it with the same settings, or rescale it through a savepoint (`fraud savepoint create`, "
            "then run with `--from-savepoint` into a new checkpoint)"
        )
    if not path.exists():
        path.write_text(json.dumps(wanted, sort_keys=True) + "\n")


def pinned_layout(checkpoint: Path, layout: Mapping[str, int], file: str = "pinned.json") -> dict[str, int]:
    """The layout the checkpoint's first run recorded (``layout`` itself, recorded now, on a first run);
    settings added since are recorded with their value in ``layout``."""
    checkpoint.mkdir(parents=True, exist_ok=True)
    path = checkpoint / file
    found = json.loads(path.read_text()) if path.exists() else {}
    pinned = {**layout, **found}
    if pinned != found:
        temporary = path.with_suffix(".tmp")
        temporary.write_text(json.dumps(pinned, sort_keys=True) + "\n")
        temporary.replace(path)
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
        temporary = self.path.with_suffix(".tmp")
        temporary.write_text(json.dumps(self.values))
        os.replace(temporary, self.path)
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
