"""The three jobs' configs as the app runs them (``fraud.jobs.Job``), built from the settings without I/O:
services that do not exist are only met when a job starts (``prepare_services``)."""

from __future__ import annotations

from pathlib import Path

from contracts.settings import JobName, Settings
from features.definitions import FeatureParams
from features.entries import Layout
from features.state_layout import StateSpec
from fraud import jobs
from infra.clients import Clients
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
    clients = Clients.from_settings(NOWHERE)
    return {
        JobName.FEATURES: jobs.feature_job_config(
            NOWHERE, clients, topics=topics, checkpoint=tmp_path / "f", params=FeatureParams(), scope=scope
        ),
        JobName.SCORING: jobs.scoring_job_config(
            NOWHERE, clients, topics=topics, checkpoint=tmp_path / "s", scope=scope
        ),
        JobName.PIPELINE: jobs.pipeline_config(
            NOWHERE, clients, topics=topics, checkpoint=tmp_path / "p", params=FeatureParams(), scope=scope
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
    assert features.state == pipeline.state == StateSpec(Layout(), FeatureParams())
    assert scoring.state is None, "the scoring job keeps no keyed state"
    assert pipeline.redis.writer == JobName.PIPELINE and features.redis.writer == JobName.FEATURES
