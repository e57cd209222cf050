import orjson
import pandas as pd

from contracts.events import DAY_MS, LabelEvent, Reason, TransactionEvent, TxColumns
from ingest.files import clean_table
from ingest.produce import events_from_table
from ingest.tokens import card_token

C = TxColumns
KEY = b"k"

T0 = 1_522_540_800_000


def table(rows: list[dict[str, object]]) -> pd.DataFrame:
    return pd.DataFrame(rows)


def test_events_and_labels_from_a_table() -> None:
    frame = table(
        [
            {C.TX_ID: 1, C.CARD_ID: 10, C.TERMINAL_ID: 5, C.AMOUNT: 10.0, C.EVENT_TIME: T0, C.IS_FRAUD: 0},
            {
                C.TX_ID: 2,
                C.CARD_ID: 11,
                C.TERMINAL_ID: 6,
                C.AMOUNT: 300.0,
                C.EVENT_TIME: T0 + 5,
                C.IS_FRAUD: 1,
            },
        ]
    )
    batch = events_from_table(clean_table(frame, "src"), "src", KEY, 7 * DAY_MS, 16_384)
    assert batch.dead_letters == []
    events = [TransactionEvent.model_validate_json(v) for v in batch.tx_values]
    assert [e.tx_id for e in events] == [1, 2]
    assert events[0].card_id == card_token("10", KEY)
    assert batch.tx_keys == [card_token("10", KEY).encode(), card_token("11", KEY).encode()]
    assert batch.tx_times == [T0, T0 + 5]
    labels = [LabelEvent.model_validate_json(v) for v in batch.label_values]
    assert len(labels) == 1
    label = labels[0]
    assert (label.tx_id, label.tx_time_ms, label.known_at_ms, label.is_fraud) == (
        2,
        T0 + 5,
        T0 + 5 + 7 * DAY_MS,
        True,
    )
    assert label.terminal_id == "6"
    assert batch.label_times == [label.known_at_ms]


def test_invalid_values_are_dead_lettered_and_neighbours_kept() -> None:
    good = {C.CARD_ID: 1, C.TERMINAL_ID: 1, C.AMOUNT: 5.0, C.EVENT_TIME: T0}
    frame = table(
        [
            {**good, C.TX_ID: 1},
            {**good, C.TX_ID: 2, C.AMOUNT: -3.0},
            {**good, C.TX_ID: 3, C.AMOUNT: float("inf")},
            {**good, C.TX_ID: 4, C.EVENT_TIME: 10},
            {**good, C.TX_ID: 5, C.IS_FRAUD: 1},
        ]
    )
    frame[C.IS_FRAUD] = [0, 0, 0, 0, 2]
    batch = events_from_table(clean_table(frame, "src"), "src", KEY, DAY_MS, 16_384)
    assert [orjson.loads(v)["tx_id"] for v in batch.tx_values] == [1]
    by_row = {d.source: d.reason for d in batch.dead_letters}
    assert by_row == {
        "src:row 2": Reason.INVALID_VALUE,
        "src:row 3": Reason.INVALID_VALUE,
        "src:row 4": Reason.INVALID_VALUE,
        "src:row 5": Reason.INVALID_VALUE,
    }
