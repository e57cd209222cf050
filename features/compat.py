"""Which features a job's state was built for, and whether another version of the job can take it over.

The feature job's state holds events (card histories, terminal transactions and labels), kept as long as
its feature specs' windows need them. A job that resumes that state (a restart, or a start from a
savepoint) must compute the same features over the same windows, or it would compute features over
history its state never kept. So each checkpoint records the specs its state was built for
(:data:`SPECS_FILE`: each feature's name, dtype and window, and their fingerprint), savepoints carry that
record, and a run with other specs refuses to start, saying which features are missing or changed.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from contracts.errors import StateError
from features.definitions import FeatureSpec

#: The record of the feature specs a checkpoint's state was built for, at the checkpoint's root.
SPECS_FILE = "feature-specs.json"
#: What of a spec the state depends on (its meaning is documentation).
SPEC_FIELDS = ("name", "dtype", "window")

SpecRecord = dict[str, Any]


class FeatureSpecsError(StateError, ValueError):
    """A job's feature specs differ from those its state (a checkpoint, a savepoint) was built for."""


def spec_summary(specs: Iterable[FeatureSpec]) -> list[dict[str, str]]:
    """Each feature's name, dtype and window, in the specs' order."""
    return [{name: str(getattr(spec, name)) for name in SPEC_FIELDS} for spec in specs]


def spec_fingerprint(specs: Iterable[FeatureSpec]) -> str:
    """A short hash of the features' names, dtypes and windows: equal fingerprints, compatible states."""
    canonical = json.dumps(spec_summary(specs), separators=(",", ":"), sort_keys=True)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def spec_record(specs: Sequence[FeatureSpec]) -> SpecRecord:
    """The record kept in a checkpoint and a savepoint: the fingerprint and the summary it hashes."""
    return {"fingerprint": spec_fingerprint(specs), "features": spec_summary(specs)}


def spec_changes(saved: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    """What differs between two spec records (``saved``: the state's), one phrase per kind of change;
    empty when their fingerprints agree."""
    if saved.get("fingerprint") == current.get("fingerprint"):
        return []
    before = {feature["name"]: feature for feature in saved.get("features", [])}
    after = {feature["name"]: feature for feature in current.get("features", [])}
    changes = []
    missing = [name for name in after if name not in before]
    if missing:
        changes.append(f"features missing from the state: {', '.join(missing)}")
    dropped = [name for name in before if name not in after]
    if dropped:
        changes.append(f"features the state has that this job lacks: {', '.join(dropped)}")
    for field in ("window", "dtype"):
        changed = [
            f"{name} ({before[name][field]} -> {after[name][field]})"
            for name in after
            if name in before and before[name][field] != after[name][field]
        ]
        if changed:
            changes.append(f"changed {field}s: {', '.join(changed)}")
    return changes or ["the features' order differs"]


def check_specs(saved: Mapping[str, Any], specs: Sequence[FeatureSpec], where: str) -> None:
    """Raise :class:`FeatureSpecsError` when ``specs`` differ from the ``saved`` record of ``where`` (a
    checkpoint, a savepoint), naming what differs."""
    changes = spec_changes(saved, spec_record(specs))
    if changes:
        raise FeatureSpecsError(
            f"{where} holds state built for other features ({'; '.join(changes)}): run the job with the "
            "feature options its state was built for, or with a new checkpoint (a replay of the history)"
        )


def bind_specs(checkpoint: Path, specs: Sequence[FeatureSpec]) -> None:
    """Record ``specs`` in a checkpoint that has no record yet (a new one, or one written before records
    were kept), or check them against its record.

    Raises:
        FeatureSpecsError: the checkpoint's state was built for other specs.
    """
    checkpoint.mkdir(parents=True, exist_ok=True)
    path = checkpoint / SPECS_FILE
    if path.exists():
        check_specs(json.loads(path.read_text()), specs, f"checkpoint {checkpoint}")
        return
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(spec_record(specs), indent=1) + "\n")
    temporary.replace(path)


def read_specs(checkpoint: Path) -> SpecRecord | None:
    """The spec record of a checkpoint (None: it has none, e.g. the scoring job's)."""
    path = checkpoint / SPECS_FILE
    return json.loads(path.read_text()) if path.exists() else None
