"""The views of a card's and a terminal's state (``fraud state``) from bucket values as the job stores
them, without Spark; and finding a feature job's checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import orjson
import pandas as pd
import pytest

from contracts.errors import StateError
from features.core import CardState, TerminalState, card_step, terminal_step
from features.definitions import DAY_MS, DEFAULT_PARAMS, HOUR_MS, FeatureParams
from features.entries import Layout
from features.inspect import (
    JobState,
    NothingHeldError,
    card_view,
    open_job_state,
    terminal_view,
)
from features.rows import RowKind, decoded_fields, frame_of
from features.stages import CardBucket
from features.state_layout import StateSpec, bind
from infra.kafka.offsets import NO_FRONTIER
from infra.spark.checkpoint import DamagedCheckpointError
from infra.spark.offset_log import Frontier
from infra.spark.state_store import CheckpointNotFoundError, CommittedBatch

PARAMS = FeatureParams()
T = 1_705_492_800_000  # 2024-01-17 12:00 UTC
CARD, OTHER = "ab" * 16, "cd" * 16
LAYOUT = Layout(card_buckets=6, terminal_buckets=6).as_record()


def a_job(frontier: int | None = T, final: bool = False) -> JobState:
    kept = Frontier({"tx/0": 9}, {}, NO_FRONTIER if frontier is None else frontier, final)
    return JobState(Path("/cp"), LAYOUT, CommittedBatch(41, ({"tx": {"0": 9}}, kept.as_json())))


def txs(*rows: tuple[int, str, str, float, int]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=["tx_id", "card_id", "terminal_id", "amount", "event_time_ms"])


def card_bucket_value(history: pd.DataFrame, waiting: pd.DataFrame, frontier: int) -> CardBucket:
    """What a card bucket holds: the history ``card_step`` keeps of ``history``, the waiting events."""
    state, _ = card_step(CardState.empty(), history, PARAMS)
    return CardBucket(state, waiting, frontier)


def waiting_events(*rows: tuple[str, int, str, float | None, int]) -> pd.DataFrame:
    """Events waiting for the frontier: (kind, tx_id, card_id, amount, event_time_ms), terminal t9."""
    n = len(rows)
    return frame_of(
        decoded_fields(),
        {
            "card_bucket": np.zeros(n, dtype=np.int32),
            "kind": np.asarray([r[0] for r in rows], dtype=object),
            "tx_id": np.asarray([r[1] for r in rows], dtype=np.int64),
            "card_id": np.asarray([r[2] for r in rows], dtype=object),
            "terminal_id": np.full(n, "t9", dtype=object),
            "amount": np.asarray([np.nan if r[3] is None else r[3] for r in rows]),
            "event_time_ms": np.asarray([r[4] for r in rows], dtype=np.int64),
        },
        n,
    )


HISTORY = txs(
    (1, CARD, "t1", 100.0, T - 40 * DAY_MS),  # pruned: older than 30 days before the newest
    (2, CARD, "t1", 10.0, T - 10 * DAY_MS),
    (3, CARD, "t2", 20.25, T - 2 * HOUR_MS),
    (4, CARD, "t3", 5.0, T - 30 * 60_000),
    (5, OTHER, "t1", 7.0, T - HOUR_MS),
)


def test_a_card_shows_its_transactions_its_waiting_events_and_the_windows_at_the_frontier() -> None:
    waiting = waiting_events(
        (RowKind.TX, 6, CARD, 50.0, T + HOUR_MS),
        (RowKind.LABEL, 3, CARD, None, T - 2 * HOUR_MS),
        (RowKind.TX, 7, OTHER, 1.0, T),
    )
    stored = card_bucket_value(HISTORY, waiting, T)

    view = card_view(CARD, a_job(), 2, stored, PARAMS)

    assert view.at_ms == T and view.bucket_frontier_ms == T
    events = view.events
    assert events["tx_id"].tolist() == [2, 3, 3, 4, 6]
    assert events["waiting"].tolist() == [False, False, True, False, True]
    assert events["kind"].tolist() == [RowKind.TX, RowKind.TX, RowKind.LABEL, RowKind.TX, RowKind.TX]
    assert events.loc[~events["waiting"], "amount"].tolist() == [10.0, 20.25, 5.0]
    assert events.loc[events["waiting"], "terminal_id"].tolist() == ["t9", "t9"]
    windows = view.windows.set_index("window")
    assert windows["nb_tx"].tolist() == [1, 2, 2, 3]
    assert windows["amount_cents"].tolist() == [500, 2525, 2525, 3525]
    assert windows.loc["30 d", "avg_amount"] == 35.25 / 3
    # The windows are those of a transaction of the card at the frontier, without it.
    state, _ = card_step(CardState.empty(), HISTORY, PARAMS)
    _, probe = card_step(state, txs((99, CARD, "t1", 0.0, T)), PARAMS)
    assert probe["card_nb_tx_30d"].iloc[0] - 1 == windows.loc["30 d", "nb_tx"]
    assert probe["card_nb_tx_1h"].iloc[0] - 1 == windows.loc["1 h", "nb_tx"]


def test_the_view_as_json_for_the_command() -> None:
    stored = card_bucket_value(HISTORY, waiting_events((RowKind.TX, 6, CARD, 50.0, T + HOUR_MS)), T + DAY_MS)

    shown = orjson.loads(orjson.dumps(card_view(CARD, a_job(final=True), 2, stored, PARAMS).as_json()))

    assert shown["batch_id"] == 41 and shown["final"] is True and shown["frontier_ms"] == T
    assert shown["bucket_frontier_ms"] == shown["windows_end_ms"] == T + DAY_MS
    assert [w["window"] for w in shown["windows"]] == ["1 h", "1 d", "7 d", "30 d"]
    assert shown["windows"][1] == {
        "window": "1 d",
        "window_ms": DAY_MS,
        "feature": "card_nb_tx_1d",
        "nb_tx": 0,
        "amount_sum": 0.0,
        "avg_amount": None,
    }
    assert shown["events"][-1] == {
        "kind": RowKind.TX,
        "tx_id": 6,
        "event_time_ms": T + HOUR_MS,
        "amount": 50.0,
        "terminal_id": "t9",
        "known_at_ms": None,
        "waiting": True,
    }
    assert shown["events"][0]["terminal_id"] is None  # the card state keeps no terminal


def test_a_card_the_state_does_not_hold_is_an_error_naming_its_bucket() -> None:
    stored = card_bucket_value(HISTORY, waiting_events(), T)
    with pytest.raises(
        NothingHeldError, match=r"holds nothing for card ef.* at batch 41 \(card bucket 3 of 6\)"
    ):
        card_view("ef" * 16, a_job(), 3, stored, PARAMS)
    with pytest.raises(NothingHeldError):
        card_view(CARD, a_job(), 2, None, PARAMS)


def test_a_terminal_shows_its_transactions_labels_and_features_at_the_frontier() -> None:
    d = PARAMS.label_delay_ms
    history = txs(
        (1, CARD, "t1", 1.0, T - d - HOUR_MS),  # in the 1-day window that ends d before T
        (2, CARD, "t1", 1.0, T - d - 3 * DAY_MS),  # in the 7-day one
        (3, CARD, "t2", 1.0, T - d - HOUR_MS),
    )
    labels = pd.DataFrame(
        {
            "tx_id": [1, 2],
            "terminal_id": ["t1", "t1"],
            "tx_time_ms": [T - d - HOUR_MS, T - d - 3 * DAY_MS],
            "known_at_ms": [T - DAY_MS, T + DAY_MS],  # the second is not known by T
            "is_fraud": [True, True],
        }
    )
    stored, _ = terminal_step(TerminalState.empty(), history, labels, PARAMS)

    view = terminal_view("t1", a_job(), 4, stored, PARAMS)

    assert view.transaction_times_ms.tolist() == [T - d - 3 * DAY_MS, T - d - HOUR_MS]
    assert view.labels["tx_id"].tolist() == [1, 2]
    windows = view.windows.set_index("window")
    assert windows["nb_tx"].tolist() == [1, 2, 2]
    assert windows["risk"].tolist() == [1.0, 0.5, 0.5]
    shown = orjson.loads(orjson.dumps(view.as_json()))
    assert shown["terminal_bucket"] == 4 and shown["labels"][0]["is_fraud"] is True
    with pytest.raises(NothingHeldError, match="holds nothing for terminal t7"):
        terminal_view("t7", a_job(), 4, stored, PARAMS)


def a_checkpoint(root: Path, commits: int, layout: bool = True) -> Path:
    query = root / "query"
    (query / "offsets").mkdir(parents=True)
    (query / "commits").mkdir()
    for batch in range(max(commits, 1)):
        sources = [{"tx": {"0": 3}}, Frontier({"tx/0": 3}, {}, T + batch).as_json()]
        lines = "\n".join(map(json.dumps, sources))
        (query / "offsets" / str(batch)).write_text(f"v1\n{{}}\n{lines}\n")
    for batch in range(commits):
        (query / "commits" / str(batch)).write_text("v1\n{}\n")
    if layout:
        (root / "layout.json").write_text(json.dumps(LAYOUT))
    return root


def test_a_feature_jobs_checkpoint_is_found_with_its_layout_and_frontier(tmp_path: Path) -> None:
    job = open_job_state(a_checkpoint(tmp_path / "cp", commits=3))

    assert job.layout == LAYOUT and job.batch.batch_id == 2
    assert job.frontier_ms == T + 2 and not job.final


def test_a_checkpoint_gives_the_feature_parameters_its_job_records(tmp_path: Path) -> None:
    recorded = FeatureParams(window_days=(1, 7, 14, 30), label_delay_ms=3 * DAY_MS)
    checkpoint = a_checkpoint(tmp_path / "cp", commits=1)
    assert open_job_state(checkpoint).params is None, "no record: the reader's own parameters"
    assert open_job_state(checkpoint).params_or(DEFAULT_PARAMS) == DEFAULT_PARAMS
    bind(checkpoint, StateSpec(Layout(card_buckets=6, terminal_buckets=6), recorded))
    assert open_job_state(checkpoint).params == recorded
    assert open_job_state(checkpoint).params_or(DEFAULT_PARAMS) == recorded


def test_a_damaged_checkpoint_is_said_before_spark_reads_it(tmp_path: Path) -> None:
    checkpoint = a_checkpoint(tmp_path / "cp", commits=3)
    (checkpoint / "query" / "offsets" / "1").unlink()
    with pytest.raises(DamagedCheckpointError, match=r"query/offsets/1 is missing"):
        open_job_state(checkpoint)


def test_what_is_missing_is_said_in_one_line(tmp_path: Path) -> None:
    with pytest.raises(CheckpointNotFoundError, match="no checkpoint at") as nowhere:
        open_job_state(tmp_path / "nowhere")
    with pytest.raises(CheckpointNotFoundError, match="nothing committed yet") as new:
        open_job_state(a_checkpoint(tmp_path / "new", commits=0))
    with pytest.raises(StateError, match="not the checkpoint of a feature job") as foreign:
        open_job_state(a_checkpoint(tmp_path / "scoring", commits=1, layout=False))
    for raised in (nowhere, new, foreign):
        assert "\n" not in str(raised.value)


def test_a_frontier_before_any_record_is_none() -> None:
    assert a_job(frontier=None).frontier_ms is None
