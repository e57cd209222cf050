"""Redis keys and idempotent writes of the lookup store, defined once.

Every key starts with a prefix chosen by the job (empty for the live pipeline), so isolated runs such as
A/B replays never touch the live keys. Writes are idempotent: writing the same micro-batch again (a
re-run after a crash) leaves the same values, and an older record never overwrites a newer one.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

#: Sets a hash to the given fields unless it holds a newer record: ARGV = event_time_ms, tx_id, ttl_s,
#: field, value, field, value, ...; records are ordered by (event_time_ms, tx_id).
_SET_IF_NEWER = """
local time = redis.call('HGET', KEYS[1], 'event_time_ms')
if time then
  local t, new_t = tonumber(time), tonumber(ARGV[1])
  if t > new_t or (t == new_t and tonumber(redis.call('HGET', KEYS[1], 'tx_id')) > tonumber(ARGV[2])) then
    return 0
  end
end
redis.call('HSET', KEYS[1], 'event_time_ms', ARGV[1], 'tx_id', ARGV[2], unpack(ARGV, 4))
if tonumber(ARGV[3]) > 0 then redis.call('EXPIRE', KEYS[1], ARGV[3]) end
return 1
"""


def card_features_key(card_id: str, prefix: str = "") -> str:
    """Hash with the latest features of a card."""
    return f"{prefix}card:{card_id}:features"


def set_latest(client: Any, records: Iterable[tuple[str, int, int, Mapping[str, object]]], ttl_s: int) -> int:
    """Write (key, event_time_ms, tx_id, fields) records, each only if newer than what the key holds.

    Returns the number of keys updated.
    """
    script = client.register_script(_SET_IF_NEWER)
    pipe = client.pipeline(transaction=False)
    count = 0
    for key, event_time_ms, tx_id, fields in records:
        flat: list[object] = [event_time_ms, tx_id, ttl_s]
        for name, value in fields.items():
            flat += [name, "" if value is None else value]
        script(keys=[key], args=flat, client=pipe)
        count += 1
    if count:
        return sum(int(result) for result in pipe.execute())
    return 0
