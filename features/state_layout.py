"""What a feature job's checkpoint records of its state, checked and written once per start; the one layout
this version reads; and how the job's query starts (:class:`Start`).

A checkpoint of the feature job (or of the pipeline) records beside Spark's query, in files ``fraud state``
and the API read too:

- ``layout.json``: what routes events to state (``features.entries.Layout``: buckets, slots, page size,
  entry format). Spark checks the state's schema on restart, not its routing: resumed with other counts,
  the job would read each card's history from the wrong bucket and compute wrong features without an
  error. So the counts are fixed for the checkpoint's life (a savepoint moves state between them,
  ``features.rescale``); the page size may change on any restart (``Layout.TUNABLE``).
- ``feature-specs.json``: the features its state was built for (``features.compat``): a job whose features
  look further back than the state keeps events is refused.

A savepoint carries both (``fraud.savepoints``). :func:`bind` is their one writer, run once per start
before Spark starts.

This version reads one layout: pages of entries stored as seven-bit text, ``entry_format`` 2
(``features.entry_store``), what kappa-fraud has written since commit 9ee7c17. State kept in an earlier
layout (one value per bucket, an entry per slot, pages stored as bytes or as base64) is refused in one line
that says how to move it (:func:`earlier_layout`): through the last version that reads both
(``features.entry_store.LAST_READER_OF_EARLIER_LAYOUTS``), or by a replay.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path

from contracts.errors import StateError
from features.compat import SPECS_FILE, SpecRecord, check_specs, read_specs, spec_record
from features.definitions import FeatureParams
from features.entries import Layout
from features.entry_store import ENTRY_FORMAT, MOVE_EARLIER_STATE, EarlierLayoutError
from features.rescale import Rescale
from infra.spark.checkpoint import replace_text

#: The record of a checkpoint's layout, at its root.
LAYOUT_FILE = "layout.json"
#: The fields a layout of this version records.
LAYOUT_FIELDS = frozenset(field.name for field in fields(Layout))

_log = logging.getLogger(__name__)


class CheckpointLayoutError(StateError, ValueError):
    """A checkpoint was written with other bucket or slot counts than the ones this run asks for."""


@dataclass(frozen=True)
class StateSpec:
    """What a job keeps its features' state for: the layout it routes events by and its features."""

    layout: Layout
    params: FeatureParams


@dataclass(frozen=True)
class StateRecord:
    """What a checkpoint or a savepoint records of its state: its layout as recorded (empty: none) and its
    spec record (None: none)."""

    layout: Mapping[str, int]
    specs: SpecRecord | None = None


@dataclass(frozen=True)
class Start:
    """How a job's query starts in its checkpoint, once :func:`bind` has checked it: as the checkpoint
    holds it (a new one, a restart, a savepoint's copy), or rescaled: its first micro-batch re-keys a
    savepoint's state into the job's layout and its input starts where that state's stood
    (``features.rescale``)."""

    rescale: Rescale | None = None


def earlier_layout(where: str) -> EarlierLayoutError:
    """The refusal of the state at ``where`` (``checkpoint PATH``, ``savepoint PATH``), kept in an earlier
    layout: one line, with the way to move it."""
    return EarlierLayoutError(
        f"{where} keeps its state in an earlier layout than this version's (entry_format {ENTRY_FORMAT}): "
        f"{MOVE_EARLIER_STATE}"
    )


def check_current(layout: Mapping[str, int], where: str) -> None:
    """Refuse the state recorded with ``layout`` at ``where`` unless it is kept in this version's layout.

    Raises:
        EarlierLayoutError: :func:`earlier_layout`.
    """
    if set(layout) != LAYOUT_FIELDS or layout.get("entry_format") != ENTRY_FORMAT:
        raise earlier_layout(where)


def check(found: StateRecord, spec: StateSpec, where: str) -> list[str]:
    """Whether a job with ``spec`` can take over the state recorded as ``found`` at ``where``: kept in this
    version's layout (its counts may differ: a savepoint rescales them), with the history its features need;
    what its features change (empty: nothing).

    Raises:
        EarlierLayoutError: the state is kept in an earlier layout (:func:`earlier_layout`).
        FeatureSpecsError: the job's features look further back than the state keeps events.
    """
    check_current(found.layout, where)
    return [] if found.specs is None else check_specs(found.specs, spec.params, where)


def layout_changes(found: Mapping[str, int], layout: Layout) -> list[str]:
    """What differs between a layout of this version as recorded (``found``) and ``layout``, as ``name old ->
    new``; the page size aside (``Layout.TUNABLE``)."""
    return [
        f"{name} {found[name]} -> {value}"
        for name, value in layout.as_record().items()
        if name not in Layout.TUNABLE and found[name] != value
    ]


def recorded(checkpoint: Path) -> StateRecord | None:
    """What ``checkpoint`` records of its state (None: it is new, or empty). A checkpoint with files but no
    layout records an empty one: a version that recorded none wrote it."""
    path = checkpoint / LAYOUT_FILE
    if path.is_file():
        return StateRecord(json.loads(path.read_text()), read_specs(checkpoint))
    if checkpoint.is_dir() and any(checkpoint.iterdir()):
        return StateRecord({}, read_specs(checkpoint))
    return None


def bind(checkpoint: Path, spec: StateSpec) -> list[str]:
    """Bind ``checkpoint`` to ``spec`` before its query starts: check what it records (:func:`check`, and the
    same bucket and slot counts), then record ``spec``'s layout and feature specs in it (the one writer of
    both). What the job's features change from the state's (empty: nothing) is logged and returned.

    Raises:
        EarlierLayoutError: the checkpoint keeps its state in an earlier layout.
        CheckpointLayoutError: it holds state of other bucket or slot counts.
        FeatureSpecsError: the job's features look further back than its state keeps events.
    """
    found = recorded(checkpoint)
    layout, specs = spec.layout.as_record(), spec_record(spec.params)
    changes: list[str] = []
    if found is not None:
        where = f"checkpoint {checkpoint}"
        changes = check(found, spec, where)
        if layout_changes(found.layout, spec.layout):
            raise CheckpointLayoutError(
                f"{where} holds state written with {dict(found.layout)}, this run asks for {layout}: resume it "
                "with the same settings, or rescale it through a savepoint (`fraud savepoint create`, then run "
                "with `--from-savepoint` into a new checkpoint)"
            )
    checkpoint.mkdir(parents=True, exist_ok=True)
    if found is None or found.layout != layout:
        replace_text(checkpoint / LAYOUT_FILE, json.dumps(layout, sort_keys=True) + "\n")
    if found is None or found.specs != specs:
        replace_text(checkpoint / SPECS_FILE, json.dumps(specs, indent=1) + "\n")
    if changes:
        _log.warning("The job takes over state built for other features (%s)", "; ".join(changes))
    return changes
