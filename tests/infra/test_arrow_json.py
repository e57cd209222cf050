"""JSON objects built column by column: every row parses back to exactly the values it was built from."""

import math

import numpy as np
import orjson
import pyarrow as pa
import pytest

from infra.arrow_json import json_objects, newest_rows, python_texts, text_arrays


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


def test_python_texts_are_what_python_writes_for_the_json_arrow_writes() -> None:
    """Every magnitude: the text equals ``repr`` of what orjson reads from json_objects' text of the value
    (an integral number reads as an int), which is what set_latest stores for a parsed record."""
    rng = np.random.default_rng(11)
    doubles = np.concatenate(
        [
            10 ** rng.uniform(-30, 30, 20_000) * rng.choice([-1, 1], 20_000),
            np.round(10 ** rng.uniform(0, 20, 2_000)),
            [0.0, -0.0, 1e-4, 9.999999999999999e-05, 1e16, 9999999999999998.0, 2.0**53, 0.1, 1 / 3, 12.5],
        ]
    )
    integers = rng.integers(-(2**63), 2**63 - 1, 2_000, dtype=np.int64)
    for values in (pa.array(doubles), pa.array(integers)):
        written = json_objects([("v", values)]).to_pylist()
        want = [repr(orjson.loads(row)["v"]) for row in written]
        assert python_texts(values).to_pylist() == want


def test_python_texts_of_nulls_bools_and_strings() -> None:
    assert python_texts(pa.array([1.5, None, float("nan")])).to_pylist() == ["1.5", "", "nan"]
    assert python_texts(pa.array([True, False, None])).to_pylist() == ["1", "0", ""]
    assert python_texts(pa.array(["a", None, "ü"])).to_pylist() == ["a", "", "ü"]
    assert python_texts(pa.nulls(2)).to_pylist() == ["", ""]
    with pytest.raises(TypeError, match="cannot write Arrow type"):
        python_texts(pa.array([b"bytes"]))


def test_text_arrays_hold_each_rows_texts_as_json_strings() -> None:
    texts = ["plain", 'say "hi"', "back\\slash", "tab\tnew\nline", "ünïcödé €", "\x00\x1f", None]
    numbers = [1.0, 2.5, None, 1e-7, -0.0, 3e20, 7.0]
    rows = text_arrays([pa.array(texts), pa.array(numbers), pa.array(range(7))]).to_pylist()
    written = [orjson.loads(row)["v"] for row in json_objects([("v", pa.array(numbers))]).to_pylist()]
    assert written[:2] == [1, 2.5], "Arrow writes 1.0 as 1: it reads back as an int"
    for row, text, number, integer in zip(rows, texts, written, range(7), strict=True):
        want_number = "" if number is None else repr(number)
        assert orjson.loads(row) == ["" if text is None else text, want_number, str(integer)]
    assert text_arrays([]).to_pylist() == []


def test_typed_python_texts_are_pythons_repr_of_each_float() -> None:
    rng = np.random.default_rng(12)
    doubles = np.concatenate(
        [
            10 ** rng.uniform(-30, 30, 20_000) * rng.choice([-1, 1], 20_000),
            np.round(10 ** rng.uniform(0, 20, 2_000)),
            [0.0, -0.0, 1.0, 12.0, 1e-4, 1e15, 1e16, 2.0**53, 0.1, 1 / 3],
        ]
    )
    assert python_texts(pa.array(doubles), typed=True).to_pylist() == [repr(float(d)) for d in doubles]
    assert python_texts(pa.array([3, -4]), typed=True).to_pylist() == ["3", "-4"]


def test_the_newest_row_of_each_key() -> None:
    rows = pa.table({"k": ["b", "a", "b", "a", "c"], "t": [2, 1, 2, 3, 0], "id": [5, 9, 6, 1, 0]})
    assert newest_rows(rows, "k", ("t", "id")).to_pylist() == [
        {"k": "a", "t": 3, "id": 1},
        {"k": "b", "t": 2, "id": 6},
        {"k": "c", "t": 0, "id": 0},
    ]
