"""Where a record written by the project's Kafka sink comes from, and how a reader skips the copies that an
aborted attempt left in the log.

Every record the sink writes in a micro-batch carries the header :data:`HEADER`, whose value is
``"{writer}/{batch}/{attempt}/{seq}"`` (ASCII): the transactional id of the write task (``{sink id}-{task}``),
the micro-batch id, a random id of this attempt at the batch's transaction, and the record's position
among the task's records of that batch (0, 1, ...).

A write task's records are the same, in the same order, on every attempt at its micro-batch (the sink's
exactly-once protocol already needs the same rows; the stages make their order deterministic too), so a
record is identified by ``(writer, batch, seq)`` whatever the attempt. A writer starts batch ``b + 1``
only once batch ``b`` is committed. On Apache Kafka a read_committed reader never sees an aborted
attempt's records; a broker that shows them (the embedded Tansu) puts them before the re-run's in each
partition, where they are byte-identical to the re-run's first records. So a reader of one partition
that remembers, per writer, the last batch and the highest position it has taken of it
(:class:`CopyFilter`) takes each record once: a record at or below that position of that batch, or of an
older batch, is a copy. Records without the header (written by other producers) are always taken.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import NamedTuple

#: The Kafka header of the sink's records.
HEADER = "fraud.provenance"
#: Writers remembered per partition (the least recently seen are forgotten): a partition is written by a
#: few tasks per query, and a new checkpoint brings new writers.
MAX_WRITERS = 256

Headers = Sequence[tuple[str, bytes | str | None]] | Mapping[str, bytes | str | None] | None


class Provenance(NamedTuple):
    writer: str
    batch: int
    attempt: str
    seq: int


def header_prefix(writer: str, batch: int, attempt: str) -> str:
    """The header value of a batch's records but their position: append ``str(seq)``."""
    return f"{writer}/{batch}/{attempt}/"


def parse(value: bytes | str | None) -> Provenance | None:
    """The provenance in a header value; None when it is not one."""
    if value is None:
        return None
    text = value.decode("ascii", "replace") if isinstance(value, bytes) else value
    parts = text.rsplit("/", 3)
    if len(parts) != 4 or not parts[1].isdigit() or not parts[3].isdigit():
        return None
    return Provenance(parts[0], int(parts[1]), parts[2], int(parts[3]))


def provenance_of(headers: Headers) -> Provenance | None:
    """The provenance among a record's headers (confluent-kafka's ``Message.headers()``), if any."""
    if not headers:
        return None
    if isinstance(headers, Mapping):
        return parse(headers.get(HEADER))
    for key, value in headers:
        if key == HEADER:
            return parse(value)
    return None


#: Per writer: (batch, highest position taken of it).
WriterMarks = dict[str, tuple[int, int]]


class CopyFilter:
    """Takes each record of the sink once, per partition (see the module docstring).

    ``marks`` (per partition name, per writer: batch and highest position taken) continues a filter whose
    :meth:`marks` were saved: the Spark source keeps them in its offsets, so a restarted query judges
    each record as the first run did.
    """

    def __init__(self, marks: Mapping[str, Mapping[str, Sequence[int]]] | None = None) -> None:
        self._marks: dict[str, OrderedDict[str, tuple[int, int]]] = {
            partition: OrderedDict((writer, (int(mark[0]), int(mark[1]))) for writer, mark in writers.items())
            for partition, writers in (marks or {}).items()
        }
        self.copies = 0  # records judged copies so far

    def is_copy(self, partition: str, headers: Headers) -> bool:
        """Whether a record of ``partition`` (any name for it) was taken before; the record is taken
        (remembered) when it was not."""
        found = provenance_of(headers)
        if found is None:
            return False
        return self.is_copy_of(partition, found)

    def is_copy_of(self, partition: str, found: Provenance) -> bool:
        """:meth:`is_copy` for a provenance already parsed."""
        writers = self._marks.setdefault(partition, OrderedDict())
        seen = writers.get(found.writer)
        if seen is not None and (found.batch, found.seq) <= seen:
            self.copies += 1
            return True
        writers[found.writer] = (found.batch, found.seq)
        writers.move_to_end(found.writer)
        if len(writers) > MAX_WRITERS:
            writers.popitem(last=False)
        return False

    def marks(self, partition: str) -> WriterMarks:
        """What the filter remembers of ``partition``, for a filter made later (JSON-friendly)."""
        return dict(self._marks.get(partition, {}))
