"""Many entries of a ``transformWithStateInPandas`` map state read, written or removed in one exchange with
the JVM's state server.

PySpark 4.3 sends each ``MapState.getValue``, ``updateValue`` and ``removeKey`` as one request over a socket
and waits for its answer before the next: a round trip per entry, which costs two context switches and,
on a busy machine, a wait for a core each (milliseconds where the work is microseconds). The state server
answers the requests of a socket one at a time, in order, so the same requests can be written together and
their answers read after: :class:`PipelinedMap` sends a chunk of requests at once. A chunk's requests are
bounded in bytes (gets: :data:`REQUEST_BYTES`), so writing them never waits on the server, which may be
waiting for its answers to be read: no deadlock. The requests are the very bytes PySpark sends (its
``StateMessage`` protobuf and pickled rows, ``pyspark.sql.streaming.map_state_client``), encoded here in a
few microseconds each; an answer's value is read as a plain tuple, without parsing the schema JSON that
comes with every value (about half of a read's Python time in PySpark's own client).

It relies on PySpark's private client (``_stateful_processor_api_client``), which is why the project pins
pyspark exactly; the feature job's integration tests (``tests/integration/test_feature_job.py``) run it against
the real state server.
"""

from __future__ import annotations

import io
import pickle
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from contracts.errors import StateError

#: At most this many bytes of reads are requested before their answers are read: the requests fit in the
#: socket's buffers, so writing them cannot wait on a server that waits for its answers to be read.
REQUEST_BYTES = 32 * 1024
#: At most this many requests are written before their answers are read (each answer of a put or a remove
#: is a few bytes, so the server never waits to write them).
REQUESTS = 1024

#: Field numbers of PySpark's ``StateMessage`` protocol (``pyspark/sql/streaming/proto/StateMessage.proto``):
#: ``StateRequest.stateVariableRequest``, ``StateVariableRequest.mapStateCall``, the ``MapStateCall`` fields
#: used, and the key and value of ``GetValue``, ``UpdateValue`` and ``RemoveKey``.
_STATE_VARIABLE_REQUEST = 3
_MAP_STATE_CALL = 3
_STATE_NAME, _GET_VALUE, _UPDATE_VALUE, _REMOVE_KEY = 1, 3, 5, 9
_USER_KEY, _VALUE = 1, 2


class StateServerError(StateError):
    """The JVM's state server refused a request."""


class PipelinedMap:
    """A Spark ``MapState`` with batched gets, puts and removes (see the module docstring)."""

    def __init__(self, map_state: Any) -> None:
        client = map_state._mapStateClient
        self._name: str = map_state._stateName
        self._api = client._stateful_processor_api_client
        self._name_field = _field(_STATE_NAME, self._name.encode())

    def get_many(self, keys: Sequence[tuple[Any, ...]]) -> list[tuple[Any, ...] | None]:
        """The values of ``keys`` (None where a key has none), in their order."""
        found: list[tuple[Any, ...] | None] = []
        for status, error, value in self._exchange(self.gets(keys), REQUEST_BYTES):
            if status != 0:
                raise StateServerError(f"the state server refused to read map state {self._name}: {error}")
            found.append(read_value(value) if value else None)
        return found

    def update_many(self, items: Iterable[tuple[tuple[Any, ...], tuple[Any, ...]]]) -> None:
        """Write each (key, value)."""
        self._check(self._exchange(self.puts(items)), "write")

    def remove_many(self, keys: Iterable[tuple[Any, ...]]) -> None:
        """Remove each key's entry."""
        self._check(self._exchange(self.removes(keys)), "remove from")

    def gets(self, keys: Iterable[tuple[Any, ...]]) -> list[bytes]:
        """The requests reading ``keys``, as PySpark encodes them (``StateRequest`` protobuf)."""
        return [self._request(_GET_VALUE, _field(_USER_KEY, _pickled(key))) for key in keys]

    def puts(self, items: Iterable[tuple[tuple[Any, ...], tuple[Any, ...]]]) -> list[bytes]:
        """The requests writing each (key, value)."""
        return [
            self._request(_UPDATE_VALUE, _field(_USER_KEY, _pickled(key)) + _field(_VALUE, _pickled(value)))
            for key, value in items
        ]

    def removes(self, keys: Iterable[tuple[Any, ...]]) -> list[bytes]:
        """The requests removing ``keys``."""
        return [self._request(_REMOVE_KEY, _field(_USER_KEY, _pickled(key))) for key in keys]

    def _request(self, call: int, payload: bytes) -> bytes:
        """``stateVariableRequest { mapStateCall { stateName, <call> { payload } } }``."""
        return _field(
            _STATE_VARIABLE_REQUEST, _field(_MAP_STATE_CALL, self._name_field + _field(call, payload))
        )

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


def _pickled(values: tuple[Any, ...]) -> bytes:
    """A key's or a value's columns as PySpark sends them (``_serialize_to_bytes``: a pickled tuple of the
    columns' internal values), for the column types of the project's map states (ints and bytes, which
    Spark's internal form keeps as they are; NumPy scalars become Python's, as PySpark makes them)."""
    from pyspark.serializers import pickle_protocol

    return pickle.dumps(tuple(v.item() if isinstance(v, np.generic) else v for v in values), pickle_protocol)


def _varint(number: int) -> bytes:
    if number < 0x80:
        return bytes((number,))
    out = bytearray()
    while number > 0x7F:
        out.append(number & 0x7F | 0x80)
        number >>= 7
    out.append(number)
    return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field (a message, a string or bytes)."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


class _RowUnpickler(pickle.Unpickler):
    """Reads a value the state server sends (a row pickled with its schema's JSON) as a plain tuple. PySpark
    parses the schema's JSON and builds a ``Row`` for every value read, which costs more than the read."""

    def find_class(self, module: str, name: str) -> Any:
        if module == "pyspark.sql.types":
            if name == "_parse_datatype_json_string":
                return str  # the schema is the map's own: not needed to read the columns
            if name == "_create_row_inbound_converter":
                return _to_tuple
        return super().find_class(module, name)


def _to_tuple(_schema: str) -> Any:
    return lambda *columns: columns


def read_value(answer: bytes) -> tuple[Any, ...]:
    """A value the state server sent, as a tuple of its columns."""
    return tuple(_RowUnpickler(io.BytesIO(answer)).load())
