"""A Kafka outage told apart from a mistake, and waited out by a running job.

A broker that stops answering (stopped, paused, restarting, cut off by the network) shows in librdkafka as
timeouts and transport errors, whichever call meets it: a metadata request, a committed-offsets read, a
transaction's init, offsets or commit. A running job waits those out in every place it talks to Kafka
(``wait_for_kafka``, with one line when the outage starts and one when it ends), because every such call
is safe to repeat: reads, and the steps of a sink transaction that its commit marker guards. Errors that
say the request itself is wrong (authorization, a missing topic, a fatal producer error) are not waited
out. At its start a job fails fast instead: there a wrong address is more likely than an outage.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from confluent_kafka import KafkaError, KafkaException

from contracts.errors import ServiceUnavailableError
from infra.retry import Transient, wait_out

T = TypeVar("T")

#: What the lines of an outage call Kafka (``Kafka unreachable (...)``, ``Kafka answers again ...``).
KAFKA = "Kafka"

#: librdkafka's codes for a broker that does not answer, or answers "not now" while it recovers.
OUTAGE_CODES = frozenset(
    {
        KafkaError._TIMED_OUT,
        KafkaError._TIMED_OUT_QUEUE,
        KafkaError._TRANSPORT,
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError._MSG_TIMED_OUT,
        KafkaError._RESOLVE,
        KafkaError._WAIT_COORD,
        KafkaError.REQUEST_TIMED_OUT,
        KafkaError.NETWORK_EXCEPTION,
        KafkaError.COORDINATOR_NOT_AVAILABLE,
        KafkaError.NOT_COORDINATOR,
        KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.NOT_LEADER_FOR_PARTITION,
    }
)


class KafkaUnreachableError(ServiceUnavailableError):
    """Kafka did not answer a request; ``reason`` says what librdkafka reported, without advice."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


def kafka_error(error: BaseException) -> KafkaError | None:
    """The librdkafka error a ``KafkaException`` carries (None for other errors)."""
    if isinstance(error, KafkaException) and error.args and isinstance(error.args[0], KafkaError):
        return error.args[0]
    return None


def is_outage(error: BaseException | KafkaError) -> bool:
    """Whether ``error`` says Kafka is away (or not ready yet), not that the request is wrong. A call that
    failed so may be made again; not one whose transaction must be aborted first (:func:`cut_off`)."""
    if isinstance(error, KafkaUnreachableError):
        return True
    found = error if isinstance(error, KafkaError) else kafka_error(error)
    return (
        found is not None
        and not found.fatal()
        and not found.txn_requires_abort()
        and (found.code() in OUTAGE_CODES or found.retriable())
    )


def cut_off(error: BaseException | None) -> bool:
    """Whether a Kafka transaction failed because Kafka was away: its records timed out, or a call did,
    and the transaction had to be aborted. Written again once Kafka answers, it goes through."""
    found = kafka_error(error) if error is not None else None
    return found is not None and not found.fatal() and found.code() in OUTAGE_CODES


def outage_reason(error: BaseException) -> str:
    """What an outage's first line says of the error: librdkafka's words, no advice."""
    if isinstance(error, KafkaUnreachableError):
        return error.reason
    found = kafka_error(error)
    return found.str() if found is not None else f"{type(error).__name__}: {error}"


def wait_for_kafka(
    call: Callable[[], T], transient: Transient = is_outage, sleep: Callable[[float], object] = time.sleep
) -> T:
    """``call()``, repeated while Kafka is away (``transient``: :func:`is_outage`), with one line when the
    outage starts and one when it ends (``infra.retry.wait_out``, which waits between attempts with
    ``sleep``); other errors raise. For calls that are safe to repeat."""
    return wait_out(call, KAFKA, transient, sleep=sleep, describe=outage_reason)
