"""What the scoring job scored, minute by minute, in Redis: the figures behind the live page's charts.

For each minute of scoring (wall clock: a record's ``scored_at_ms``) and model version, a hash counts the
transactions scored, the alerts raised and how the scores fall into :data:`SCORE_BINS` bins of equal width
over [0, 1]; a hash per namespace keeps each model version's name, threshold, and when it first and last
scored. The scoring job writes them after each committed Kafka transaction (one script call per write task
and micro-batch); the API reads them.

Exactly once: a micro-batch run again after a crash gives each write task the rows and the scoring time it
had the first time, so a call is keyed by them (its token, kept :data:`STATS_KEPT_S`) and a re-run counts
nothing again. Per-minute hashes are kept :data:`STATS_KEPT_S` after their last write.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from infra.arrow_json import read_records

#: Bins of the score distribution, of equal width over [0, 1] (a score of 1 falls in the last).
SCORE_BINS = 50
#: How long a minute's counts (and a call's token) are kept.
STATS_KEPT_S = 86_400
MINUTE_MS = 60_000

#: The fields of a score record the counts read.
_SCHEMA = pa.schema(
    [
        ("tx_id", pa.int64()),
        ("scored_at_ms", pa.int64()),
        ("score", pa.float64()),
        ("threshold", pa.float64()),
        ("model_name", pa.string()),
        ("model_version", pa.int64()),
        ("alert", pa.bool_()),
    ]
)

#: Counts one write task's scores once. KEYS = the call's token, the models hash, then the minute hashes;
#: ARGV = the minute hashes' ttl, the models hash's ttl, a JSON array per minute hash of [field, increment,
#: ...], a JSON array of [version, name, threshold, first_ms, last_ms] (all as text). Returns 0 when the
#: token was there (counted before), else 1.
_COUNT = """
if not redis.call('SET', KEYS[1], '1', 'NX', 'EX', ARGV[1]) then return 0 end
local increments = cjson.decode(ARGV[3])
for k = 3, #KEYS do
  local list = increments[k - 2]
  for i = 1, #list, 2 do redis.call('HINCRBY', KEYS[k], list[i], list[i + 1]) end
  redis.call('EXPIRE', KEYS[k], ARGV[1])
end
for _, m in ipairs(cjson.decode(ARGV[4])) do
  local v = m[1]
  local first = redis.call('HGET', KEYS[2], v .. ':first')
  if not first or tonumber(first) > tonumber(m[4]) then redis.call('HSET', KEYS[2], v .. ':first', m[4]) end
  local last = redis.call('HGET', KEYS[2], v .. ':last')
  if not last or tonumber(last) < tonumber(m[5]) then
    redis.call('HSET', KEYS[2], v .. ':last', m[5], v .. ':threshold', m[3], v .. ':name', m[2])
  end
end
redis.call('EXPIRE', KEYS[2], ARGV[2])
return 1
"""


def minute_key(minute: int, prefix: str = "") -> str:
    """Hash of one minute's counts (``minute``: UTC ms // 60,000): ``<version>:scores``,
    ``<version>:alerts``, ``<version>:b<bin>``."""
    return f"{prefix}scores:minute:{minute}"


def models_key(prefix: str = "") -> str:
    """Hash of the model versions that scored: ``<version>:name``, ``:threshold``, ``:first``, ``:last``."""
    return f"{prefix}scores:models"


def _token_key(token: str, prefix: str) -> str:
    return f"{prefix}scores:counted:{token}"


@dataclass
class Counts:
    """Scores, alerts and the scores' distribution (:data:`SCORE_BINS` bins) of one minute and version."""

    scores: int = 0
    alerts: int = 0
    bins: list[int] = field(default_factory=lambda: [0] * SCORE_BINS)

    def add(self, other: Counts) -> None:
        self.scores += other.scores
        self.alerts += other.alerts
        self.bins = [a + b for a, b in zip(self.bins, other.bins, strict=True)]


@dataclass(frozen=True)
class ScoredModel:
    """A model version that scored, and when: its first and last scoring time (UTC ms)."""

    version: int
    name: str
    threshold: float
    first_ms: int
    last_ms: int


@dataclass(frozen=True)
class ScoreStats:
    """The counts of a set of score records, by (minute, version), and the versions that scored them."""

    token: str
    counts: dict[tuple[int, int], Counts]
    models: list[ScoredModel]


def score_stats(values: Sequence[bytes]) -> ScoreStats | None:
    """The counts of score records (``ScoreRecord`` JSON, as the scores topic holds them); None for none."""
    if not values:
        return None
    rows = read_records(values, _SCHEMA)
    scored_at = rows["scored_at_ms"].to_numpy()
    minutes = scored_at // MINUTE_MS
    versions = rows["model_version"].to_numpy()
    scores = np.nan_to_num(rows["score"].to_numpy(), nan=0.0)
    bins = np.clip((scores * SCORE_BINS).astype(np.int64), 0, SCORE_BINS - 1)
    alerts = pc.fill_null(rows["alert"], False).to_numpy(zero_copy_only=False)
    # One key per (minute, version): versions are registry numbers, far below a million.
    groups, inverse = np.unique(minutes * 1_000_000 + versions, return_inverse=True)
    counts = {}
    for group, key in enumerate(groups.tolist()):
        mask = inverse == group
        counts[divmod(key, 1_000_000)] = Counts(
            scores=int(mask.sum()),
            alerts=int(alerts[mask].sum()),
            bins=np.bincount(bins[mask], minlength=SCORE_BINS).tolist(),
        )
    models = []
    for version, first in zip(*np.unique(versions, return_index=True), strict=True):
        used = scored_at[versions == version]
        models.append(
            ScoredModel(
                version=int(version),
                name=str(rows["model_name"][int(first)].as_py()),
                threshold=float(rows["threshold"][int(first)].as_py()),
                first_ms=int(used.min()),
                last_ms=int(used.max()),
            )
        )
    tx_ids = rows["tx_id"].to_numpy()
    token = f"{int(scored_at.min())}-{int(tx_ids.min())}-{int(tx_ids.max())}-{len(tx_ids)}"
    return ScoreStats(token, counts, models)


def write_score_stats(client: Any, stats: ScoreStats | None, prefix: str, retention_s: int) -> bool:
    """Add ``stats`` to the counts under ``prefix``, unless a call with the same token did; the models hash
    is kept ``retention_s``. Returns whether they were added."""
    if stats is None or not stats.counts:
        return False
    keys = [_token_key(stats.token, prefix), models_key(prefix)]
    increments = []
    for (minute, version), counts in sorted(stats.counts.items()):
        keys.append(minute_key(minute, prefix))
        fields: list[object] = [f"{version}:scores", counts.scores, f"{version}:alerts", counts.alerts]
        for i, n in enumerate(counts.bins):
            if n:
                fields += [f"{version}:b{i}", n]
        increments.append(fields)
    models = [
        [str(m.version), m.name, repr(m.threshold), str(m.first_ms), str(m.last_ms)] for m in stats.models
    ]
    args = [STATS_KEPT_S, retention_s, orjson.dumps(increments), orjson.dumps(models)]
    return bool(client.eval(_COUNT, len(keys), *keys, *args))


def read_minutes(client: Any, minutes: Sequence[int], prefix: str = "") -> dict[int, dict[int, Counts]]:
    """The counts of each of ``minutes`` by model version (a minute without scores: no versions)."""
    pipe = client.pipeline(transaction=False)
    for minute in minutes:
        pipe.hgetall(minute_key(minute, prefix))
    found: dict[int, dict[int, Counts]] = {}
    for minute, raw in zip(minutes, pipe.execute(), strict=True):
        found[minute] = _counts_of(raw)
    return found


def _counts_of(raw: Mapping[Any, Any]) -> dict[int, Counts]:
    by_version: dict[int, Counts] = {}
    for key, value in raw.items():
        version, _, name = _text(key).partition(":")
        counts = by_version.setdefault(int(version), Counts())
        if name == "scores":
            counts.scores = int(value)
        elif name == "alerts":
            counts.alerts = int(value)
        elif name.startswith("b") and 0 <= int(name[1:]) < SCORE_BINS:
            counts.bins[int(name[1:])] = int(value)
    return by_version


def read_models(client: Any, prefix: str = "") -> list[ScoredModel]:
    """The model versions that scored, the one that scored last first."""
    fields = {_text(key): _text(value) for key, value in client.hgetall(models_key(prefix)).items()}
    models = []
    for version in {key.partition(":")[0] for key in fields}:
        try:
            models.append(
                ScoredModel(
                    version=int(version),
                    name=fields[f"{version}:name"],
                    threshold=float(fields[f"{version}:threshold"]),
                    first_ms=int(fields[f"{version}:first"]),
                    last_ms=int(fields[f"{version}:last"]),
                )
            )
        except (KeyError, ValueError):  # a version's fields not all there: not shown
            continue
    return sorted(models, key=lambda m: m.last_ms, reverse=True)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
