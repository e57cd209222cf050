"""The streaming stages without Spark: decode, card stage (frontier, lateness), terminal stage.

The end-to-end checks drive the stages the way the Spark job does (micro-batches, ticks carrying the
frontier, state carried between calls) and compare with the batch definition.
"""

import numpy as np
import orjson
import pandas as pd
import pyarrow as pa
import pytest

from features.core import CardState, TerminalState, compute_features, labels_from_fraud_flags
from features.definitions import EVENT_TIME_MS, FeatureParams
from features.stream import (
    DEAD,
    FEATURES,
    LABEL,
    TX,
    CardBucket,
    DecodeOptions,
    card_bucket,
    card_stage,
    decode,
    empty_events,
    from_blob,
    kafka_records,
    terminal_stage,
    ticks,
    to_blob,
)
from ingest.schemas import FeatureRecord
from ingest.simulator import SimulatorConfig, simulate
from ingest.tokens import tokenise

DAY = 86_400_000
T0 = 1_522_540_800_000
OPTIONS = DecodeOptions("tx", "labels", card_buckets=4, max_event_bytes=16_384)
TOKEN = "ab" * 16


def raw_records(rows: list[tuple[str, bytes]]) -> pa.RecordBatch:
    n = len(rows)
    return pa.RecordBatch.from_pydict(
        {
            "topic": [t for t, _ in rows],
            "partition": [0] * n,
            "offset": list(range(n)),
            "timestamp": [T0] * n,
            "key": [None] * n,
            "value": [v for _, v in rows],
        }
    )


def tx_json(tx_id: int, time: int, card: str = TOKEN, amount: float = 10.0, terminal: str = "t1") -> bytes:
    return orjson.dumps(
        {
            "schema_version": 1,
            "tx_id": tx_id,
            "card_id": card,
            "terminal_id": terminal,
            "amount": amount,
            "event_time_ms": time,
        }
    )


def test_decode_routes_events_and_dead_letters() -> None:
    label = orjson.dumps(
        {
            "schema_version": 1,
            "tx_id": 1,
            "card_id": TOKEN,
            "terminal_id": "t1",
            "tx_time_ms": T0,
            "known_at_ms": T0 + 7 * DAY,
            "is_fraud": True,
        }
    )
    batch = decode(
        raw_records([("tx", tx_json(1, T0)), ("labels", label), ("tx", b"{oops"), ("other", b"{}")]), OPTIONS
    )
    frame = batch.to_pandas()
    assert frame["kind"].tolist() == [TX, LABEL, DEAD, DEAD]
    assert frame["card_bucket"].iloc[0] == frame["card_bucket"].iloc[1] == card_bucket(TOKEN, 4)
    assert frame["known_at_ms"].iloc[1] == T0 + 7 * DAY
    assert frame["event_time_ms"].iloc[1] == T0
    assert frame["reason"].iloc[2] == "malformed_json"
    assert frame["raw"].iloc[2] == b"{oops"
    assert (frame["source_offset"] == [0, 1, 2, 3]).all()
    assert "unexpected topic" in frame["detail"].iloc[3]


def events(rows: list[tuple[int, int]]) -> pd.DataFrame:
    """Decoded transaction rows (tx_id, event time) of one card."""
    return decode(raw_records([("tx", tx_json(i, t)) for i, t in rows]), OPTIONS).to_pandas()


def tick(frontier: int) -> pd.DataFrame:
    return ticks(frontier, 1).to_pandas()


def test_card_stage_holds_events_until_the_frontier_passes_them() -> None:
    params = FeatureParams()
    bucket = CardBucket(CardState.empty(), empty_events(), -(2**62))
    rows = pd.concat([events([(1, T0), (2, T0 + 10), (3, T0 + 20)]), tick(T0 + 11)], ignore_index=True)
    bucket, out = card_stage(bucket, rows, params, terminal_buckets_n=2)
    assert sorted(out["tx_id"]) == [1, 2]
    assert not out["late"].any()
    assert bucket.pending["tx_id"].tolist() == [3]
    assert bucket.frontier_ms == T0 + 11

    # A transaction behind the frontier already passed is late: released at once, marked.
    rows = pd.concat([events([(4, T0 + 5)]), tick(T0 + 30)], ignore_index=True)
    bucket, out = card_stage(bucket, rows, params, terminal_buckets_n=2)
    assert dict(zip(out["tx_id"], out["late"], strict=True)) == {3: False, 4: True}
    assert len(bucket.pending) == 0
    by_id = out.set_index("tx_id")
    # Both follow the definition over what exists now: 3 sees 1, 4, 2 and itself; 4 sees 1 and itself.
    # Only the already released 2 (which saw 1 and itself) misses the late 4.
    assert by_id.loc[3, "card_nb_tx_1d"] == 4
    assert by_id.loc[4, "card_nb_tx_1d"] == 2


def test_dead_rows_pass_through_both_stages() -> None:
    params = FeatureParams()
    rows = decode(raw_records([("tx", b"[]")]), OPTIONS).to_pandas()
    rows = pd.concat([rows, tick(T0)], ignore_index=True)
    _, out = card_stage(CardBucket(CardState.empty(), empty_events(), -(2**62)), rows, params, 2)
    assert out["kind"].tolist() == [DEAD]
    _, final = terminal_stage(TerminalState.empty(), out, params)
    assert final["kind"].tolist() == [DEAD]
    assert final["reason"].tolist() == ["not_an_object"]


def test_kafka_records_are_feature_records_keyed_by_card_and_dead_letters_with_reasons() -> None:
    params = FeatureParams()
    raw = [("tx", tx_json(1, T0, amount=12.5)), ("tx", b"[]"), ("tx", tx_json(2, T0 + 5, amount=20.0))]
    rows = pd.concat([decode(raw_records(raw), OPTIONS).to_pandas(), tick(T0 + 6)], ignore_index=True)
    _, out = card_stage(CardBucket(CardState.empty(), empty_events(), -(2**62)), rows, params, 2)
    _, final = terminal_stage(TerminalState.empty(), out, params)

    records = kafka_records(final, "features", "dlq", params).to_pylist()

    by_topic = {topic: [r for r in records if r["topic"] == topic] for topic in ("features", "dlq")}
    assert len(by_topic["features"]) == 2
    expected = final[final["kind"] == FEATURES].set_index("tx_id")
    for record in by_topic["features"]:
        feature = FeatureRecord.model_validate_json(record["value"])
        assert record["key"] == TOKEN.encode()
        assert record["timestamp_ms"] == feature.event_time_ms == expected.loc[feature.tx_id, EVENT_TIME_MS]
        assert record["headers"] is None
        assert feature.terminal_x is None
        assert not feature.late
        assert feature.features == {
            name: expected.loc[feature.tx_id, name] for name in params.feature_columns
        }
    assert feature.features["card_nb_tx_1d"] == 2
    assert feature.features["card_avg_amount_1d"] == 16.25
    (dead,) = by_topic["dlq"]
    assert (dead["key"], dead["value"], dead["timestamp_ms"]) == (None, b"[]", None)
    assert {h["key"]: h["value"] for h in dead["headers"]} == {
        "dlq.reason": b"not_an_object",
        "dlq.detail": final.loc[final["kind"] == DEAD, "detail"].iloc[0].encode(),
        "dlq.source": b"kafka:tx",
        "dlq.partition": b"0",
        "dlq.offset": b"1",
    }


def test_state_blobs_round_trip() -> None:
    frame = events([(1, T0), (2, T0 + 1)])
    back = from_blob(to_blob(frame))
    pd.testing.assert_frame_equal(back, frame, check_dtype=False)


def simulated(days: int = 40) -> tuple[pd.DataFrame, pd.DataFrame]:
    frame = simulate(SimulatorConfig(customers=150, terminals=300, days=days, seed=11))
    tx = pd.DataFrame(
        {
            "tx_id": frame["tx_id"],
            "card_id": tokenise(frame["card_id"], b"k"),
            "terminal_id": frame["terminal_id"].astype(str),
            "amount": frame["amount"],
            EVENT_TIME_MS: frame["event_time"].astype("datetime64[ms, UTC]").astype("int64"),
            "is_fraud": frame["is_fraud"],
        }
    )
    return tx, labels_from_fraud_flags(tx, 7 * DAY)


def run_stream(
    tx: pd.DataFrame,
    labels: pd.DataFrame,
    params: FeatureParams,
    arrival: np.ndarray,
    batches: int,
    buckets: int = 3,
) -> pd.DataFrame:
    """Drive the stages like the Spark job: events arrive in ``arrival`` order, cut into micro-batches."""
    raw = [
        ("tx", tx_json(r.tx_id, r.event_time_ms, r.card_id, r.amount, r.terminal_id)) for r in tx.itertuples()
    ]
    raw += [
        (
            "labels",
            orjson.dumps(
                {
                    "schema_version": 1,
                    "tx_id": int(r.tx_id),
                    "card_id": r.card_id,
                    "terminal_id": r.terminal_id,
                    "tx_time_ms": int(r.tx_time_ms),
                    "known_at_ms": int(r.known_at_ms),
                    "is_fraud": True,
                }
            ),
        )
        for r in labels.itertuples()
    ]
    options = DecodeOptions("tx", "labels", card_buckets=buckets, max_event_bytes=16_384)
    decoded = decode(raw_records([raw[i] for i in arrival]), options).to_pandas()
    when = np.where(decoded["kind"] == LABEL, decoded["known_at_ms"].fillna(0), decoded["event_time_ms"])
    cards = {b: CardBucket(CardState.empty(), empty_events(), -(2**62)) for b in range(buckets)}
    terminals = {b: TerminalState.empty() for b in range(buckets)}
    outputs = []
    progress = -(2**62)
    for index, chunk in enumerate(np.array_split(np.arange(len(decoded)), batches)):
        progress = max(progress, int(when[chunk].max()))
        last = index == batches - 1
        frontier = progress + 1 - params.max_lateness_ms if not last else progress + 1
        rows = pd.concat([decoded.iloc[chunk], ticks(frontier, buckets).to_pandas()], ignore_index=True)
        released = []
        for b, part in rows.groupby("card_bucket"):
            cards[b], out = card_stage(cards[b], part.reset_index(drop=True), params, buckets)
            released.append(out)
        released_rows = pd.concat(released, ignore_index=True)
        for b, part in released_rows.groupby("terminal_bucket"):
            terminals[b], out = terminal_stage(terminals[b], part.reset_index(drop=True), params)
            outputs.append(out)
    return pd.concat(outputs, ignore_index=True)


def assert_equal_to_batch(
    out: pd.DataFrame, tx: pd.DataFrame, labels: pd.DataFrame, params: FeatureParams
) -> None:
    features = out[out["kind"] == FEATURES]
    assert sorted(features["tx_id"]) == sorted(tx["tx_id"]), "every transaction exactly once"
    reference = compute_features(tx, labels, params).set_index("tx_id")
    got = features.set_index("tx_id").loc[reference.index]
    for column in params.feature_columns:
        np.testing.assert_allclose(
            got[column].astype(float), reference[column].astype(float), rtol=0, atol=1e-9, err_msg=column
        )


@pytest.mark.parametrize("batches", [1, 7, 40])
def test_stream_in_order_equals_batch_for_any_micro_batching(batches: int) -> None:
    tx, labels = simulated()
    params = FeatureParams()
    when = np.concatenate([tx[EVENT_TIME_MS].to_numpy(), labels["known_at_ms"].to_numpy()])
    arrival = np.argsort(when, kind="stable")
    out = run_stream(tx, labels, params, arrival, batches)
    assert not out.loc[out["kind"] == FEATURES, "late"].any()
    assert_equal_to_batch(out, tx, labels, params)


def test_shuffled_arrival_within_allowed_lateness_equals_batch() -> None:
    tx, labels = simulated()
    lateness = 3_600_000
    params = FeatureParams(max_lateness_ms=lateness)
    when = np.concatenate([tx[EVENT_TIME_MS].to_numpy(), labels["known_at_ms"].to_numpy()])
    rng = np.random.default_rng(5)
    jitter = rng.integers(0, lateness // 2, size=len(when))  # arrival order: time + jitter < lateness
    arrival = np.argsort(when + jitter, kind="stable")
    assert (np.diff(when[arrival]) < 0).sum() > 100, "the arrival order really is shuffled"
    out = run_stream(tx, labels, params, arrival, batches=25)
    assert not out.loc[out["kind"] == FEATURES, "late"].any()
    assert_equal_to_batch(out, tx, labels, params)
