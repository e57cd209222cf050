"""The layout of the feature job's state that this version reads, and the refusal of any other.

A checkpoint of the feature job (or of the pipeline) records its layout (``features.entries.Layout``: the
buckets, slots, page size and entry format) in ``layout.json``; a savepoint carries it. This version reads
one layout: pages of entries stored as seven-bit text, ``entry_format`` 2 (``features.entry_store``), what
kappa-fraud has written since commit 9ee7c17. State kept in an earlier layout (one value per bucket, an entry
per slot, pages stored as bytes or as base64) is refused in one line that says how to move it: through the
last version that reads both (``features.entry_store.LAST_READER_OF_EARLIER_LAYOUTS``), or by a replay.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields

from features.entries import Layout
from features.entry_store import ENTRY_FORMAT, MOVE_EARLIER_STATE, EarlierLayoutError

#: The fields a layout of this version records.
LAYOUT_FIELDS = frozenset(field.name for field in fields(Layout))


def earlier_layout(where: str) -> EarlierLayoutError:
    """The refusal of the state at ``where`` (``checkpoint PATH``, ``savepoint PATH``), kept in an earlier
    layout: one line, with the way to move it."""
    return EarlierLayoutError(
        f"{where} keeps its state in an earlier layout than this version's (entry_format {ENTRY_FORMAT}): "
        f"{MOVE_EARLIER_STATE}"
    )


def check_current(layout: Mapping[str, int], where: str) -> None:
    """Refuse state recorded with ``layout`` at ``where`` unless it is kept in this version's layout (its
    counts may differ: a savepoint rescales them).

    Raises:
        EarlierLayoutError: :func:`earlier_layout`.
    """
    if set(layout) != LAYOUT_FIELDS or layout.get("entry_format") != ENTRY_FORMAT:
        raise earlier_layout(where)
