"""The three jobs' configs as the app runs them (``fraud.jobs.Job``), built from the settings without I/O:
services that do not exist are only met when a job starts (``prepare_services``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from contracts.settings import JobName, Settings
from features.definitions import FeatureParams
from features.rescale import Rescale
from fraud import jobs
from models.registry import MODEL_LOADING_MODULES

#: Services nobody listens at: building a config must not try them.
NOWHERE = Settings(
    bootstrap_servers="127.0.0.1:9",
    redis_url="redis://127.0.0.1:9/0",
    mlflow_tracking_uri="http://127.0.0.1:9",
)


def built(tmp_path: Path) -> dict[JobName, jobs.Job]:
    topics = NOWHERE.topics.in_namespace("replay")
    scope = jobs.Scope("replay", start_ms=1, end_ms=2)
    return {
        JobName.FEATURES: jobs.feature_job_config(
            NOWHERE, topics=topics, checkpoint=tmp_path / "f", params=FeatureParams(), scope=scope
        ),
        JobName.SCORING: jobs.scoring_job_config(
            NOWHERE, topics=topics, checkpoint=tmp_path / "s", scope=scope
        ),
        JobName.PIPELINE: jobs.pipeline_config(
            NOWHERE, topics=topics, checkpoint=tmp_path / "p", params=FeatureParams(), scope=scope
        ),
    }


def test_each_job_says_what_it_is_reads_and_preloads(tmp_path: Path) -> None:
    configs = built(tmp_path)
    topics = NOWHERE.topics.in_namespace("replay")
    for name, job in configs.items():
        assert job.name == name
        assert str(job.checkpoint) in job.description
        assert job.redis.prefix == "replay:" and job.topics == topics
    features, scoring, pipeline = configs.values()
    assert features.inputs == pipeline.inputs == (topics.transactions, topics.labels)
    assert scoring.inputs == scoring.alert_inputs == (topics.features,)
    assert pipeline.alert_inputs == (topics.transactions,) and features.alert_inputs == ()
    assert not set(MODEL_LOADING_MODULES) & set(features.preload), "the feature job loads no model"
    assert set(MODEL_LOADING_MODULES) <= set(scoring.preload) == set(pipeline.preload)
    assert features.feature_part is features and scoring.feature_part is None
    assert pipeline.feature_part is not None and pipeline.feature_part.redis.writer == JobName.PIPELINE


@pytest.mark.parametrize("name", list(JobName))
def test_a_rescale_reaches_the_feature_state_and_only_it(tmp_path: Path, name: JobName) -> None:
    job = built(tmp_path)[name]
    rescale = Rescale(query_dir=tmp_path / "old", batch=3, position={})
    moved = job.with_rescale(rescale)
    assert type(moved) is type(job)
    part = moved.feature_part
    assert (part.rescale if part is not None else None) == (rescale if name != JobName.SCORING else None)
