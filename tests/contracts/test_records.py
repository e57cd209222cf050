"""Score and alert records: the wire format the scoring job writes and every consumer reads."""

import json
import math

import pytest
from pydantic import ValidationError

from contracts.events import SCHEMA_VERSION, DeadLetter, Reason
from contracts.records import EXPLANATION_FIELDS, AlertRecord, Explanation, FeatureRecord, ScoreRecord
from features.definitions import FEATURE_COLUMNS
from scoring.core import parse_feature_record
from tests.support.factories import CARD_A, make_alert, make_score
from tests.support.samples import FEATURE


def test_score_record_round_trips_through_json() -> None:
    score = make_score(7)
    wire = score.model_dump_json()
    assert json.loads(wire)["schema_version"] == SCHEMA_VERSION == 1
    assert ScoreRecord.model_validate_json(wire) == score


def test_alert_record_round_trips_with_features_and_contributions() -> None:
    alert = make_alert(8, contributions={"b": -2.0, "a": 1.5, "c": 0.25, "d": 0.0})
    parsed = AlertRecord.model_validate_json(alert.model_dump_json())
    assert parsed == alert
    assert parsed.features["terminal_risk_7d"] is None
    assert list(parsed.contributions.items()) == [("b", -2.0), ("a", 1.5), ("c", 0.25), ("d", 0.0)]
    assert parsed.top_features == ["b", "a", "c"]  # the first three, in the contributions' order
    assert (parsed.base_margin, parsed.contribution_method) == (-4.5, "tree_shap")


def test_an_alert_written_before_contributions_still_parses() -> None:
    wire = json.loads(make_alert(8).model_dump_json())
    for name in ("contributions", "base_margin", "contribution_method"):
        del wire[name]
    parsed = AlertRecord.model_validate(wire)
    assert (parsed.contributions, parsed.base_margin, parsed.contribution_method) == ({}, None, "none")
    assert parsed.top_features == ["card_amount_ratio_30d", "card_nb_tx_1d"]


def test_alert_from_score_carries_every_score_field() -> None:
    score = make_score(9)
    alert = score.to_alert(
        {"f": 1.0}, Explanation(contributions={"f": 0.5}, base_margin=0.1, method="tree_shap")
    )
    assert alert.model_dump(exclude={"features", *EXPLANATION_FIELDS}) == score.model_dump(exclude={"alert"})


def test_non_finite_feature_values_become_null() -> None:
    alert = make_alert(features={"a": math.nan, "b": math.inf, "c": 1.5})
    assert alert.features == {"a": None, "b": None, "c": 1.5}
    assert AlertRecord.model_validate_json(alert.model_dump_json()) == alert


def test_records_are_frozen() -> None:
    with pytest.raises(ValidationError):
        make_alert().score = 0.1  # type: ignore[misc]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("tx_id", -1),
        ("card_id", "4111111111111111"),  # a card number, not a token
        ("card_id", CARD_A.upper()),
        ("terminal_id", ""),
        ("event_time_ms", 1),
        ("score", math.nan),
        ("model_version", 0),
        ("model_name", ""),
        ("schema_version", 2),
    ],
)
def test_invalid_fields_are_rejected(field: str, value: object) -> None:
    with pytest.raises(ValidationError):
        make_score(**{field: value})


def test_unknown_fields_are_rejected() -> None:
    wire = json.loads(make_alert().model_dump_json())
    wire["surprise"] = 1
    with pytest.raises(ValidationError):
        AlertRecord.model_validate(wire)
    del wire["surprise"], wire["features"]
    with pytest.raises(ValidationError, match="features"):
        AlertRecord.model_validate(wire)


def test_a_feature_record_must_carry_exactly_the_known_features() -> None:
    record = FEATURE
    assert isinstance(parse_feature_record(json.dumps(record).encode(), "test", 16_384), FeatureRecord)
    missing = {**record, "features": dict.fromkeys(FEATURE_COLUMNS[:-1], 1.0)}
    letter = parse_feature_record(json.dumps(missing).encode(), "test", 16_384)
    assert isinstance(letter, DeadLetter) and letter.reason == Reason.MISSING_FIELD
    assert FEATURE_COLUMNS[-1] in letter.detail
    extra = {**record, "features": {**record["features"], "shoe_size": 44.0}}
    letter = parse_feature_record(json.dumps(extra).encode(), "test", 16_384)
    assert isinstance(letter, DeadLetter) and letter.reason == Reason.UNEXPECTED_FIELD
    assert "shoe_size" in letter.detail
