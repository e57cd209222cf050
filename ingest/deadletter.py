"""What is on the dead-letter topic: counts by reason, with an example of each.

The records themselves are encoded and decoded by ``contracts.events`` (original bytes as the value, the
context in ``dlq.*`` headers).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from contracts.events import DeadLetter, from_message
from infra.clients import Clients
from infra.kafka.log import read_topic


@dataclass
class DeadLetterSummary:
    """Counts of dead letters by reason, with one example of each."""

    by_reason: Counter[str] = field(default_factory=Counter)
    examples: dict[str, DeadLetter] = field(default_factory=dict)

    def add(self, letter: DeadLetter) -> None:
        self.by_reason[letter.reason.value] += 1
        self.examples.setdefault(letter.reason.value, letter)

    @property
    def total(self) -> int:
        return sum(self.by_reason.values())


def summarise_topic(clients: Clients, topic: str) -> DeadLetterSummary:
    """Counts by reason of every record on the dead-letter topic."""
    summary = DeadLetterSummary()
    for message in read_topic(clients, topic):
        summary.add(from_message(message))
    return summary
