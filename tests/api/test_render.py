"""Sample values written as Prometheus writes them (Go's strconv, Prometheus's cut-offs)."""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pytest

from tritonwatch.api.render import format_ts, format_value, matrix_json

# (value, what Prometheus's jsonutil.MarshalFloat writes: strconv.AppendFloat(v, 'f' or 'e',
# -1, 64), 'e' below 1e-6 and from 1e21)
GO = [
    (0.0, "0"), (-0.0, "-0"), (1.0, "1"), (-2.5, "-2.5"), (0.1, "0.1"),
    (0.1 + 0.2, "0.30000000000000004"), (1 / 3, "0.3333333333333333"),
    (1e-6, "0.000001"), (9.99e-7, "9.99e-07"), (5e-05, "0.00005"), (1.5e-07, "1.5e-07"),
    (1e15, "1000000000000000"), (1e16, "10000000000000000"),
    (1.2345678901234567e20, "123456789012345670000"), (1e21, "1e+21"),
    (1.5e300, "1.5e+300"), (5e-324, "5e-324"), (1.7976931348623157e308, "1.7976931348623157e+308"),
    (math.inf, "+Inf"), (-math.inf, "-Inf"), (math.nan, "NaN"),
]


@pytest.mark.parametrize(("value", "text"), GO, ids=[t for _, t in GO])
def test_values_are_written_as_prometheus_writes_them(value: float, text: str) -> None:
    assert format_value(value) == text


@pytest.mark.parametrize("value", [v for v, _ in GO if not math.isnan(v)])
def test_every_value_reads_back_exactly(value: float) -> None:
    back = float(format_value(value))
    assert back == value and math.copysign(1, back) == math.copysign(1, value)


def test_nan_reads_back_as_nan() -> None:
    assert math.isnan(float(format_value(math.nan)))


def test_timestamps_are_plain_numbers() -> None:
    assert [format_ts(t) for t in (1700000000.0, 1700000000.5, 1700000000.123, -1.5)] == [
        "1700000000", "1700000000.5", "1700000000.123", "-1.5"]


def test_matrix_json_is_prometheus_matrix_with_string_values() -> None:
    series: list[tuple[dict[str, str], Any, Any]] = [
              ({"__name__": "v", "k": 'a"b'}, np.array([1.0, 2.5]),
               np.array([math.inf, 0.5])),
              ({"target": "t"}, [3.0], [math.nan]),
              ({"empty": "1"}, [], [])]
    assert json.loads(matrix_json(series, ["w"])) == {
        "status": "success", "warnings": ["w"],
        "data": {"resultType": "matrix", "result": [
            {"metric": {"__name__": "v", "k": 'a"b'}, "values": [[1, "+Inf"], [2.5, "0.5"]]},
            {"metric": {"target": "t"}, "values": [[3, "NaN"]]}]}}
    assert json.loads(matrix_json([])) == {
        "status": "success", "data": {"resultType": "matrix", "result": []}}
