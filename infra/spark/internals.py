"""PySpark's private API, behind one door: every use the project makes of PySpark's internals, as read in
the PySpark version :data:`CHECKED_ON` (the version ``pyproject.toml`` pins).

What is used, and why no public API does it:

- the map state's pipe (:class:`PipelinedMap`): a ``MapState``'s private client, its socket and the
  ``StateMessage`` protobuf's field numbers. PySpark sends each get, put and remove as one request and waits
  for its answer; the pipe writes many requests, then reads their answers. An answer is read without parsing
  the schema's JSON PySpark's row unpickler parses (:class:`_RowUnpickler` swaps two names of
  ``pyspark.sql.types`` that Pyrolite writes into every answer).
- the driver's JVM started with its output in a log file (:func:`launch_gateway`: ``popen_kwargs`` of
  ``pyspark.java_gateway.launch_gateway``; :func:`use_gateway`: ``SparkContext._ensure_initialized``;
  :func:`jvm_started`: ``SparkContext._gateway``), and stopped and waited for (:func:`stop_jvm_and_wait`: the
  gateway's process, for the class archive the JVM writes when it exits).
- the micro-batch id of a streaming task (:func:`task_batch_id`: the local property Spark's micro-batch
  execution sets, which PySpark's own ``foreach`` reads).
- the Python daemon's private modules and its manager (:data:`DAEMON_PRELOAD`, :func:`serve_daemon`).
- the driver's state store coordinator (:func:`start_state_store_coordinator`: a value of the JVM's
  ``StreamingQueryManager``).

One behaviour no API promises is relied on outside this module: the frontier source
(``infra.spark.frontier``) computes a micro-batch's frontier from the connector's offsets of the same batch,
because Spark asks every source for its end offset, writes the offset log, and only then asks for the
input partitions (checked on :data:`CHECKED_ON` by ``tests/integration/test_spark_kafka.py``).

:func:`protocol_problems` checks, without a JVM, that each private name is still there in the shape used;
``tests/infra/spark/test_internals.py`` fails naming this module when one is not. The coordinator is the
JVM's and is checked by the integration tests that read a checkpoint's state. A new PySpark: read each use
against its source, then set :data:`CHECKED_ON`. Spark's on-disk checkpoint formats, read and written by
``infra.spark.checkpoint``, were checked on the same version.

PySpark is imported inside the functions only: the stages' pure cores time their phases with
``infra.spark.timing``, which asks :func:`task_batch_id` for a task's micro-batch without loading PySpark.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import io
import pickle
import subprocess
from collections.abc import Callable, Iterable, Sequence
from typing import IO, TYPE_CHECKING, Any

from contracts.errors import StateError

if TYPE_CHECKING:
    from pyspark import SparkConf
    from pyspark.sql import SparkSession

#: The PySpark version every use here was read against.
CHECKED_ON = "4.2.0"

# --- the map state's pipe ---------------------------------------------------------------------------

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
#: The same, by message and field name, as :func:`protocol_problems` finds them in PySpark's descriptor.
STATE_MESSAGE_FIELDS = {
    ("StateRequest", "stateVariableRequest"): _STATE_VARIABLE_REQUEST,
    ("StateVariableRequest", "mapStateCall"): _MAP_STATE_CALL,
    ("MapStateCall", "stateName"): _STATE_NAME,
    ("MapStateCall", "getValue"): _GET_VALUE,
    ("MapStateCall", "updateValue"): _UPDATE_VALUE,
    ("MapStateCall", "removeKey"): _REMOVE_KEY,
    ("GetValue", "userKey"): _USER_KEY,
    ("UpdateValue", "userKey"): _USER_KEY,
    ("UpdateValue", "value"): _VALUE,
    ("RemoveKey", "userKey"): _USER_KEY,
}


class StateServerError(StateError):
    """The JVM's state server refused a request."""


class PipelinedMap:
    """A ``transformWithStateInPandas`` map state whose gets, puts and removes go many to an exchange with
    the JVM's state server.

    The state server answers the requests of a socket one at a time, in order, so requests can be written
    together and their answers read after, where PySpark's ``MapState`` waits for each answer (two context
    switches and, on a busy machine, a wait for a core each: milliseconds where the work is microseconds). A
    chunk's requests are bounded in bytes (gets: :data:`REQUEST_BYTES`), so writing them never waits on the
    server, which may be waiting for its answers to be read: no deadlock. The requests are the very bytes
    PySpark sends (its ``StateMessage`` protobuf and pickled rows), encoded here in a few microseconds each.
    """

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
    columns' internal values), for the column types of the project's map states (ints, bytes and text,
    which Spark's internal form keeps as they are; NumPy scalars become Python's, as PySpark makes them)."""
    import numpy as np  # here, not on import: the daemon imports this module before it limits BLAS threads
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


#: The names of ``pyspark.sql.types`` that Pyrolite writes into every value the state server sends, which
#: :class:`_RowUnpickler` reads as something cheaper.
_SCHEMA_PARSER, _ROW_CONVERTER = "_parse_datatype_json_string", "_create_row_inbound_converter"


class _RowUnpickler(pickle.Unpickler):
    """Reads a value the state server sends (a row pickled with its schema's JSON) as a plain tuple. PySpark
    parses the schema's JSON and builds a ``Row`` for every value read, which costs more than the read."""

    def find_class(self, module: str, name: str) -> Any:
        if module == "pyspark.sql.types":
            if name == _SCHEMA_PARSER:
                return str  # the schema is the map's own: not needed to read the columns
            if name == _ROW_CONVERTER:
                return _to_tuple
        return super().find_class(module, name)


def _to_tuple(_schema: str) -> Any:
    return lambda *columns: columns


def read_value(answer: bytes) -> tuple[Any, ...]:
    """A value the state server sent, as a tuple of its columns."""
    return tuple(_RowUnpickler(io.BytesIO(answer)).load())


# --- the driver's JVM ----------------------------------------------------------------------------------


def jvm_started() -> bool:
    """Whether this process's JVM (PySpark's gateway) is up."""
    from pyspark import SparkContext

    return SparkContext._gateway is not None


def launch_gateway(conf: SparkConf | None, output: IO[bytes]) -> Any:
    """Start Spark's JVM with ``conf``, its standard output and error into ``output``; the gateway to it
    (for :func:`use_gateway`)."""
    from pyspark.java_gateway import launch_gateway as launch

    return launch(conf, popen_kwargs={"stdout": output, "stderr": subprocess.STDOUT})


def use_gateway(gateway: Any, conf: SparkConf) -> None:
    """Make ``gateway`` (:func:`launch_gateway`) the JVM of this process's Spark context, as if PySpark had
    started it: the session built next runs there."""
    from pyspark import SparkContext

    SparkContext._ensure_initialized(gateway=gateway, conf=conf)


def stop_jvm_and_wait(spark: SparkSession, timeout_s: float) -> None:
    """Stop ``spark`` and its JVM, and wait up to ``timeout_s`` for the JVM to exit (what it writes when it
    exits is then whole). PySpark's JVM exits when its standard input closes."""
    from pyspark import SparkContext

    gateway = SparkContext._gateway
    spark.stop()
    if gateway is not None:
        gateway.shutdown()
        process = gateway.proc
        process.stdin.close()
        process.wait(timeout_s)


def start_state_store_coordinator(spark: SparkSession) -> None:
    """Make sure ``spark`` runs the driver's state store coordinator, which Spark starts with a session's first
    streaming query: Spark 4.2's state data source asks it when it loads a RocksDB snapshot, and without it
    fails (``RpcEndpointNotFoundException: Cannot find endpoint: ...StateStoreCoordinator``). Touching
    ``StreamingQueryManager.stateStoreCoordinator`` (a value of Spark's JVM, not in PySpark's API) starts it;
    in a session that runs a query it is there already."""
    spark._jsparkSession.streams().stateStoreCoordinator()


# --- Spark's Python processes ---------------------------------------------------------------------------

#: Spark's local property with the micro-batch id of a streaming task (also read by PySpark's ``foreach``).
BATCH_ID_PROPERTY = "streaming.sql.batchId"


def task_batch_id(task: Any) -> int | None:
    """The micro-batch id of the running Spark task ``task`` (a ``TaskContext``; None: not a streaming one)."""
    batch = task.getLocalProperty(BATCH_ID_PROPERTY)
    return None if batch is None else int(batch)


#: PySpark's modules a Python worker imports (its worker loop, its Arrow serializers, the workers of Python
#: data sources and the state client), which a preloading daemon imports before it forks them.
DAEMON_PRELOAD = (
    "pyspark.worker",
    "pyspark.sql.pandas.serializers",
    "pyspark.sql.worker.plan_data_source_read",
    "pyspark.sql.worker.write_into_data_source",
    "pyspark.sql.streaming.stateful_processor_api_client",
)


def serve_daemon() -> None:
    """Run PySpark's worker daemon in this process: it forks a Python worker per task Spark asks for."""
    from pyspark import daemon

    daemon.manager()


# --- the check -------------------------------------------------------------------------------------------


def protocol_problems() -> list[str]:
    """What this module relies on that the installed PySpark no longer does (empty: nothing), one phrase
    each: its version, and each private name still there in the shape used. Reads PySpark's modules; starts
    no JVM."""
    problems = []
    for relied_on, holds in _expectations():
        try:
            if not holds():
                problems.append(relied_on)
        except (ImportError, AttributeError, KeyError, TypeError, OSError) as exc:
            problems.append(f"{relied_on} ({type(exc).__name__}: {exc})")
    return problems


def _source_has(module: str, name: str, *texts: str) -> bool:
    """Whether the source of ``name`` (a dotted name in ``module``; empty: the module) has every text."""
    found: Any = importlib.import_module(module)
    for part in filter(None, name.split(".")):
        found = getattr(found, part)
    source = inspect.getsource(found)
    return all(text in source for text in texts)


def _parameters(function: Callable[..., Any]) -> set[str]:
    return set(inspect.signature(function).parameters)


def _field_numbers() -> dict[tuple[str, str], int]:
    """The numbers PySpark's ``StateMessage`` descriptor gives the fields the pipe encodes."""
    from pyspark.sql.streaming.proto import StateMessage_pb2

    messages = StateMessage_pb2.DESCRIPTOR.message_types_by_name
    return {
        (message, name): messages[message].fields_by_name[name].number
        for message, name in STATE_MESSAGE_FIELDS
    }


def _expectations() -> list[tuple[str, Callable[[], bool]]]:
    """(what is relied on, whether the installed PySpark still does it)."""
    import pyspark

    state = "pyspark.sql.streaming"
    client = f"{state}.stateful_processor_api_client"
    return [
        (f"pyspark is {CHECKED_ON} (found {pyspark.__version__})", lambda: pyspark.__version__ == CHECKED_ON),
        (
            "MapState keeps its client in _mapStateClient and its name in _stateName",
            lambda: _source_has(
                f"{state}.stateful_processor",
                "MapState.__init__",
                "self._mapStateClient =",
                "self._stateName =",
            ),
        ),
        (
            "MapStateClient keeps its API client in _stateful_processor_api_client",
            lambda: _source_has(
                f"{state}.map_state_client",
                "MapStateClient.__init__",
                "self._stateful_processor_api_client =",
            ),
        ),
        (
            "StatefulProcessorApiClient talks over its sockfile",
            lambda: _source_has(client, "StatefulProcessorApiClient.__init__", "self.sockfile ="),
        ),
        (
            "a request is framed as write_int(0), write_int(length), then the message",
            lambda: _source_has(
                client,
                "StatefulProcessorApiClient._send_proto_message",
                "write_int(0, self.sockfile)",
                "write_int(len(message), self.sockfile)",
            ),
        ),
        (
            "_receive_proto_message returns (statusCode, errorMessage, value)",
            lambda: _source_has(
                client,
                "StatefulProcessorApiClient._receive_proto_message",
                "return message.statusCode, message.errorMessage, message.value",
            ),
        ),
        (
            f"StateMessage's field numbers are {STATE_MESSAGE_FIELDS}",
            lambda: _field_numbers() == STATE_MESSAGE_FIELDS,
        ),
        (
            "pyspark.serializers has write_int and pickle_protocol",
            lambda: _source_has("pyspark.serializers", "", "def write_int(", "pickle_protocol ="),
        ),
        (
            f"pyspark.sql.types has {_SCHEMA_PARSER} and {_ROW_CONVERTER}",
            lambda: all(
                callable(getattr(importlib.import_module("pyspark.sql.types"), name))
                for name in (_SCHEMA_PARSER, _ROW_CONVERTER)
            ),
        ),
        (
            "pyspark.java_gateway.launch_gateway takes popen_kwargs and keeps the JVM's process in gateway.proc",
            lambda: _source_has(
                "pyspark.java_gateway", "launch_gateway", "popen_kwargs", "gateway.proc = proc"
            ),
        ),
        (
            "SparkContext has _gateway and _ensure_initialized(gateway=, conf=)",
            lambda: (
                hasattr(pyspark.SparkContext, "_gateway")
                and {"gateway", "conf"} <= _parameters(pyspark.SparkContext._ensure_initialized)
            ),
        ),
        (
            f"PySpark's foreach reads the task property {BATCH_ID_PROPERTY}",
            lambda: _source_has(f"{state}.readwriter", "", f'"{BATCH_ID_PROPERTY}"'),
        ),
        (
            "pyspark.daemon has manager()",
            lambda: callable(importlib.import_module("pyspark.daemon").manager),
        ),
        (
            f"the daemon's modules {', '.join(DAEMON_PRELOAD)} exist",
            lambda: all(importlib.util.find_spec(name) is not None for name in DAEMON_PRELOAD),
        ),
    ]
