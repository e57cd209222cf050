"""Many entries of a ``transformWithStateInPandas`` map state read, written or removed in one exchange with
the JVM's state server.

PySpark 4.3 sends each ``MapState.getValue``, ``updateValue`` and ``removeKey`` as one request over a socket
and waits for its answer before the next: a round trip per entry, which costs two context switches and,
on a busy machine, a wait for a core each (milliseconds where the work is microseconds). The state server
answers the requests of a socket one at a time, in order, so the same requests can be written together and
their answers read after: :class:`PipelinedMap` builds exactly the messages PySpark builds (its own
``StateMessage`` protocol and row serialisation, ``pyspark.sql.streaming.map_state_client``) and sends a
chunk of them at once. A chunk's requests are bounded in bytes (gets: :data:`REQUEST_BYTES`), so writing
them never waits on the server, which may be waiting for its answers to be read: no deadlock.

It relies on PySpark's private client (``_stateful_processor_api_client``), which is why the project pins
pyspark exactly; the feature job's integration tests (``tests/integration/test_feature_job.py``) run it against
the real state server.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from contracts.errors import StateError

#: At most this many bytes of reads are requested before their answers are read: the requests fit in the
#: socket's buffers, so writing them cannot wait on a server that waits for its answers to be read.
REQUEST_BYTES = 32 * 1024
#: At most this many requests are written before their answers are read (each answer of a put or a remove
#: is a few bytes, so the server never waits to write them).
REQUESTS = 1024


class StateServerError(StateError):
    """The JVM's state server refused a request."""


class PipelinedMap:
    """A Spark ``MapState`` with batched gets, puts and removes (see the module docstring)."""

    def __init__(self, map_state: Any) -> None:
        client = map_state._mapStateClient
        self._name: str = map_state._stateName
        self._client = client
        self._api = client._stateful_processor_api_client

    def get_many(self, keys: Sequence[tuple[Any, ...]]) -> list[tuple[Any, ...] | None]:
        """The values of ``keys`` (None where a key has none), in their order."""
        message = _messages()
        requests = [self._request(getValue=message.GetValue(userKey=self._key(key))) for key in keys]
        found: list[tuple[Any, ...] | None] = []
        for status, error, value in self._exchange(requests, REQUEST_BYTES):
            if status != 0:
                raise StateServerError(f"the state server refused to read map state {self._name}: {error}")
            found.append(tuple(self._api._deserialize_from_bytes(value)) if value else None)
        return found

    def update_many(self, items: Iterable[tuple[tuple[Any, ...], tuple[Any, ...]]]) -> None:
        """Write each (key, value)."""
        message = _messages()
        requests = [
            self._request(
                updateValue=message.UpdateValue(
                    userKey=self._key(key),
                    value=self._api._serialize_to_bytes(self._client.value_schema, value),
                )
            )
            for key, value in items
        ]
        self._check(self._exchange(requests), "write")

    def remove_many(self, keys: Iterable[tuple[Any, ...]]) -> None:
        """Remove each key's entry."""
        message = _messages()
        requests = [self._request(removeKey=message.RemoveKey(userKey=self._key(key))) for key in keys]
        self._check(self._exchange(requests), "remove from")

    def _key(self, key: tuple[Any, ...]) -> bytes:
        return self._api._serialize_to_bytes(self._client.user_key_schema, key)

    def _request(self, **call: Any) -> bytes:
        """A map-state request of this state, as PySpark frames it (``StateRequest`` protobuf)."""
        message = _messages()
        request = message.StateRequest(
            stateVariableRequest=message.StateVariableRequest(
                mapStateCall=message.MapStateCall(stateName=self._name, **call)
            )
        )
        return request.SerializeToString()

    def _check(self, answers: list[tuple[int, str, bytes]], what: str) -> None:
        for status, error, _ in answers:
            if status != 0:
                raise StateServerError(f"the state server refused to {what} map state {self._name}: {error}")

    def _exchange(self, requests: list[bytes], max_bytes: int | None = None) -> list[tuple[int, str, bytes]]:
        """Send the requests in chunks (at most :data:`REQUESTS`, and ``max_bytes`` of requests), each written
        at once, then answered."""
        from pyspark.serializers import write_int

        sockfile = self._api.sockfile
        answers: list[tuple[int, str, bytes]] = []
        start = 0
        while start < len(requests):
            end, size = start + 1, len(requests[start])
            while end < len(requests) and end - start < REQUESTS:
                if max_bytes is not None and size + len(requests[end]) > max_bytes:
                    break
                size += len(requests[end])
                end += 1
            for request in requests[start:end]:
                write_int(0, sockfile)  # the message version, as PySpark writes it
                write_int(len(request), sockfile)
                sockfile.write(request)
            sockfile.flush()
            answers.extend(self._api._receive_proto_message() for _ in range(end - start))
            start = end
        return answers


def _messages() -> Any:
    """PySpark's state protocol messages (imported where used: Spark's Python workers have them)."""
    import pyspark.sql.streaming.proto.StateMessage_pb2 as message

    return message
