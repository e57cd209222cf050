"""Score and alert records and streaming progress reports for tests: valid by default, any field overridable."""

from __future__ import annotations

import json
from typing import Any

from contracts.records import AlertRecord, Explanation, ScoreRecord

#: 2018-04-01 00:00 UTC, the simulator's first day.
T0_MS = 1_522_540_800_000
CARD_A = "a" * 32
CARD_B = "0123456789abcdef" * 2


#: An alert's explanation: the model's contribution of one feature.
EXPLANATION = Explanation(contributions={"card_nb_tx_1d": 0.8}, base_margin=-3.0, method="tree_shap")


def make_score(tx_id: int = 1, **updates: Any) -> ScoreRecord:
    fields: dict[str, Any] = {
        "tx_id": tx_id,
        "card_id": CARD_A,
        "terminal_id": "3156",
        "amount": 250.5,
        "event_time_ms": T0_MS + tx_id * 1000,
        "scored_at_ms": T0_MS + tx_id * 1000 + 40,
        "score": 0.91,
        "threshold": 0.5,
        "model_name": "fraud-detector",
        "model_version": 3,
        "alert": True,
    }
    return ScoreRecord(**{**fields, **updates})


def make_alert(tx_id: int = 1, **updates: Any) -> AlertRecord:
    features = updates.pop(
        "features", {"card_nb_tx_1d": 3.0, "card_amount_ratio_30d": 4.2, "terminal_risk_7d": None}
    )
    top = updates.pop("top_features", None)
    contributions = updates.pop(
        "contributions",
        {"card_amount_ratio_30d": 1.25, "card_nb_tx_1d": -0.5}
        if top is None
        else {name: 1.0 / (rank + 1) for rank, name in enumerate(top)},
    )
    explanation = Explanation(contributions=contributions, base_margin=-4.5, method="tree_shap")
    return make_score(tx_id, **updates).to_alert(features, explanation)


def make_progress(batch_id: int, read: int, behind: int, duration_ms: int) -> dict[str, Any]:
    """A streaming query's progress report of a micro-batch that read ``read`` records of one partition
    of the features topic (Spark's Kafka connector's offsets), ``behind`` short of the log's end."""
    return {
        "batchId": batch_id,
        "timestamp": "2026-11-27T20:00:00.000Z",
        "durationMs": {"triggerExecution": duration_ms},
        "sources": [
            {
                "startOffset": json.dumps({"features": {"0": 0}}),
                "endOffset": json.dumps({"features": {"0": read}}),
                "latestOffset": json.dumps({"features": {"0": read + behind}}),
                "numInputRows": read,
            }
        ],
    }
