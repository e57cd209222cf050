"""The record of the feature specs a state was built for: its fingerprint, what differs, and a checkpoint
bound to it."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from features.compat import (
    SPECS_FILE,
    FeatureSpecsError,
    bind_specs,
    read_specs,
    spec_changes,
    spec_fingerprint,
    spec_record,
)
from features.definitions import DAY_MS, DEFAULT_PARAMS, FeatureParams

SPECS = DEFAULT_PARAMS.specs


def test_the_fingerprint_hashes_names_dtypes_and_windows_only() -> None:
    fingerprint = spec_fingerprint(SPECS)
    assert fingerprint == spec_fingerprint(FeatureParams().specs) and len(fingerprint) == 16
    reworded = tuple(dataclasses.replace(spec, meaning="another text") for spec in SPECS)
    assert spec_fingerprint(reworded) == fingerprint, "the meaning is documentation"
    assert spec_fingerprint(FeatureParams(max_lateness_ms=DAY_MS).specs) == fingerprint
    assert spec_fingerprint(FeatureParams(label_delay_ms=3 * DAY_MS).specs) != fingerprint
    assert spec_fingerprint(FeatureParams(window_days=(1, 7, 28)).specs) != fingerprint
    retyped = (dataclasses.replace(SPECS[0], dtype="float64"), *SPECS[1:])
    assert spec_fingerprint(retyped) != fingerprint
    assert spec_fingerprint(SPECS[:-1]) != fingerprint


def test_what_differs_is_named() -> None:
    saved = spec_record(SPECS)
    assert spec_changes(saved, spec_record(SPECS)) == []
    added = spec_record((*SPECS, dataclasses.replace(SPECS[0], name="card_nb_tx_2d", window="2 d")))
    assert spec_changes(saved, added) == ["features missing from the state: card_nb_tx_2d"]
    assert spec_changes(added, saved) == ["features the state has that this job lacks: card_nb_tx_2d"]
    delayed = spec_record(FeatureParams(label_delay_ms=3 * DAY_MS).specs)
    (windows,) = spec_changes(saved, delayed)
    assert windows.startswith("changed windows: terminal_nb_tx_1d (1 d, 7 d before -> 1 d, 3 d before)")
    retyped = spec_record((dataclasses.replace(SPECS[0], dtype="float64"), *SPECS[1:]))
    assert spec_changes(saved, retyped) == ["changed dtypes: card_nb_tx_1d (int64 -> float64)"]
    assert spec_changes(saved, spec_record(SPECS[::-1])) == ["the features' order differs"]


def test_a_checkpoint_keeps_its_first_runs_specs_and_refuses_others(tmp_path: Path) -> None:
    assert read_specs(tmp_path) is None
    bind_specs(tmp_path, SPECS)
    assert json.loads((tmp_path / SPECS_FILE).read_text()) == read_specs(tmp_path) == spec_record(SPECS)
    bind_specs(tmp_path, FeatureParams(max_lateness_ms=5).specs)  # lateness is not in the specs
    with pytest.raises(FeatureSpecsError, match=r"checkpoint .* other features \(changed windows: terminal"):
        bind_specs(tmp_path, FeatureParams(label_delay_ms=DAY_MS).specs)
    assert read_specs(tmp_path) == spec_record(SPECS)
