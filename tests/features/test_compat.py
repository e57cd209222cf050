"""The record of the feature specs a state was built for: its fingerprint, what differs, which features a
state can serve, and the parameters it gives back (``features.state_layout`` binds a checkpoint to it)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from features.compat import (
    FeatureSpecsError,
    check_specs,
    recorded_params,
    spec_changes,
    spec_fingerprint,
    spec_record,
)
from features.definitions import DAY_MS, DEFAULT_PARAMS, HOUR_MS, FeatureParams

SPECS = DEFAULT_PARAMS.specs


def test_the_fingerprint_hashes_names_dtypes_and_windows_only() -> None:
    fingerprint = spec_fingerprint(SPECS)
    assert fingerprint == spec_fingerprint(FeatureParams().specs) and len(fingerprint) == 16
    reworded = tuple(dataclasses.replace(spec, meaning="another text") for spec in SPECS)
    assert spec_fingerprint(reworded) == fingerprint, "the meaning is documentation"
    assert spec_fingerprint(FeatureParams(allowed_lateness_ms=DAY_MS).specs) == fingerprint
    assert spec_fingerprint(FeatureParams(label_delay_ms=3 * DAY_MS).specs) != fingerprint
    assert spec_fingerprint(FeatureParams(window_days=(1, 7, 28)).specs) != fingerprint
    retyped = (dataclasses.replace(SPECS[0], dtype="float64"), *SPECS[1:])
    assert spec_fingerprint(retyped) != fingerprint
    assert spec_fingerprint(SPECS[:-1]) != fingerprint


def test_the_record_keeps_how_far_back_the_features_look() -> None:
    assert spec_record(DEFAULT_PARAMS)["span_ms"] == {"card": 30 * DAY_MS, "terminal": 37 * DAY_MS}
    longer = FeatureParams(window_days=(1, 7, 60), label_delay_ms=DAY_MS, allowed_lateness_ms=HOUR_MS)
    assert spec_record(longer)["span_ms"] == {"card": 60 * DAY_MS, "terminal": 61 * DAY_MS}


def test_what_differs_is_named() -> None:
    saved = spec_record(DEFAULT_PARAMS)
    assert spec_changes(saved, spec_record(DEFAULT_PARAMS)) == []
    added = spec_record(FeatureParams(window_days=(1, 2, 7, 30)))
    names = (
        "card_nb_tx_2d, card_avg_amount_2d, terminal_nb_tx_2d, terminal_risk_2d, card_prior_amount_ratio_2d, "
        "card_amount_zscore_2d, terminal_nb_fraud_2d"
    )
    assert spec_changes(saved, added) == [f"features added: {names}"]
    assert spec_changes(added, saved) == [f"features dropped: {names}"]
    delayed = spec_record(FeatureParams(label_delay_ms=3 * DAY_MS))
    (windows,) = spec_changes(saved, delayed)
    assert windows.startswith("changed windows: terminal_nb_tx_1d (1 d, 7 d before -> 1 d, 3 d before)")
    retyped = {**saved, "fingerprint": "x", "features": [{**saved["features"][0], "dtype": "float64"}]}
    assert spec_changes(saved, retyped)[-1] == "changed dtypes: card_nb_tx_1d (int64 -> float64)"
    reordered = {**saved, "fingerprint": "x", "features": saved["features"][::-1]}
    assert spec_changes(saved, reordered) == ["the features' order differs"]


def test_a_state_serves_the_features_that_look_back_no_further_than_it_keeps() -> None:
    saved = spec_record(DEFAULT_PARAMS)
    assert check_specs(saved, DEFAULT_PARAMS, "here") == []
    assert check_specs(saved, FeatureParams(window_days=(1, 7, 14, 30)), "here") == [
        "features added: card_nb_tx_14d, card_avg_amount_14d, terminal_nb_tx_14d, terminal_risk_14d, "
        "card_prior_amount_ratio_14d, card_amount_zscore_14d, terminal_nb_fraud_14d"
    ]
    assert check_specs(saved, FeatureParams(window_days=(1, 7)), "here") == [
        "features added: card_amount_ratio_7d",
        "features dropped: card_nb_tx_30d, card_avg_amount_30d, terminal_nb_tx_30d, terminal_risk_30d, "
        "card_amount_ratio_30d, card_prior_amount_ratio_30d, card_amount_zscore_30d, terminal_nb_fraud_30d",
        "changed windows: card_secs_since_prev_tx (30 d -> 7 d), card_nb_unusual_7d (7 d, 30 d -> 7 d, 7 d), "
        "terminal_days_since_first_fraud (30 d, 7 d before -> 7 d, 7 d before)",
    ]
    assert check_specs(saved, FeatureParams(label_delay_ms=DAY_MS), "here")  # a shorter delay: served
    assert check_specs(saved, FeatureParams(allowed_lateness_ms=DAY_MS), "here") == []  # lateness aside
    with pytest.raises(
        FeatureSpecsError,
        match=r"^here holds state built for other features \(features added: card_nb_tx_45d, .*\) and "
        r"lacks the history they need \(the card features look back 45 d, the state keeps 30 d; the "
        r"terminal features look back 52 d, the state keeps 37 d\): replay",
    ):
        check_specs(saved, FeatureParams(window_days=(1, 7, 30, 45)), "here")
    with pytest.raises(FeatureSpecsError, match=r"the terminal features look back 44 d, the state keeps 37"):
        check_specs(saved, FeatureParams(label_delay_ms=14 * DAY_MS), "here")


def test_the_record_gives_back_the_parameters_of_the_job_that_wrote_it(tmp_path: Path) -> None:
    params = FeatureParams(window_days=(1, 7, 14, 30), label_delay_ms=3 * DAY_MS, allowed_lateness_ms=60_000)
    assert recorded_params(spec_record(params)) == params
    assert recorded_params(json.loads(json.dumps(spec_record(params)))) == params
    assert recorded_params(None) is None
