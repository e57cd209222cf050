"""Parts of a streaming query's progress report (``StreamingQuery.lastProgress``), as Spark writes them."""

from __future__ import annotations

import json
from typing import Any


def kafka_source(start: dict[str, int], end: dict[str, int], latest: dict[str, int]) -> dict[str, Any]:
    """The progress of Spark's Kafka source over the ``transactions`` topic: offsets by partition at the
    micro-batch's start and end and the log's end, the records read between them."""
    return {
        "startOffset": json.dumps({"transactions": start}),
        "endOffset": json.dumps({"transactions": end}),
        "latestOffset": json.dumps({"transactions": latest}),
        "numInputRows": sum(end.values()) - sum(start.values()),
    }
