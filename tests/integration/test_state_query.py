"""Querying the feature job's state (``fraud state card``) against the batch path, on the real broker and
Spark.

A small simulation (100 cards, 40 days) is produced and the feature job runs continuously over it. While
it runs, the state of a few cards is read from its checkpoint (its last committed micro-batch), in this
process, with ``fraud state card --json`` as a user runs it and through the API (``GET /state/cards/...``),
and each card's window counts and sums at
the frontier are compared with the batch path's: the features ``features.core.compute_features`` gives a
transaction of the card at the frontier, minus that transaction. The job runs with windows and a label
delay of its own, which the command and the API are not told: they take them from the checkpoint. Then the
job stops, its checkpoint is copied (a savepoint) and the original moved away, and the copy shows the same.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pandas as pd
import pytest
from fastapi.testclient import TestClient
from pyspark.sql import SparkSession

from api.app import create_app
from contracts.events import TxColumns
from contracts.settings import Settings
from features.buckets import card_bucket
from features.core import compute_features
from features.definitions import (
    DAY_MS,
    EVENT_TIME_MS,
    FeatureParams,
    card_avg_amount_column,
    card_nb_tx_column,
)
from features.inspect import NothingHeldError, open_job_state, read_card
from features.job import start_feature_job
from features.state_layout import Start, bind
from fraud.state import StateService
from infra.clients import Clients
from infra.spark.session import Trigger, stop_between_batches
from ingest.produce import produce_events
from ingest.simulator import SimulatorConfig
from tests.support.feature_jobs import Simulated, job_config, simulated
from tests.support.scripts import run_fraud

pytestmark = pytest.mark.minutes(0.7)

C = TxColumns
SIMULATION = SimulatorConfig(customers=100, terminals=200, days=40, seed=17)
#: Not the defaults: what reads the state must take them from the checkpoint's record.
PARAMS = FeatureParams(window_days=(1, 7, 14, 30), label_delay_ms=3 * DAY_MS)


def transactions_of(sim: Simulated) -> pd.DataFrame:
    """The simulated transactions as the job sees them (card tokens), in event-time order."""
    events = list(sim.transactions.values())
    frame = pd.DataFrame(
        {
            C.TX_ID: [e.tx_id for e in events],
            C.CARD_ID: [e.card_id for e in events],
            C.TERMINAL_ID: [e.terminal_id for e in events],
            C.AMOUNT: [e.amount for e in events],
            EVENT_TIME_MS: [e.event_time_ms for e in events],
        }
    )
    return frame.sort_values([EVENT_TIME_MS, C.TX_ID], ignore_index=True)


def windows_at(transactions: pd.DataFrame, card: str, at_ms: int) -> dict[str, tuple[int, int]]:
    """The batch path's card windows at ``at_ms``: by count feature, (transactions, amount in cents) of a
    transaction of ``card`` at ``at_ms`` (amount 0, ordered after every other), without that transaction."""
    probe_id = int(transactions[C.TX_ID].max()) + 1
    probe = pd.DataFrame(
        {
            C.TX_ID: [probe_id],
            C.CARD_ID: [card],
            C.TERMINAL_ID: ["probe"],
            C.AMOUNT: [0.0],
            EVENT_TIME_MS: [at_ms],
        }
    )
    features = compute_features(pd.concat([transactions, probe], ignore_index=True), None, PARAMS)
    row = features.set_index(C.TX_ID).loc[probe_id]
    found = {}
    for days in PARAMS.window_days:
        count = int(row[card_nb_tx_column(days)])
        cents = int(np.rint(row[card_avg_amount_column(days)] * count * 100))
        found[card_nb_tx_column(days)] = (count - 1, cents)
    return found


def chosen_cards(transactions: pd.DataFrame, buckets: int) -> list[str]:
    """The busiest card, a median one, and the busiest of another card bucket."""
    counts = transactions[C.CARD_ID].value_counts()
    busiest, median = str(counts.index[0]), str(counts.index[len(counts) // 2])
    other = next(
        str(c) for c in counts.index if card_bucket(str(c), buckets) != card_bucket(busiest, buckets)
    )
    return [busiest, median, other]


def assert_windows_equal(got: list[dict[str, Any]], want: dict[str, tuple[int, int]], card: str) -> None:
    shown = {w["feature"]: (w["nb_tx"], round(w["amount_sum"] * 100)) for w in got if w["feature"] in want}
    assert shown == want, f"card {card}: the state's windows {shown} differ from the batch path's {want}"
    assert any(count for count, _ in want.values()), f"card {card}: every window is empty: a weak check"


def test_state_of_cards_equals_the_batch_path_while_the_job_runs_and_in_a_moved_copy(
    spark: SparkSession, settings: Settings, clients: Clients, tmp_path: Path
) -> None:
    sim = simulated(SIMULATION, settings, PARAMS)
    everything = transactions_of(sim)
    checkpoint = tmp_path / "checkpoints" / "features"  # where FRAUD_HOME=tmp_path keeps it
    config = job_config(clients, settings.topics, checkpoint, None, PARAMS)
    assert produce_events(clients.producer(), settings.topics, sim.events).delivery_errors == []

    bind(config.checkpoint, config.state)
    query = start_feature_job(spark, config, Start(), Trigger(interval_s=0.5))
    try:
        query.processAllAvailable()
        job = open_job_state(checkpoint)
        cards = chosen_cards(everything, job.layout["card_buckets"])
        for card in cards:
            view = read_card(spark, job, card, PARAMS)
            assert view.at_ms is not None and not job.final
            released = everything[everything[EVENT_TIME_MS] < view.at_ms]
            assert_windows_equal(view.as_json()["windows"], windows_at(released, card, view.at_ms), card)
            held = view.events[~view.events["waiting"]]
            mine = released[released[C.CARD_ID] == card]
            recent = mine[mine[EVENT_TIME_MS] > view.at_ms - PARAMS.longest_window_ms]
            assert set(recent[C.TX_ID]) <= set(held[C.TX_ID]) <= set(mine[C.TX_ID])
        with pytest.raises(NothingHeldError, match="holds nothing for card"):
            read_card(spark, job, "f" * 32, PARAMS)

        result = run_fraud(settings, "state", "card", cards[0], "--checkpoint", str(checkpoint), "--json")
        assert result.returncode == 0, result.stderr
        shown = orjson.loads(result.stdout)
        assert shown["batch_id"] >= job.batch.batch_id
        at = shown["windows_end_ms"]
        released = everything[everything[EVENT_TIME_MS] < at]
        assert_windows_equal(shown["windows"], windows_at(released, cards[0], at), cards[0])
        states = StateService(settings.model_copy(update={"home": tmp_path}), session=lambda: spark)
        api = TestClient(create_app(clients.redis(), states=states))
        answer = api.get(f"/state/cards/{cards[2]}")
        assert answer.status_code == 200, answer.text
        served = answer.json()
        assert served["checkpoint"] == "FRAUD_HOME/checkpoints/features", "no absolute path to a client"
        at = served["windows_end_ms"]
        released = everything[everything[EVENT_TIME_MS] < at]
        assert_windows_equal(served["windows"], windows_at(released, cards[2], at), cards[2])
        terminal = str(everything[C.TERMINAL_ID].value_counts().index[0])
        answer = api.get(f"/state/terminals/{terminal}")
        assert answer.status_code == 200 and answer.json()["terminal_id"] == terminal, answer.text
        missing = api.get(f"/state/cards/{'f' * 32}")
        assert missing.status_code == 404 and "holds nothing for card" in missing.json()["detail"]
        elsewhere = api.get(f"/state/cards/{cards[0]}", params={"namespace": "other"})
        assert elsewhere.status_code == 404 and "no checkpoint at" in elsewhere.json()["detail"]
        assert query.isActive and query.exception() is None, "the job stopped while its state was read"
    finally:
        stop_between_batches(query)

    savepoint = tmp_path / "savepoint"
    shutil.copytree(checkpoint, savepoint)
    checkpoint.rename(tmp_path / "moved")
    copy = open_job_state(savepoint)
    view = read_card(spark, copy, cards[1], PARAMS)
    released = everything[everything[EVENT_TIME_MS] < view.at_ms]
    assert_windows_equal(view.as_json()["windows"], windows_at(released, cards[1], view.at_ms), cards[1])
