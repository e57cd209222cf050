"""Which features a job's state was built for, and whether another version of the job can take it over.

The feature job's state holds events (card histories, terminal transactions and labels), not aggregates:
each feature is computed from them when a transaction is released. The state keeps them as far back as its
features look (their *span*: the longest card window; the longest terminal window plus the label delay),
plus the allowed lateness. So another version of the job can take a state over (a restart, a start from a
savepoint) when its features look back no further than the state's: it may add features (another window,
within the longest), drop some, or change a label delay to a shorter one, and its first micro-batch
computes them all from the events kept. A version whose features look further back refuses the state,
naming them: the history they need was never kept, and only a replay of it can give it.

Each checkpoint records the specs its state was built for (:data:`SPECS_FILE`: each feature's name, dtype
and window, their fingerprint, the spans, and the parameters they come from; ``features.state_layout`` writes
it), savepoints carry that record, and a job that takes the state over with other specs records its own (the
state it leaves behind is pruned to its spans). What reads the state (``fraud state``, the API) computes the features it shows with the
recorded parameters.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from contracts.errors import StateError
from features.definitions import DAY_MS, FeatureParams, FeatureSpec

#: The record of the feature specs a checkpoint's state was built for, at the checkpoint's root.
SPECS_FILE = "feature-specs.json"
#: What of a spec the record keeps (its meaning is documentation).
SPEC_FIELDS = ("name", "dtype", "window")
#: The spans of the record (``FeatureParams.card_span_ms``, ``terminal_span_ms``), by state.
SPANS = ("card", "terminal")

SpecRecord = dict[str, Any]


class FeatureSpecsError(StateError, ValueError):
    """A job's features look further back than the state (a checkpoint, a savepoint) keeps events."""


def spec_summary(specs: Iterable[FeatureSpec]) -> list[dict[str, str]]:
    """Each feature's name, dtype and window, in the specs' order."""
    return [{name: str(getattr(spec, name)) for name in SPEC_FIELDS} for spec in specs]


def spec_fingerprint(specs: Iterable[FeatureSpec]) -> str:
    """A short hash of the features' names, dtypes and windows: equal fingerprints, the same features."""
    canonical = json.dumps(spec_summary(specs), separators=(",", ":"), sort_keys=True)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def spans(params: FeatureParams) -> dict[str, int]:
    """How far back each state's features look, in event-time ms (the allowed lateness aside)."""
    return {"card": params.card_span_ms, "terminal": params.terminal_span_ms}


def spec_record(params: FeatureParams) -> SpecRecord:
    """The record kept in a checkpoint and a savepoint: the fingerprint, the specs it hashes, the spans and
    the parameters (windows, label delay, lateness)."""
    return {
        "fingerprint": spec_fingerprint(params.specs),
        "features": spec_summary(params.specs),
        "span_ms": spans(params),
        "params": params.model_dump(mode="json"),
    }


def recorded_params(record: SpecRecord | None) -> FeatureParams | None:
    """The feature parameters a spec record was written with (None: no record)."""
    return None if record is None else FeatureParams.model_validate(record["params"])


def spec_changes(saved: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    """What differs between two spec records (``saved``: the state's), one phrase per kind of change;
    empty when their fingerprints agree."""
    if saved.get("fingerprint") == current.get("fingerprint"):
        return []
    before = {feature["name"]: feature for feature in saved.get("features", [])}
    after = {feature["name"]: feature for feature in current.get("features", [])}
    changes = []
    added = [name for name in after if name not in before]
    if added:
        changes.append(f"features added: {', '.join(added)}")
    dropped = [name for name in before if name not in after]
    if dropped:
        changes.append(f"features dropped: {', '.join(dropped)}")
    for field in ("window", "dtype"):
        changed = [
            f"{name} ({before[name][field]} -> {after[name][field]})"
            for name in after
            if name in before and before[name][field] != after[name][field]
        ]
        if changed:
            changes.append(f"changed {field}s: {', '.join(changed)}")
    return changes or ["the features' order differs"]


def _days(ms: int) -> str:
    return f"{ms / DAY_MS:g} d"


def check_specs(saved: Mapping[str, Any], params: FeatureParams, where: str) -> list[str]:
    """Whether a job with ``params`` can take over the state of ``where`` (a checkpoint, a savepoint) whose
    record is ``saved``: what differs (empty: nothing), when it can.

    Raises:
        FeatureSpecsError: its features look further back than the state keeps events, naming what differs.
    """
    changes = spec_changes(saved, spec_record(params))
    if not changes:
        return []
    kept = saved["span_ms"]
    short = [
        f"the {state} features look back {_days(need)}, the state keeps {_days(kept[state])}"
        for state, need in spans(params).items()
        if need > int(kept.get(state, 0))
    ]
    if short:
        raise FeatureSpecsError(
            f"{where} holds state built for other features ({'; '.join(changes)}) and lacks the history "
            f"they need ({'; '.join(short)}): replay that history into a new checkpoint (--from as far "
            "back before the point to take over, in a namespace of its own), or keep the features' spans"
        )
    return changes


def read_specs(checkpoint: Path) -> SpecRecord | None:
    """The spec record of a checkpoint (None: it has none, e.g. the scoring job's)."""
    path = checkpoint / SPECS_FILE
    return json.loads(path.read_text()) if path.exists() else None
