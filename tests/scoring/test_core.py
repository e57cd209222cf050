"""Scoring errors are per record: a record the model cannot score is dead-lettered alone, the rest of its
batch is scored (a real random forest from a real MLflow store, the scoring job's own batch function)."""

from __future__ import annotations

import datetime as dt

import numpy as np
import orjson
import pandas as pd
import pyarrow as pa
import pytest

from contracts.events import SCHEMA_VERSION, Reason
from contracts.settings import Topics
from features.definitions import DEFAULT_PARAMS, FEATURE_COLUMNS
from models.dataset import Dataset
from models.estimators import ModelSpec, feature_set
from models.registry import load_model
from models.splits import SplitPlan
from models.tracking import default_artifact_location, log_training
from models.training import train_and_evaluate
from scoring.core import Scorer, score_each

T0_MS = 1_522_540_800_000
TOPICS = Topics()


@pytest.fixture(scope="module")
def forest_uri(small_dataset: Dataset, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, int]:
    """A registered random forest: it converts its input to float32, so 1e39 makes it raise."""
    uri = f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"
    spec = ModelSpec("random_forest", max_depth=4, n_estimators=10)
    result = train_and_evaluate(
        small_dataset, [SplitPlan(dt.date(2018, 4, 20))], spec, feature_set("all", DEFAULT_PARAMS)
    )
    logged = log_training(uri, result, {}, {}, True, default_artifact_location(uri))
    assert logged.version is not None
    return uri, logged.version


def feature_records(n: int, poisoned: int) -> pa.RecordBatch:
    rng = np.random.default_rng(7)
    values = []
    for tx_id in range(n):
        features = {name: float(rng.integers(0, 20)) for name in FEATURE_COLUMNS}
        if tx_id == poisoned:
            features[FEATURE_COLUMNS[0]] = 1e39  # finite in float64: a valid record
        record = {
            "schema_version": SCHEMA_VERSION,
            "tx_id": tx_id,
            "card_id": f"{tx_id:032x}",
            "terminal_id": str(tx_id % 97),
            "amount": float(rng.integers(1, 500)),
            "event_time_ms": T0_MS + tx_id * 1000,
            "late": False,
            "features": features,
        }
        values.append(orjson.dumps(record))
    return pa.RecordBatch.from_arrays(
        [
            pa.array([TOPICS.features] * n, pa.string()),
            pa.array(values, pa.binary()),
            pa.array([0] * n, pa.int32()),
            pa.array(range(n), pa.int64()),
        ],
        names=["topic", "value", "partition", "offset"],
    )


def test_one_unscorable_record_among_10000_is_dead_lettered_alone(forest_uri: tuple[str, int]) -> None:
    uri, version = forest_uri
    model = load_model(uri, version=version)
    records = feature_records(10_000, poisoned=4_321)
    with pytest.raises(ValueError, match="float32"):  # the model refuses any batch holding the value
        model.score(feature_frame(feature_records(3, poisoned=1)))

    scorer = Scorer(tracking_uri=uri, version=version, topics=TOPICS, max_event_bytes=16_384)
    out = scorer.score(model, records).to_pylist()

    scores = [row for row in out if row["topic"] == TOPICS.scores]
    dead = [row for row in out if row["topic"] == TOPICS.dead_letter]
    assert len(scores) == 9_999
    assert len(dead) == 1
    assert orjson.loads(dead[0]["value"])["tx_id"] == 4_321
    headers = {header["key"]: header["value"] for header in dead[0]["headers"]}
    assert headers["dlq.reason"] == Reason.UNSCORABLE.value.encode()
    assert b"float32" in headers["dlq.detail"]
    assert sorted(orjson.loads(row["value"])["tx_id"] for row in scores) == [
        tx_id for tx_id in range(10_000) if tx_id != 4_321
    ]


def feature_frame(records: pa.RecordBatch) -> pd.DataFrame:
    """The model's input frame of feature records: the features and the amount."""
    parsed = [orjson.loads(value) for value in records.column("value").to_pylist()]
    return pd.DataFrame([record["features"] for record in parsed]).assign(
        amount=[record["amount"] for record in parsed]
    )


def test_score_each_finds_every_bad_row_alone(forest_uri: tuple[str, int]) -> None:
    uri, version = forest_uri
    model = load_model(uri, version=version)
    frame = feature_frame(feature_records(2_000, poisoned=-1))
    bad = [3, 1_000, 1_999]
    frame.loc[bad, FEATURE_COLUMNS[0]] = 1e39
    scores, failed = score_each(model, frame)
    assert sorted(failed) == bad
    assert np.isnan(scores[bad]).all()
    assert np.isfinite(np.delete(scores, bad)).all()
