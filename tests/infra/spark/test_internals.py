"""PySpark's private API as ``infra/spark/internals.py`` uses it: the version it was checked on, every private
name it relies on still there in the shape used, and the map-state requests it sends the very bytes PySpark
itself sends (pure logic: no JVM; the feature job's integration tests run the pipe against the real state
server). A failure here names the module to re-read against the new PySpark.
"""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pyspark
import pyspark.sql.streaming.proto.StateMessage_pb2 as message
import pytest
from pyspark.serializers import CPickleSerializer
from pyspark.sql.streaming.stateful_processor_api_client import StatefulProcessorApiClient
from pyspark.sql.types import BinaryType, LongType, StructField, StructType

from infra.spark import checkpoint
from infra.spark.internals import CHECKED_ON, PipelinedMap, protocol_problems, read_value

KEY_SCHEMA = StructType([StructField("slot", LongType())])
VALUE_SCHEMA = StructType([StructField("value", BinaryType())])
#: What Spark 4.3's state server sent for a read of a ``value binary`` entry holding these 20 bytes (Pyrolite
#: pickles the row with its schema's JSON, and binary as a latin-1 string).
STORED = bytes.fromhex("9d3fa65b80198eb36a18e4099035f1b3aa7efbd4")
ANSWER = bytes.fromhex(
    "8002637079737061726b2e73716c2e74797065730a5f6372656174655f726f775f696e626f756e645f636f6e766572746572"
    "0a7100637079737061726b2e73716c2e74797065730a5f70617273655f64617461747970655f6a736f6e5f737472696e670a"
    "585b0000007b2274797065223a22737472756374222c226669656c6473223a5b7b226e616d65223a2276616c7565222c2274"
    "797065223a2262696e617279222c226e756c6c61626c65223a747275652c226d65746164617461223a7b7d7d5d7d71018552"
    "7102855228636275696c74696e730a62797465730a635f5f6275696c74696e5f5f0a6279746561727261790a5820000000c2"
    "9d3fc2a65bc28019c28ec2b36a18c3a409c29035c3b1c2b3c2aa7ec3bbc394710358070000006c6174696e2d317104865271"
    "0585527106745271072e"
)


MODULE = "infra/spark/internals.py"


def test_pyspark_is_the_version_the_private_api_was_checked_on() -> None:
    assert pyspark.__version__ == CHECKED_ON, (
        f"{MODULE} was checked on pyspark {CHECKED_ON}, found {pyspark.__version__}: read each of its uses "
        "against the new PySpark's source, then set CHECKED_ON"
    )


def test_every_private_name_relied_on_is_still_there() -> None:
    problems = protocol_problems()
    assert not problems, f"{MODULE} relies on what pyspark {pyspark.__version__} changed: " + "; ".join(
        problems
    )


def test_the_checkpoint_formats_were_read_on_the_same_version() -> None:
    assert f"PySpark {CHECKED_ON}" in (checkpoint.__doc__ or ""), (
        f"infra/spark/checkpoint.py names another PySpark than {MODULE}'s CHECKED_ON: read Spark's on-disk "
        "formats again with the new version, then name it there"
    )


def test_importing_it_loads_no_pyspark() -> None:
    """The stages' pure cores import it through ``infra.spark.timing`` (pyproject.toml's contracts)."""
    code = (
        "import sys, infra.spark.internals; print(sorted(m for m in sys.modules if m.startswith('pyspark')))"
    )
    loaded = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    assert loaded.strip() == "[]", f"{MODULE} imports PySpark on import: {loaded}"


def test_a_change_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pyspark, "__version__", "9.9.9")
    monkeypatch.delattr(pyspark.SparkContext, "_ensure_initialized")
    problems = protocol_problems()
    assert problems == [
        f"pyspark is {CHECKED_ON} (found 9.9.9)",
        "SparkContext has _gateway and _ensure_initialized(gateway=, conf=) (AttributeError: type object "
        "'SparkContext' has no attribute '_ensure_initialized')",
    ]


def serialized(schema: StructType, values: tuple[object, ...]) -> bytes:
    """A row as PySpark's state client serialises it."""
    client = SimpleNamespace(pickleSer=CPickleSerializer())
    return bytes(StatefulProcessorApiClient._serialize_to_bytes(client, schema, values))  # type: ignore[arg-type]


def test_requests_are_the_bytes_pyspark_sends() -> None:
    client = SimpleNamespace(_stateful_processor_api_client=None)
    state = PipelinedMap(SimpleNamespace(_mapStateClient=client, _stateName="entries"))
    for slot, value in ((0, b""), (np.int64(5), b"x" * 300), (2**40 + 3, bytes(range(256)) * 9)):
        key = serialized(KEY_SCHEMA, (slot,))
        pyspark_calls = [
            message.MapStateCall(stateName="entries", getValue=message.GetValue(userKey=key)),
            message.MapStateCall(
                stateName="entries",
                updateValue=message.UpdateValue(userKey=key, value=serialized(VALUE_SCHEMA, (value,))),
            ),
            message.MapStateCall(stateName="entries", removeKey=message.RemoveKey(userKey=key)),
        ]
        ours = [*state.gets([(slot,)]), *state.puts([((slot,), (value,))]), *state.removes([(slot,)])]
        assert ours == [
            message.StateRequest(
                stateVariableRequest=message.StateVariableRequest(mapStateCall=call)
            ).SerializeToString()
            for call in pyspark_calls
        ], slot


def test_an_answer_reads_as_the_columns_pyspark_reads() -> None:
    row = CPickleSerializer().loads(ANSWER)
    assert tuple(row) == read_value(ANSWER) == (STORED,)
