"""JSON objects built column by column: every row parses back to exactly the values it was built from."""

import math

import numpy as np
import orjson
import pyarrow as pa
import pytest

from infra.arrow_json import json_objects


def test_rows_parse_back_to_their_values_bit_for_bit() -> None:
    rng = np.random.default_rng(7)
    n = 2_000
    doubles = np.concatenate(
        [
            rng.random(n // 4) * 1000,
            rng.standard_normal(n // 4) * 1e-300,
            rng.standard_normal(n // 4) * 1e300,
            np.round(rng.random(n // 4) * 100, 2),
        ]
    )
    integers = rng.integers(-(2**63), 2**63 - 1, n, dtype=np.int64)
    flags = rng.random(n) < 0.5
    values = json_objects(
        [
            ("version", 1),
            ("double", pa.array(doubles)),
            ("nested", [("integer", pa.array(integers)), ("flag", pa.array(flags))]),
        ]
    )
    for row, double, integer, flag in zip(values.to_pylist(), doubles, integers, flags, strict=True):
        parsed = orjson.loads(row)
        assert parsed == {"version": 1, "double": double, "nested": {"integer": integer, "flag": flag}}
        assert math.copysign(1.0, parsed["double"]) == math.copysign(1.0, double)


def test_strings_are_escaped_and_nulls_and_non_finite_numbers_are_null() -> None:
    texts = ["plain", 'say "hi"', "back\\slash", "tab\tnew\nline", "ünïcödé €", "\x00\x1f", None]
    numbers = [1.5, float("nan"), float("inf"), -0.0, None, 1e21, 2.5e-310]
    values = json_objects([("text", pa.array(texts, pa.string())), ("number", pa.array(numbers))])
    parsed = [orjson.loads(row) for row in values.to_pylist()]
    assert [row["text"] for row in parsed] == texts
    assert [row["number"] for row in parsed] == [1.5, None, None, -0.0, None, 1e21, 2.5e-310]


def test_literal_only_objects_need_a_length_and_empty_input_gives_no_rows() -> None:
    assert (
        json_objects([("a", "x"), ("b", [("c", True)])], 2).to_pylist() == [b'{"a":"x","b":{"c":true}}'] * 2
    )
    assert json_objects([("a", pa.array([], pa.int64()))]).to_pylist() == []
    with pytest.raises(ValueError, match="length"):
        json_objects([("a", 1)])


def test_columns_of_different_lengths_and_unsupported_types_are_errors() -> None:
    with pytest.raises(ValueError, match="different lengths"):
        json_objects([("a", pa.array([1, 2])), ("b", pa.array([1]))])
    with pytest.raises(TypeError, match="cannot format"):
        json_objects([("a", pa.array([b"raw"], pa.binary()))])
