"""Query parameters: times, steps, resolution and page tokens, each refusal naming its input."""

from __future__ import annotations

import pytest

from tritonwatch.api.errors import ApiError
from tritonwatch.api.params import (
    MAX_POINTS_PER_SERIES,
    check_resolution,
    decode_token,
    encode_token,
    parse_step,
    parse_time,
)


def test_times_are_seconds_or_rfc3339() -> None:
    assert parse_time("start", "1700000000.5") == 1700000000.5
    assert parse_time("start", "2023-11-14T22:13:20Z") == 1700000000.0
    assert parse_time("end", "2023-11-14T23:13:20.250+01:00") == 1700000000.25


@pytest.mark.parametrize("text", ["-1e300", "1e300", "nan", "inf", "-inf", "yesterday",
                                  "2023-11-14T22:13:20", "1e20"])
def test_bad_times_are_400_naming_the_parameter(text: str) -> None:
    with pytest.raises(ApiError) as err:
        parse_time("start", text)
    assert err.value.status == 400 and err.value.message.startswith('invalid parameter "start"')


def test_steps_are_seconds_or_durations() -> None:
    assert [parse_step("step", s) for s in ("15", "0.5", "1m30s", "1h", "500ms")] == [
        15.0, 0.5, 90.0, 3600.0, 0.5]


@pytest.mark.parametrize(("text", "why"), [
    ("0", "zero or negative"), ("-1", "zero or negative"), ("1e299", "between"),
    ("0.0001", "between"), ("nan", "finite"), ("inf", "finite"), ("fast", "cannot parse"),
])
def test_bad_steps_are_400(text: str, why: str) -> None:
    with pytest.raises(ApiError) as err:
        parse_step("step", text)
    assert err.value.status == 400 and 'invalid parameter "step"' in err.value.message
    assert why in err.value.message


def test_resolution_is_capped_as_in_prometheus() -> None:
    check_resolution(0, MAX_POINTS_PER_SERIES, 1)
    check_resolution(5, 5, 1)
    with pytest.raises(ApiError, match="exceeded maximum resolution of 11,000 points"):
        check_resolution(0, MAX_POINTS_PER_SERIES + 1, 1)
    with pytest.raises(ApiError, match="end timestamp must not be before start time"):
        check_resolution(10, 9, 1)


def test_page_tokens_round_trip_and_refuse_garbage() -> None:
    parts: list[object] = ["t", "name", {"k": "välue/\"x\""}]
    assert decode_token("after", encode_token(parts)) == parts
    for bad in ("!!!", "bm90IGpzb24", encode_token([])[:0] + "eyJhIjoxfQ", "x" * 9000):
        with pytest.raises(ApiError) as err:
            decode_token("after", bad)
        assert 'invalid parameter "after"' in err.value.message
