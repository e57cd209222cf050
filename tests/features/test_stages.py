"""The streaming stages without Spark: decode, card stage (frontier, lateness), terminal stage.

The end-to-end checks drive the stages the way the Spark job does (micro-batches, ticks carrying the
frontier, state carried between calls) and compare with the batch definition.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np
import orjson
import pandas as pd
import pyarrow as pa
import pytest

from contracts.records import FeatureRecord
from contracts.settings import DEFAULT_PAGE_BYTES
from features.bucket_entries import unpack_cards, unpack_terminals
from features.buckets import card_bucket
from features.core import CardState, TerminalState, compute_features, labels_from_fraud_flags
from features.decode import DecodeOptions, decode, ticks
from features.definitions import EVENT_TIME_MS, FeatureParams
from features.entries import Layout, Pages
from features.entry_store import EntryStore, entry_bytes
from features.records import kafka_records
from features.rescale import rekey_cards, rekey_terminals
from features.rows import CARD_BUCKET, TERMINAL_BUCKET, RowKind, empty_events
from features.stages import CardBucket, card_stage, terminal_stage
from features.stateful import BucketState, card_call, card_start, terminal_call, terminal_start
from features.transport import from_blob, to_blob
from infra.spark.frontier import next_frontier
from infra.spark.offset_log import Frontier
from infra.spark.timing import Timings
from ingest.simulator import SimulatorConfig, simulate
from ingest.tokens import tokenise
from tests.support.state_vars import Map, Value

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
    assert frame["kind"].tolist() == [RowKind.TX, RowKind.LABEL, RowKind.DEAD, RowKind.DEAD]
    assert frame["card_bucket"].iloc[0] == frame["card_bucket"].iloc[1] == card_bucket(TOKEN, 4)
    assert frame["known_at_ms"].iloc[1] == T0 + 7 * DAY
    assert frame["event_time_ms"].iloc[1] == T0
    assert frame["reason"].iloc[2] == "malformed_json"
    assert frame["raw"].iloc[2] == b"{oops"
    assert (frame["source_offset"] == [0, 1, 2, 3]).all()
    assert "unexpected topic" in frame["detail"].iloc[3]


def test_transactions_dated_too_far_ahead_of_the_micro_batchs_clock_are_dead() -> None:
    """Another producer's transaction dated in 2099 (ingest would have refused it) would move its card
    bucket's frontier: the decoder makes it a dead row, with its bytes and why; labels are not checked."""
    far = T0 + 3_000 * DAY
    label = orjson.dumps(
        {
            "schema_version": 1,
            "tx_id": 3,
            "card_id": TOKEN,
            "terminal_id": "t1",
            "tx_time_ms": far,
            "known_at_ms": far,
            "is_fraud": True,
        }
    )
    records = raw_records([("tx", tx_json(1, T0)), ("tx", tx_json(2, far)), ("labels", label), ("tx", b"{")])
    skewed = DecodeOptions("tx", "labels", card_buckets=4, max_event_bytes=16_384, max_clock_skew_ms=60_000)
    frame = decode(records, skewed, clock_ms=T0 + 1_000).to_pandas()
    assert frame["kind"].tolist() == [RowKind.TX, RowKind.DEAD, RowKind.LABEL, RowKind.DEAD]
    future = frame.iloc[1]
    assert (future["reason"], future["raw"], future["source_offset"]) == (
        "future_event_time",
        tx_json(2, far),
        1,
    )
    assert "ahead of the micro-batch's clock" in future["detail"]
    assert future["card_bucket"] == card_bucket(TOKEN, 4)
    assert frame.iloc[3]["reason"] == "malformed_json"
    # Without a clock (offsets planned before it existed) or a skew, nothing is checked.
    kinds = [RowKind.TX, RowKind.TX, RowKind.LABEL, RowKind.DEAD]
    assert decode(records, skewed).to_pandas()["kind"].tolist() == kinds
    assert decode(records, OPTIONS, clock_ms=T0).to_pandas()["kind"].tolist() == kinds


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


def test_a_repeated_tx_id_is_processed_once_and_dead_lettered_after() -> None:
    """Repeats of a transaction (an at-least-once producer, a file imported twice) count once: repeats within
    a batch, of one waiting for the frontier, and of one already in the card's history become dead rows."""
    params = FeatureParams()
    bucket = CardBucket(CardState.empty(), empty_events(), -(2**62))
    rows = pd.concat([events([(1, T0), (2, T0 + 10), (1, T0), (3, T0 + 20)]), tick(T0 + 11)])
    bucket, out = card_stage(bucket, rows.reset_index(drop=True), params, terminal_buckets_n=2)
    released = out[out["kind"] == RowKind.TX]
    assert sorted(released["tx_id"]) == [1, 2]
    assert released.set_index("tx_id").loc[2, "card_nb_tx_1d"] == 2
    (dead,) = out[out["kind"] == RowKind.DEAD].itertuples()
    assert (dead.tx_id, dead.reason, dead.source_offset) == (1, "duplicate_tx_id", 2)
    assert orjson.loads(dead.raw)["tx_id"] == 1 and "processed already" in dead.detail

    # 2 is in the history, 3 still waits: both repeats are dead; 4 is new.
    rows = pd.concat([events([(2, T0 + 10), (3, T0 + 20), (4, T0 + 30)]), tick(T0 + 40)])
    bucket, out = card_stage(bucket, rows.reset_index(drop=True), params, terminal_buckets_n=2)
    assert sorted(out.loc[out["kind"] == RowKind.TX, "tx_id"]) == [3, 4]
    assert sorted(out.loc[out["kind"] == RowKind.DEAD, "tx_id"]) == [2, 3]
    assert out.set_index("tx_id").loc[4, "card_nb_tx_1d"] == 4  # 1, 2, 3 and itself: no repeat counted
    features = terminal_stage(TerminalState.empty(), out, params)[1]
    records = kafka_records(features, "features", "dead", params).to_pylist()
    assert [r["topic"] for r in records].count("dead") == 2


S = 1_000  # ms


def test_a_final_tick_releases_every_waiting_event_in_event_time_order() -> None:
    """The last micro-batch of an availableNow run: its frontier (last record read + 1) may be below events
    read earlier; the final tick releases them anyway, and the bucket's frontier moves past the newest."""
    params = FeatureParams()
    bucket = CardBucket(CardState.empty(), empty_events(), -(2**62))
    rows = pd.concat([events([(1, T0 + 35 * S), (2, T0 + 10 * S), (3, T0 + 20 * S)]), tick(T0 + 15 * S)])
    bucket, out = card_stage(bucket, rows.reset_index(drop=True), params, terminal_buckets_n=2)
    assert out["tx_id"].tolist() == [2]
    assert sorted(bucket.pending["tx_id"]) == [1, 3]

    bucket, out = card_stage(bucket, ticks(T0 + 15 * S, 1, final=True).to_pandas(), params, 2)
    by_id = out.set_index("tx_id")
    assert sorted(by_id.index) == [1, 3] and not by_id["late"].any()
    # In event-time order: 3 follows 2 (10 s before it), 1 follows 3 (15 s before it).
    assert by_id.loc[3, "card_nb_tx_1d"] == 2 and by_id.loc[3, "card_secs_since_prev_tx"] == 10.0
    assert by_id.loc[1, "card_nb_tx_1d"] == 3 and by_id.loc[1, "card_secs_since_prev_tx"] == 15.0
    assert len(bucket.pending) == 0
    assert bucket.frontier_ms == T0 + 35 * S + 1


def test_a_final_tick_keeps_a_higher_frontier_and_releases_nothing_when_nothing_waits() -> None:
    params = FeatureParams()
    bucket = CardBucket(CardState.empty(), empty_events(), T0 + 50 * S)
    after, out = card_stage(bucket, ticks(T0 + 20 * S, 1, final=True).to_pandas(), params, 2)
    assert len(out) == 0 and len(after.pending) == 0
    assert after.frontier_ms == T0 + 50 * S
    after, out = card_stage(bucket, ticks(T0 + 60 * S, 1, final=True).to_pandas(), params, 2)
    assert after.frontier_ms == T0 + 60 * S


def test_after_a_final_release_and_a_restart_older_events_are_late_and_newer_ones_wait() -> None:
    """An availableNow run ends with a final tick; the next run (continuous, same checkpoint: the state goes
    through its blobs) reads more: events older than the newest released one are late, processed at once;
    newer ones wait for the frontier as usual. Nothing is released twice."""
    params = FeatureParams()
    bucket = CardBucket(CardState.empty(), empty_events(), -(2**62))
    rows = pd.concat([events([(1, T0 + 30 * S), (2, T0 + 10 * S)]), tick(T0 + 11 * S)], ignore_index=True)
    bucket, first = card_stage(bucket, rows, params, 2)
    bucket, last = card_stage(bucket, ticks(T0 + 11 * S, 1, final=True).to_pandas(), params, 2)
    assert (first["tx_id"].tolist(), last["tx_id"].tolist()) == ([2], [1])
    assert bucket.frontier_ms == T0 + 30 * S + 1

    stored = (to_blob(bucket.history.to_frame()), to_blob(bucket.pending), bucket.frontier_ms)
    bucket = CardBucket(CardState.from_frame(from_blob(stored[0])), from_blob(stored[1]), stored[2])
    # The next run's frontier starts from the final one (its tick may be lower than the bucket's).
    rows = pd.concat(
        [events([(3, T0 + 25 * S), (4, T0 + 40 * S), (5, T0 + 31 * S)]), tick(T0 + 12 * S)], ignore_index=True
    )
    bucket, out = card_stage(bucket, rows, params, 2)
    assert dict(zip(out["tx_id"], out["late"], strict=True)) == {3: True}
    # 3 sees 2 and itself, not 1 (later in event time), though 1 was processed before it.
    assert out.set_index("tx_id").loc[3, "card_nb_tx_1d"] == 2
    assert sorted(bucket.pending["tx_id"]) == [4, 5]
    assert bucket.frontier_ms == T0 + 30 * S + 1

    bucket, out = card_stage(bucket, tick(T0 + 35 * S), params, 2)
    assert dict(zip(out["tx_id"], out["late"], strict=True)) == {5: False}
    assert out.set_index("tx_id").loc[5, "card_nb_tx_1d"] == 4  # 2, 3, 1 and itself
    assert bucket.pending["tx_id"].tolist() == [4]
    assert bucket.frontier_ms == T0 + 35 * S


def test_dead_rows_pass_through_both_stages() -> None:
    params = FeatureParams()
    rows = decode(raw_records([("tx", b"[]")]), OPTIONS).to_pandas()
    rows = pd.concat([rows, tick(T0)], ignore_index=True)
    _, out = card_stage(CardBucket(CardState.empty(), empty_events(), -(2**62)), rows, params, 2)
    assert out["kind"].tolist() == [RowKind.DEAD]
    _, final = terminal_stage(TerminalState.empty(), out, params)
    assert final["kind"].tolist() == [RowKind.DEAD]
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
    expected = final[final["kind"] == RowKind.FEATURES].set_index("tx_id")
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
        "dlq.detail": final.loc[final["kind"] == RowKind.DEAD, "detail"].iloc[0].encode(),
        "dlq.source": b"kafka:tx",
        "dlq.partition": b"0",
        "dlq.offset": b"1",
    }


def test_state_blobs_round_trip() -> None:
    frame = events([(1, T0), (2, T0 + 1)])
    back = from_blob(to_blob(frame))
    pd.testing.assert_frame_equal(back, frame, check_dtype=False)


def test_dictionary_columns_of_a_blob_come_back_as_plain_values() -> None:
    history = CardState(
        card_id=np.array(["a", "b", "a", "a"], dtype=object),
        event_time_ms=np.array([1, 2, 3, 4]),
        tx_id=np.array([10, 11, 12, 13]),
        amount_cents=np.array([100, 250, 0, 7]),
    ).to_frame()
    blob = to_blob(history, dictionary=("card_id",))
    back = from_blob(blob)
    assert back["card_id"].dtype == object
    pd.testing.assert_frame_equal(back, history)


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


def new_bucket_state() -> BucketState:
    return BucketState(Value(), EntryStore(Map(), Map()))


def per_bucket(
    rows: pd.DataFrame, bucket: str, stage: Callable[[int, pd.DataFrame], pd.DataFrame]
) -> list[pd.DataFrame]:
    """``stage(b, rows of bucket b)`` for each bucket of ``rows`` (column ``bucket``), as a micro-batch's
    tasks call a stage: the outputs."""
    return [stage(b, part.reset_index(drop=True)) for b, part in rows.groupby(bucket)]


class Stages:
    """The two stages' state, per bucket, driven one micro-batch at a time.

    ``entries``: as the Spark job keeps it, each bucket's value and entries (``features.stateful``: a call
    reads only the entries of the cards and terminals it has events for); else the whole bucket in one state
    (``features.stages.card_stage``, ``terminal_stage``).
    """

    def __init__(
        self, buckets: int, layout_slots: int, entries: bool, page_bytes: int = DEFAULT_PAGE_BYTES
    ) -> None:
        self.entries = entries
        self.layout = Layout(buckets, buckets, layout_slots, layout_slots, page_bytes)
        self.cards = {b: CardBucket(CardState.empty(), empty_events(), -(2**62)) for b in range(buckets)}
        self.terminals = {b: TerminalState.empty() for b in range(buckets)}
        self.card_state = {b: new_bucket_state() for b in range(buckets)}
        self.terminal_state = {b: new_bucket_state() for b in range(buckets)}

    def micro_batch(self, rows: pd.DataFrame, params: FeatureParams) -> pd.DataFrame:
        def card(b: int, part: pd.DataFrame) -> pd.DataFrame:
            if self.entries:
                return card_call(self.card_state[b], part, params, self.layout, Timings("test"))
            self.cards[b], out = card_stage(self.cards[b], part, params, self.layout.terminal_buckets)
            return out

        def terminal(b: int, part: pd.DataFrame) -> pd.DataFrame:
            if self.entries:
                return terminal_call(self.terminal_state[b], part, params, self.layout, Timings("test"))
            self.terminals[b], out = terminal_stage(self.terminals[b], part, params)
            return out

        released = pd.concat(per_bucket(rows, CARD_BUCKET, card), ignore_index=True)
        outputs = per_bucket(released, TERMINAL_BUCKET, terminal)
        return pd.concat(outputs, ignore_index=True) if outputs else pd.DataFrame()

    def whole(self) -> tuple[list[CardBucket], list[TerminalState]]:
        """Every bucket's state, whole (what a savepoint's state reads as)."""
        if not self.entries:
            return list(self.cards.values()), list(self.terminals.values())
        cards = []
        for state in self.card_state.values():
            pending, frontier, *_ = state.value.get() or (to_blob(empty_events()), -(2**62))
            history, _ = unpack_cards(entry_bytes(value) for (value,) in state.entries.entries.values())
            cards.append(CardBucket(history, from_blob(pending), int(frontier)))
        terminals = [
            unpack_terminals(entry_bytes(value) for (value,) in state.entries.entries.values())[0]
            for state in self.terminal_state.values()
        ]
        return cards, terminals

    def rescaled(self, buckets: int, slots: int) -> Stages:
        """The state re-keyed into entries in ``buckets`` and ``slots``, as a job started from a savepoint
        (of this version's layout, or of an earlier version's whole buckets)."""
        cards, terminals = self.whole()
        new = Stages(buckets, slots, entries=True)
        for b, bucket in rekey_cards(cards, buckets).items():
            new.cards[b] = bucket
            card_start(new.card_state[b], bucket, new.layout)
        for b, state in rekey_terminals(terminals, buckets).items():
            new.terminals[b] = state
            terminal_start(new.terminal_state[b], state, new.layout)
        return new


def run_stream(
    tx: pd.DataFrame,
    labels: pd.DataFrame,
    params: FeatureParams,
    arrival: np.ndarray,
    batches: int,
    buckets: int = 3,
    final_reads: bool = False,
    rescales: Mapping[int, tuple[int, int]] | None = None,
    entries: bool = True,
    slots: int = 64,
    observe: Callable[[Stages], None] | None = None,
    page_bytes: int = DEFAULT_PAGE_BYTES,
) -> pd.DataFrame:
    """Drive the stages like the Spark job: events arrive in ``arrival`` order, cut into micro-batches.

    Transactions and labels are two partitions; each micro-batch's frontier is planned as the frontier source
    plans it (``infra.spark.frontier.next_frontier``), from what it and the micro-batches before it read.
    After the records, the availableNow run's final micro-batch, in which the connector does not move (so
    too the first micro-batch of an availableNow run after a continuous one that read everything), releases
    the rest. ``final_reads``: the micro-batch that reads the last records is final itself, as a run of a
    range's is once every partition has reached the range's end.
    ``rescales``: before the micro-batch of each index, the state is re-keyed into that many buckets and
    slots, as a job started from a savepoint in another layout. ``entries``: state kept as the job keeps it
    (:class:`Stages`), its pages cut past ``page_bytes``; ``observe`` is called with it after each
    micro-batch.
    """
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
    records = raw_records([raw[i] for i in arrival])

    def decoded_in(count: int) -> pd.DataFrame:
        return decode(records, DecodeOptions("tx", "labels", count, max_event_bytes=16_384)).to_pandas()

    decoded = decoded_in(buckets)
    # Kafka timestamps: a transaction's event time, a label's known time.
    when = np.where(
        decoded["kind"] == RowKind.LABEL, decoded["known_at_ms"].fillna(0), decoded["event_time_ms"]
    )
    partition = np.where(decoded["kind"] == RowKind.LABEL, "labels/0", "tx/0")
    ends = {name: int((partition == name).sum()) for name in ("tx/0", "labels/0")}
    stages = Stages(buckets, slots, entries, page_bytes)
    outputs = []
    frontier = Frontier()
    read = dict.fromkeys(ends, 0)  # where the connector's micro-batches so far left each partition
    stamps: dict[str, int] = {}  # the last record read of each partition by the last micro-batch

    def micro_batch(chunk: np.ndarray, planned: Frontier | None) -> None:
        parts = [decoded.iloc[chunk]]
        if planned is not None:
            parts.append(ticks(planned.frontier_ms, buckets, planned.final).to_pandas())
        outputs.append(stages.micro_batch(pd.concat(parts, ignore_index=True), params))
        if observe is not None:
            observe(stages)

    def plan(**run: bool) -> Frontier | None:
        nonlocal frontier
        lagging = [name for name in ends if read[name] < ends[name]]
        planned = next_frontier(
            frontier, frontier.batch + 1, read, stamps, lagging, params.allowed_lateness_ms, **run
        )
        frontier = planned or frontier
        return planned

    for index, chunk in enumerate(np.array_split(np.arange(len(decoded)), batches)):
        if index in (rescales or {}):
            buckets, slots = (rescales or {})[index]
            decoded = decoded_in(buckets)
            stages = stages.rescaled(buckets, slots)
        stamps = {
            name: int(when[chunk][partition[chunk] == name][-1])
            for name in ends
            if (partition[chunk] == name).any()
        }
        read = {name: read[name] + int((partition[chunk] == name).sum()) for name in ends}
        last = index == batches - 1
        micro_batch(chunk, plan(final=final_reads and last))  # the frontier of what it read itself
    if not final_reads:
        stamps = {}
        micro_batch(np.arange(0), plan(final=True))  # the connector did not move: the run's final micro-batch
    assert frontier.final
    return pd.concat(outputs, ignore_index=True)


def assert_equal_to_batch(
    out: pd.DataFrame, tx: pd.DataFrame, labels: pd.DataFrame, params: FeatureParams
) -> None:
    features = out[out["kind"] == RowKind.FEATURES]
    assert sorted(features["tx_id"]) == sorted(tx["tx_id"]), "every transaction exactly once"
    reference = compute_features(tx, labels, params).set_index("tx_id")
    got = features.set_index("tx_id").loc[reference.index]
    for column in params.feature_columns:
        np.testing.assert_allclose(
            got[column].astype(float), reference[column].astype(float), rtol=0, atol=1e-9, err_msg=column
        )


@pytest.mark.parametrize(
    ("batches", "slots", "page_bytes"),
    [(1, 64, DEFAULT_PAGE_BYTES), (7, 1, DEFAULT_PAGE_BYTES), (7, 64, 2_000), (40, 4096, 600)],
)
def test_stream_in_order_equals_batch_for_any_micro_batching(
    batches: int, slots: int, page_bytes: int
) -> None:
    """Whatever the micro-batches, and whether a page holds all of a bucket's cards or about one (its pages
    cut as they grow, most of them in the first micro-batch, or a few at a time)."""
    tx, labels = simulated()
    params = FeatureParams()
    when = np.concatenate([tx[EVENT_TIME_MS].to_numpy(), labels["known_at_ms"].to_numpy()])
    arrival = np.argsort(when, kind="stable")
    pages: list[int] = []

    def observe(stages: Stages) -> None:
        values = [state.value.get() for state in stages.card_state.values()]
        pages.append(sum(len(Pages.of_bytes(value[-1] if value else None).starts) for value in values))

    out = run_stream(
        tx, labels, params, arrival, batches, slots=slots, observe=observe, page_bytes=page_bytes
    )
    if page_bytes < DEFAULT_PAGE_BYTES:
        assert pages[-1] > 3, "the 3 buckets' pages were cut"
        assert len(set(pages)) > 2, "in more than one micro-batch"
    assert not out.loc[out["kind"] == RowKind.FEATURES, "late"].any()
    assert_equal_to_batch(out, tx, labels, params)


def test_a_stream_rescaled_between_micro_batches_equals_the_uninterrupted_one() -> None:
    """6 buckets of 64 entries, re-keyed into 12 of 8 before the third micro-batch and into 3 of 1000 before
    the fifth, with events waiting for the frontier each time: the same records as a run that kept its
    layout, and the batch result; and so from a whole-bucket state (an earlier version's) into entries."""
    tx, labels = simulated()
    params = FeatureParams()
    when = np.concatenate([tx[EVENT_TIME_MS].to_numpy(), labels["known_at_ms"].to_numpy()])
    arrival = np.argsort(when, kind="stable")
    kept = run_stream(tx, labels, params, arrival, batches=7, buckets=6)
    rescaled = run_stream(
        tx, labels, params, arrival, batches=7, buckets=6, rescales={2: (12, 8), 4: (3, 1000)}
    )
    moved = run_stream(
        tx, labels, params, arrival, batches=7, buckets=6, rescales={3: (4, 16)}, entries=False
    )
    columns = ["tx_id", *params.feature_columns]
    for out in (rescaled, moved):
        assert not out.loc[out["kind"] == RowKind.FEATURES, "late"].any()
        assert_equal_to_batch(out, tx, labels, params)
        pd.testing.assert_frame_equal(
            out.loc[out["kind"] == RowKind.FEATURES, columns].sort_values("tx_id", ignore_index=True),
            kept.loc[kept["kind"] == RowKind.FEATURES, columns].sort_values("tx_id", ignore_index=True),
        )


@pytest.mark.parametrize("final_reads", [False, True], ids=["available-now", "range"])
def test_shuffled_arrival_within_allowed_lateness_equals_batch(final_reads: bool) -> None:
    """Out-of-order arrival within the lateness, ending as an availableNow run does: with a final micro-batch
    without records after the last ones read, or (a run of a range) with the micro-batch that reads the last
    records final itself. The newest events are not the last ones read, yet each is released once, none late.

    The input ends at its last transaction, as a live stream does: labels known later (they change no
    feature) would be the newest records and carry the frontier past every transaction.
    """
    tx, labels = simulated()
    labels = labels[labels["known_at_ms"] <= tx[EVENT_TIME_MS].max()]
    lateness = 3_600_000
    params = FeatureParams(allowed_lateness_ms=lateness)
    when = np.concatenate([tx[EVENT_TIME_MS].to_numpy(), labels["known_at_ms"].to_numpy()])
    rng = np.random.default_rng(5)
    jitter = rng.integers(0, lateness, size=len(when))  # arrival order: time + jitter, each < lateness
    arrival = np.argsort(when + jitter, kind="stable")
    assert (np.diff(when[arrival]) < 0).sum() > 100, "the arrival order really is shuffled"
    is_label = arrival >= len(tx)
    last_read = max(when[arrival][~is_label][-1], when[arrival][is_label][-1])
    assert when.max() > last_read, "the newest event is read before the last one of each partition"
    out = run_stream(tx, labels, params, arrival, batches=25, final_reads=final_reads)
    assert not out.loc[out["kind"] == RowKind.FEATURES, "late"].any()
    assert_equal_to_batch(out, tx, labels, params)


def test_idle_cards_and_terminals_leave_the_state_so_it_stays_flat_while_cards_churn() -> None:
    """100 days in which every day 30 new cards spend for 3 days at terminals of their own and are never
    seen again: the entries (and bytes) the state holds stop growing once the history span (30 days, plus
    the label delay for terminals) is full, though 3,000 cards come and go; results stay the batch's."""
    rng = np.random.default_rng(8)
    days, per_day = 100, 30
    card = np.repeat(np.arange(days * per_day), 6)
    start_day = card // per_day
    when = T0 + (start_day + rng.integers(0, 3, len(card))) * DAY + rng.integers(0, DAY, len(card))
    tokens = tokenise(pd.Series(card), b"churn")
    tx = pd.DataFrame(
        {
            "tx_id": np.arange(len(card)),
            "card_id": tokens,
            "terminal_id": "t" + pd.Series(card).astype(str),
            "amount": rng.integers(100, 10_000, len(card)) / 100,
            EVENT_TIME_MS: when,
            "is_fraud": rng.random(len(card)) < 0.05,
        }
    )
    labels = labels_from_fraud_flags(tx, 7 * DAY)
    labels = labels[labels["known_at_ms"] <= when.max()]
    params = FeatureParams()
    arrival = np.argsort(np.concatenate([when, labels["known_at_ms"].to_numpy()]), kind="stable")
    held: list[tuple[int, int, int]] = []

    def observe(stages: Stages) -> None:
        cards = sum(len(state.entries.entries) for state in stages.card_state.values())
        terminals = sum(len(state.entries.entries) for state in stages.terminal_state.values())
        size = sum(
            len(value)
            for states in (stages.card_state, stages.terminal_state)
            for state in states.values()
            for (value,) in state.entries.entries.values()
        )
        held.append((cards, terminals, size))

    out = run_stream(tx, labels, params, arrival, batches=25, slots=4096, observe=observe)
    assert_equal_to_batch(out, tx, labels, params)
    mid, end = held[len(held) // 2], held[-2]  # the last micro-batch is the final one, which releases all
    print(f"entries (cards, terminals, bytes) at mid-run {mid}, at the end {end}")
    # Cards are kept 30 days after their last event (+ 3 days of spending), terminals 37 days.
    assert end[0] <= 34 * per_day and end[1] <= 41 * per_day
    for now, then in zip(end, mid, strict=True):
        assert now <= 1.15 * then, "the state stays flat"
