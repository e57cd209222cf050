"""Idempotent writes of the lookup store (its keys: ``contracts.redis_keys``).

Every key starts with a prefix chosen by the job (empty for the live pipeline), so isolated runs such as
A/B replays never touch the live keys. Writes are idempotent: writing the same micro-batch again (a
re-run after a crash) leaves the same values, and an older record never overwrites a newer one.

Keys: a card's latest features (written by the feature job), its latest score and its alerts, each alert
by tx id, and the recent alerts of all cards (the live page). An alert is written by one Lua script that
touches its hash, its card's set and the recent set together, and latest values are set by a script over a
few hundred keys at a time; on a Redis Cluster those keys would need a common hash tag.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, get_args, get_origin

import orjson
import pyarrow as pa
from pydantic import BaseModel

from contracts.records import AlertRecord, ScoreRecord
from contracts.redis_keys import JSON_FIELDS, alert_key, card_alerts_key, card_score_key, recent_alerts_key
from infra.arrow_json import newest_rows, read_records, text_arrays

#: Sets each hash to its fields unless it holds a newer record; records are ordered by (event_time_ms,
#: tx_id). KEYS = the hashes; ARGV = ttl_s, the fields' names (a JSON array), then per key: event_time_ms,
#: tx_id and the fields' values (a JSON array of strings, in the names' order). Returns the number of
#: hashes set.
#:
#: The names travel once per call and a key's values in one argument, decoded by the server (``cjson``, in
#: every Redis and Valkey): the client packs three arguments a key instead of two per field, which was most
#: of a large batch's time, and the server does about the same work. The values are strings, stored as
#: sent (a JSON number would reach Lua as a double, and come back rounded).
_SET_IF_NEWER = """
local ttl = tonumber(ARGV[1])
local names = cjson.decode(ARGV[2])
local n = #names
local fields = {'event_time_ms', false, 'tx_id', false}
local set = 0
for k = 1, #KEYS do
  local i = 3 * k
  local time, tx_id = ARGV[i], ARGV[i + 1]
  local stored = redis.call('HMGET', KEYS[k], 'event_time_ms', 'tx_id')
  local older = false
  if stored[1] then
    local t, new_t = tonumber(stored[1]), tonumber(time)
    older = t > new_t or (t == new_t and tonumber(stored[2]) > tonumber(tx_id))
  end
  if not older then
    local values = cjson.decode(ARGV[i + 2])
    fields[2], fields[4] = time, tx_id
    for j = 1, n do
      fields[3 + 2 * j], fields[4 + 2 * j] = names[j], values[j]
    end
    redis.call('HSET', KEYS[k], unpack(fields, 1, 4 + 2 * n))
    if ttl > 0 then redis.call('EXPIRE', KEYS[k], ttl) end
    set = set + 1
  end
end
return set
"""
#: Records per script call: one call blocks Redis while it runs, so a large batch is sent in slices.
_SET_IF_NEWER_SLICE = 500


def set_latest(client: Any, records: Iterable[tuple[str, int, int, Mapping[str, object]]], ttl_s: int) -> int:
    """Write (key, event_time_ms, tx_id, fields) records, each only if newer than what the key holds.

    A value is stored as text: a number as Python's ``repr`` writes it (as redis-py sends one), None as
    empty text. All in one round trip. Returns the number of keys updated.
    """
    groups: dict[tuple[str, ...], _Latest] = {}
    for key, event_time_ms, tx_id, fields in records:
        group = groups.setdefault(tuple(fields), _Latest())
        group.add(key, event_time_ms, tx_id, orjson.dumps([_text_of(value) for value in fields.values()]))
    pipe = client.pipeline(transaction=False)
    for names, group in groups.items():
        group.queue(client, pipe, names, ttl_s)
    return sum(int(result) for result in pipe.execute())


def set_latest_encoded(
    client: Any,
    names: Sequence[str],
    keys: list[str],
    times: list[int],
    tx_ids: list[int],
    values: list[bytes],
    ttl_s: int,
) -> int:
    """:func:`set_latest` of records with the same fields ``names``, their values already JSON arrays of
    strings (``infra.arrow_json.text_arrays`` builds them for many records at once). Returns the number of
    keys updated."""
    pipe = client.pipeline(transaction=False)
    _Latest(keys, times, tx_ids, values).queue(client, pipe, names, ttl_s)
    return sum(int(result) for result in pipe.execute())


@dataclass
class _Latest:
    """Records of the same fields for :data:`_SET_IF_NEWER`: keys, times, tx ids, values (JSON arrays)."""

    keys: list[str] = field(default_factory=list)
    times: list[int] = field(default_factory=list)
    tx_ids: list[int] = field(default_factory=list)
    values: list[bytes] = field(default_factory=list)

    def add(self, key: str, time_ms: int, tx_id: int, values: bytes) -> None:
        self.keys.append(key)
        self.times.append(time_ms)
        self.tx_ids.append(tx_id)
        self.values.append(values)

    def queue(self, client: Any, pipe: Any, names: Sequence[str], ttl_s: int) -> None:
        """The script calls that write the records, a few hundred records each, on ``pipe``."""
        script = client.register_script(_SET_IF_NEWER)
        header = [ttl_s, orjson.dumps(list(names))]
        for start in range(0, len(self.keys), _SET_IF_NEWER_SLICE):
            end = start + _SET_IF_NEWER_SLICE
            args: list[object] = list(header)
            for record in zip(
                self.times[start:end], self.tx_ids[start:end], self.values[start:end], strict=True
            ):
                args += record
            script(keys=self.keys[start:end], args=args, client=pipe)


def _text_of(value: object) -> str:
    """A hash value as redis-py sends it (a number by ``repr``), None as empty text."""
    kind = type(value)
    if kind is float or kind is int:
        return repr(value)
    if kind is str:
        return value  # type: ignore[return-value]
    if value is None:
        return ""
    if isinstance(value, float):  # a subclass, such as numpy's float64: its value, not its repr
        return repr(float(value))
    if isinstance(value, int) and not isinstance(value, bool):
        return repr(int(value))
    raise TypeError(f"a Redis hash value is text or a number, not {kind.__name__}: {value!r}")


# --- Scores and alerts -------------------------------------------------------------------------------
#
# Retention: hashes (an alert, a card's latest score) expire ``retention_s`` after they were last written
# (wall-clock EXPIRE, as Redis offers). Sorted sets are trimmed by EVENT time: members older than
# ``retention_s`` before the newest member are removed on every write, so a replay of old data keeps a
# window of its own event time instead of vanishing at once; the sets also expire ``retention_s`` after
# their last write. A sorted-set member whose alert hash has already expired is skipped on read.

#: Size bound of the recent-alerts set behind the live page: only the newest (by event time) are kept.
RECENT_ALERTS_MAX = 1_000


#: Writes one alert. KEYS = alert hash, card's alert set, recent-alert set; ARGV = tx_id, event_time_ms,
#: retention_ms, ttl_s, recent_max, field, value, ... Returns 1 if the alert hash did not exist before.
_WRITE_ALERT = """
local new = redis.call('EXISTS', KEYS[1]) == 0 and 1 or 0
redis.call('HSET', KEYS[1], unpack(ARGV, 6))
redis.call('EXPIRE', KEYS[1], ARGV[4])
for i = 2, 3 do
  redis.call('ZADD', KEYS[i], ARGV[2], ARGV[1])
  local newest = redis.call('ZRANGE', KEYS[i], -1, -1, 'WITHSCORES')[2]
  redis.call('ZREMRANGEBYSCORE', KEYS[i], '-inf', '(' .. (tonumber(newest) - tonumber(ARGV[3])))
  redis.call('EXPIRE', KEYS[i], ARGV[4])
end
redis.call('ZREMRANGEBYRANK', KEYS[3], 0, -1 - tonumber(ARGV[5]))
return new
"""


def write_alerts(
    client: Any,
    alerts: Iterable[AlertRecord],
    prefix: str,
    retention_s: int,
    recent_max: int = RECENT_ALERTS_MAX,
) -> int:
    """Store alerts: their hashes, each card's alert set and the recent-alert set, in one pipeline.

    Idempotent: writing the same alerts again leaves the same state (an alert is keyed by its tx_id).
    Returns the number of alerts that were not stored before.
    """
    if retention_s <= 0:
        raise ValueError("retention_s must be positive")
    script = client.register_script(_WRITE_ALERT)
    pipe = client.pipeline(transaction=False)
    count = 0
    for alert in alerts:
        keys = [
            alert_key(alert.tx_id, prefix),
            card_alerts_key(alert.card_id, prefix),
            recent_alerts_key(prefix),
        ]
        args: list[object] = [alert.tx_id, alert.event_time_ms, retention_s * 1000, retention_s, recent_max]
        for name, value in _to_hash(alert).items():
            args += [name, value]
        script(keys=keys, args=args, client=pipe)
        count += 1
    return sum(int(result) for result in pipe.execute()) if count else 0


def write_scores(client: Any, scores: Iterable[ScoreRecord], prefix: str, retention_s: int) -> int:
    """Keep each card's latest score: an older score (by (event_time_ms, tx_id)) never overwrites a newer.

    Idempotent and pipelined; only the newest score per card in the batch is sent. Returns the number of
    cards whose latest score changed.
    """
    if retention_s <= 0:
        raise ValueError("retention_s must be positive")
    latest: dict[str, ScoreRecord] = {}
    for score in scores:
        known = latest.get(score.card_id)
        if known is None or (score.event_time_ms, score.tx_id) > (known.event_time_ms, known.tx_id):
            latest[score.card_id] = score
    return set_latest(
        client,
        ((card_score_key(card, prefix), s.event_time_ms, s.tx_id, _to_hash(s)) for card, s in latest.items()),
        retention_s,
    )


def write_score_values(client: Any, values: Sequence[bytes], prefix: str, retention_s: int) -> int:
    """:func:`write_scores` of score records as the scores topic holds them (``ScoreRecord`` JSON, as a
    scoring job wrote them), read and written column by column: the same hashes, without a Python loop over
    the records (a micro-batch of many cards holds thousands). Records whose JSON does not read as the
    fields' types (an int written as 1.5e+12, which the model takes) are validated one by one instead."""
    if retention_s <= 0:
        raise ValueError("retention_s must be positive")
    if not values:
        return 0
    fields = ScoreRecord.model_fields
    schema = pa.schema([(name, _arrow_type(fields[name].annotation)) for name in fields])
    try:
        records = read_records(values, schema)
    except pa.ArrowInvalid:
        return write_scores(client, map(ScoreRecord.model_validate_json, values), prefix, retention_s)
    latest = newest_rows(records, "card_id", ("event_time_ms", "tx_id"))
    names = [name for name in fields if name not in _SCORE_LEFT_OUT]
    return set_latest_encoded(
        client,
        names,
        [card_score_key(card, prefix) for card in latest.column("card_id").to_pylist()],
        latest.column("event_time_ms").to_pylist(),
        latest.column("tx_id").to_pylist(),
        text_arrays([latest.column(name) for name in names], typed=True).to_pylist(),
        retention_s,
    )


def _arrow_type(annotation: Any) -> pa.DataType:
    """The Arrow type of a record field's Python type (a literal: its value's)."""
    if get_origin(annotation) is Literal:
        annotation = type(get_args(annotation)[0])
    types: dict[Any, pa.DataType] = {bool: pa.bool_(), int: pa.int64(), float: pa.float64(), str: pa.string()}
    if annotation not in types:
        raise TypeError(f"no Arrow type for a record field of type {annotation}")
    return types[annotation]


#: What a card's latest score hash leaves out of the score: the card, which its key names.
_SCORE_LEFT_OUT = frozenset({"card_id"})


def _to_hash(record: BaseModel) -> dict[str, str | int | float]:
    """Redis hash fields of a score or alert: scalars as text, lists and dicts as JSON, bools as 0/1."""
    fields: dict[str, str | int | float] = {}
    for name, value in record.model_dump(
        exclude=set(_SCORE_LEFT_OUT) if isinstance(record, ScoreRecord) else None
    ).items():
        if name in JSON_FIELDS:
            fields[name] = orjson.dumps(value).decode()
        elif isinstance(value, bool):
            fields[name] = int(value)
        else:
            fields[name] = value
    return fields
