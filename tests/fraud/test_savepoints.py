"""Savepoints of the jobs: what a savepoint says it holds, where it goes, and which job can start from it."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import ClassVar

import pytest

from contracts.errors import ConfigError, NotFoundError, StateError
from contracts.settings import JobName
from features.compat import SPECS_FILE, FeatureSpecsError, spec_record
from features.definitions import DAY_MS, DEFAULT_PARAMS, FeatureParams
from features.entries import Layout
from features.entry_store import LAST_READER_OF_EARLIER_LAYOUTS, EarlierLayoutError
from features.rescale import Rescale
from features.state_layout import LAYOUT_FILE, CheckpointLayoutError, Start, StateSpec
from fraud import savepoints
from fraud.savepoints import SavepointMismatchError
from infra.spark.checkpoint import QUERY_DIR
from tests.support.checkpoints import CHANGES, LAYOUT, TOPICS, position, spark_checkpoint

PARAMS = DEFAULT_PARAMS


@pytest.fixture
def savepoint(tmp_path: Path) -> savepoints.Savepoint:
    checkpoint = spark_checkpoint(tmp_path / "checkpoints" / "features", committed=4)
    return savepoints.take("features", "", checkpoint, tmp_path / "savepoints" / "sp")


def test_a_savepoint_says_where_its_job_stood(savepoint: savepoints.Savepoint, tmp_path: Path) -> None:
    assert savepoint.batch == 4
    assert savepoint.offsets == position(4).offsets
    assert savepoint.frontier_ms == position(4).frontier_ms and not savepoint.final
    assert savepoint.layout == LAYOUT
    assert savepoint.features is not None and len(savepoint.features["features"]) == len(PARAMS.specs)
    assert savepoint.topics == set(TOPICS)
    assert savepoint.checkpoint == str(tmp_path / "checkpoints" / "features")
    assert datetime.fromisoformat(savepoint.created_at).tzinfo == UTC
    stored = json.loads((savepoint.path / savepoints.SAVEPOINT_FILE).read_text())
    assert "path" not in stored and stored["job"] == "features" and stored["format"] == savepoints.FORMAT
    assert savepoints.read(savepoint.path) == savepoint
    assert savepoint.shuffle_partitions == 2
    assert savepoints.find(savepoint.path.parent) == [savepoint] == savepoints.find(savepoint.path)
    assert savepoints.find(tmp_path / "none") == []
    older = {**stored, "format": 1}
    del older["shuffle_partitions"]
    (savepoint.path / savepoints.SAVEPOINT_FILE).write_text(json.dumps(older))
    with pytest.raises(
        EarlierLayoutError, match=f"^savepoint {savepoint.path} keeps its state in an earlier"
    ):
        savepoints.read(savepoint.path)  # format 1 predates this version's layout


def test_the_default_place_names_the_job_and_the_time(tmp_path: Path) -> None:
    now = datetime(2026, 11, 26, 9, 5, 7, tzinfo=UTC)
    assert savepoints.default_location(tmp_path, "features", now=now) == (
        tmp_path / "savepoints" / "features-20261126T090507Z"
    )
    assert (
        savepoints.default_location(tmp_path, "pipeline", "replay", now).name
        == "replay.pipeline-20261126T090507Z"
    )


def test_what_cannot_be_saved_or_read_is_told(tmp_path: Path) -> None:
    with pytest.raises(NotFoundError, match="no checkpoint of the scoring job at"):
        savepoints.take("scoring", "", tmp_path / "missing", tmp_path / "sp")
    assert not (tmp_path / "sp").exists(), "a failed savepoint leaves nothing behind"
    (tmp_path / "new" / QUERY_DIR / "offsets").mkdir(parents=True)
    (tmp_path / "sp").mkdir()
    with pytest.raises(StateError, match="no committed micro-batch yet: the features job has nothing"):
        savepoints.take("features", "", tmp_path / "new", tmp_path / "sp")
    assert (tmp_path / "sp").is_dir() and not any((tmp_path / "sp").iterdir())
    (tmp_path / "sp" / "notes").write_text("mine")
    with pytest.raises(ConfigError, match="not an empty directory"):
        savepoints.take("features", "", tmp_path / "new", tmp_path / "sp")
    with pytest.raises(NotFoundError, match="no savepoint at"):
        savepoints.read(tmp_path / "missing")
    with pytest.raises(ConfigError, match="is not a savepoint"):
        savepoints.read(tmp_path / "sp")
    with pytest.raises(ConfigError, match="is not a savepoint"):
        savepoints.delete(tmp_path / "sp")
    assert (tmp_path / "sp" / "notes").exists()


@dataclass(frozen=True)
class AFeatureJob:
    """What a start needs of the feature job (``fraud.savepoints.JobToStart``)."""

    checkpoint: Path
    layout: Layout = field(default_factory=Layout)
    params: FeatureParams = PARAMS
    inputs: tuple[str, ...] = TOPICS
    name: ClassVar[JobName] = JobName.FEATURES

    @property
    def state(self) -> StateSpec:
        return StateSpec(self.layout, self.params)


class APipeline(AFeatureJob):
    name = JobName.PIPELINE


def test_only_the_same_job_inputs_and_features_fit(savepoint: savepoints.Savepoint, tmp_path: Path) -> None:
    cp = tmp_path / "cp"
    savepoints.check_fits(savepoint, AFeatureJob(cp))
    savepoints.check_fits(savepoint, AFeatureJob(cp, Layout(card_buckets=12)))  # rescaled
    with pytest.raises(SavepointMismatchError, match="is of the features job, not of the pipeline job"):
        savepoints.check_fits(savepoint, APipeline(cp))
    earlier = dataclasses.replace(savepoint, layout={"card_buckets": 6, "terminal_buckets": 6})
    with pytest.raises(EarlierLayoutError, match=r"^savepoint .* keeps its state in an earlier layout"):
        savepoints.check_fits(earlier, AFeatureJob(cp))
    with pytest.raises(
        SavepointMismatchError, match="read labels, transactions; this job reads tx2, labels2"
    ):
        savepoints.check_fits(savepoint, AFeatureJob(cp, inputs=("tx2", "labels2")))
    more = FeatureParams(window_days=(1, 2, 7, 30))  # features added, within the state's history
    savepoints.check_fits(savepoint, AFeatureJob(cp, params=more))
    savepoints.check_fits(savepoint, AFeatureJob(cp, params=FeatureParams(label_delay_ms=DAY_MS)))
    with pytest.raises(
        FeatureSpecsError,
        match=r"savepoint .* \(features added: card_nb_tx_60d, .*the card features look back 60 d, the "
        r"state keeps 30 d; the terminal features look back 67 d, the state keeps 37 d\)",
    ):
        savepoints.check_fits(savepoint, AFeatureJob(cp, params=FeatureParams(window_days=(1, 7, 60))))


def test_a_start_without_a_savepoint_binds_the_checkpoint_to_the_jobs_state(tmp_path: Path) -> None:
    job = AFeatureJob(tmp_path / "features")
    assert savepoints.plan_start(job, None, 2) == savepoints.Plan(Start())
    assert json.loads((job.checkpoint / LAYOUT_FILE).read_text()) == LAYOUT
    assert json.loads((job.checkpoint / SPECS_FILE).read_text()) == spec_record(PARAMS)
    with pytest.raises(CheckpointLayoutError, match="resume it with the same settings, or rescale it"):
        savepoints.plan_start(AFeatureJob(job.checkpoint, Layout(card_buckets=12)), None, 2)


def test_a_job_starts_from_a_savepoint_in_a_new_checkpoint_once(
    savepoint: savepoints.Savepoint, tmp_path: Path
) -> None:
    job = AFeatureJob(tmp_path / "checkpoints" / "restored" / "features")
    target = job.checkpoint
    plan = savepoints.plan_start(job, savepoint.path, 2)
    assert plan == savepoints.Plan(Start(), "copied", savepoint)
    assert plan.describe(target) == (
        f"Starting from savepoint {savepoint.path} (batch 4, frontier {savepoints.iso_ms(savepoint.frontier_ms)}) "
        f"in checkpoint {target}."
    )
    origin = json.loads((target / savepoints.RESTORED_FILE).read_text())
    assert origin == {"id": savepoint.id, "savepoint": str(savepoint.path), "batch": 4}
    assert (target / QUERY_DIR / "commits" / "4").exists() and not (
        target / QUERY_DIR / "offsets" / "5"
    ).exists()
    run_on(target / QUERY_DIR, 5)
    assert savepoints.plan_start(job, savepoint.path, 2).how == "resumed", "a restart resumes"
    assert savepoints.plan_start(job, None, 2) == savepoints.Plan(Start()), "as a restart without it does"
    assert (target / QUERY_DIR / "commits" / "5").exists()
    # Another savepoint, or the checkpoint it was taken from, is refused.
    other = savepoints.take("features", "", target, tmp_path / "savepoints" / "other")
    with pytest.raises(SavepointMismatchError, match="is not empty: a job starts from a savepoint in a new"):
        savepoints.plan_start(job, other.path, 2)
    with pytest.raises(SavepointMismatchError, match="is not empty"):
        savepoints.plan_start(AFeatureJob(tmp_path / "checkpoints" / "features"), savepoint.path, 2)
    # A savepoint of a restored checkpoint has its own identity, and no trace of the first restore.
    assert other.batch == 5 and not (other.path / "checkpoint" / savepoints.RESTORED_FILE).exists()


def test_a_job_in_another_layout_is_rescaled_from_a_savepoint(
    savepoint: savepoints.Savepoint, tmp_path: Path
) -> None:
    job = AFeatureJob(
        tmp_path / "checkpoints" / "rescaled" / "features", Layout(card_buckets=12, terminal_buckets=12)
    )
    target = job.checkpoint
    plan = savepoints.plan_start(job, savepoint.path, 2)
    assert (plan.how, plan.change) == ("rescaled", "card_buckets 6 -> 12, terminal_buckets 6 -> 12")
    assert plan.start == Start(Rescale(savepoint.path / "checkpoint" / QUERY_DIR, 4, position(4)))
    # Nothing copied: a new query starts here, in the new layout, recording where its state comes from and
    # which features it was built for.
    assert {p.name for p in target.iterdir()} == {LAYOUT_FILE, SPECS_FILE, savepoints.RESTORED_FILE}
    assert json.loads((target / LAYOUT_FILE).read_text()) == job.layout.as_record()
    assert json.loads((target / SPECS_FILE).read_text()) == savepoint.features
    origin = json.loads((target / savepoints.RESTORED_FILE).read_text())
    assert origin["rescaled"] == plan.change and origin["id"] == savepoint.id
    # Until its first micro-batch commits, it needs the savepoint: a restart, with or without it, rescales.
    assert savepoints.plan_start(job, savepoint.path, 2) == plan
    assert savepoints.plan_start(job, None, 2) == plan
    (target / QUERY_DIR / "offsets").mkdir(parents=True)
    (target / QUERY_DIR / "offsets" / "0").write_text("v1\n{}")
    (target / QUERY_DIR / "commits").mkdir(parents=True)
    (target / QUERY_DIR / "commits" / "0").write_text("v1\n{}")
    resumed = savepoints.plan_start(job, savepoint.path, 2)
    assert (resumed.how, resumed.start) == ("resumed", Start())
    assert savepoints.plan_start(job, None, 2) == savepoints.Plan(Start()), "the savepoint is needed no more"


def test_other_shuffle_partitions_rescale_too(savepoint: savepoints.Savepoint, tmp_path: Path) -> None:
    assert savepoint.shuffle_partitions == 2
    assert savepoints.layout_change(savepoint, AFeatureJob(tmp_path).state, 2) is None
    assert savepoints.layout_change(savepoint, None, 3) is None, "a job without keyed state copies"
    plan = savepoints.plan_start(AFeatureJob(tmp_path / "cp"), savepoint.path, 3)
    assert (plan.how, plan.change) == ("rescaled", "shuffle partitions 2 -> 3")


def run_on(query: Path, batch: int) -> None:
    """What the job writes when it commits ``batch``."""
    (query / "offsets" / str(batch)).write_text((query / "offsets" / str(batch - 1)).read_text())
    (query / "commits" / str(batch)).write_text("v1\n{}")
    for store in query.glob("state/*/[0-9]"):
        (store / f"{batch + 1}.changelog").write_bytes(CHANGES)


def test_deleting_a_savepoint_removes_its_directory(savepoint: savepoints.Savepoint) -> None:
    assert savepoints.delete(savepoint.path) == savepoint
    assert not savepoint.path.exists()


def test_a_savepoint_of_an_earlier_layout_is_refused_with_the_way_to_move_it(tmp_path: Path) -> None:
    """Earlier versions kept a value per bucket and recorded no slots: this version reads their state no
    more, and says which version moves it."""
    checkpoint = spark_checkpoint(
        tmp_path / "old", committed=4, layout={"card_buckets": 6, "terminal_buckets": 6}
    )
    savepoint = savepoints.take("features", "", checkpoint, tmp_path / "sp")
    with pytest.raises(EarlierLayoutError, match=f"commit {LAST_READER_OF_EARLIER_LAYOUTS} "):
        savepoints.plan_start(AFeatureJob(tmp_path / "cp"), savepoint.path, 2)
    assert not (tmp_path / "cp").exists()
