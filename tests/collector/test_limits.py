"""collector.limits on inline payloads: counts before the parse, checks after it."""

from __future__ import annotations

import pytest

from tritonwatch.collector.limits import (
    LimitExceeded,
    check_sample_count,
    check_shape,
    count_sample_lines,
)
from tritonwatch.collector.shape import parse_columns
from tritonwatch.schemas.config import ScrapeLimits

NONE = ScrapeLimits(0, 0, 0, 0, 0)


def limits(**kw: int) -> ScrapeLimits:
    return NONE._replace(**kw)


@pytest.mark.parametrize(
    "text",
    [
        "a 1\nb 2\n",
        "# HELP a x\n# TYPE a counter\na 1\n\n   \nb 2",
        "  # indented comment\na 1\n#x\nb{l=\"#\"} 2\n",
        "",
    ],
)
def test_the_line_count_is_the_parsers_sample_count(text):
    shape, values = parse_columns(text)
    assert count_sample_lines(text) == len(values) == len(shape)


def test_a_body_over_sample_limit_is_refused_before_the_parse():
    text = "".join(f'm{{i="{i}"}} {i}\n' for i in range(11))
    with pytest.raises(LimitExceeded) as err:
        check_sample_count("t", text, limits(sample_limit=10))
    assert err.value.reason == "sample limit exceeded (11 > 10)" and err.value.samples == 11
    assert err.value.target == "t"
    check_sample_count("t", text, limits(sample_limit=11))  # at the limit: fine
    check_sample_count("t", text, NONE)  # 0: no limit
    # Comment lines do not count, even when their number pushes the line count over.
    check_sample_count("t", "# c\n" * 50 + "a 1\n", limits(sample_limit=1))


def test_shape_checks_name_the_first_offender_in_prometheus_words():
    shape, _ = parse_columns('a{x="1"} 1\nb{x="1",y="2",z="3"} 1\nc{long_name="v"} 1\n'
                             'd{x="\x1bvalue-that-is-long"} 1\n')
    assert check_shape(shape, NONE) is None
    assert check_shape(shape, limits(sample_limit=3)) == "sample limit exceeded (4 > 3)"
    assert check_shape(shape, limits(label_limit=2)) == (
        "label_limit exceeded (metric: b, number of labels: 3, limit: 2)"
    )
    assert check_shape(shape, limits(label_name_length_limit=8)) == (
        "label_name_length_limit exceeded (metric: c, label name: long_name, length: 9, "
        "limit: 8)"
    )
    # The quoted value is escaped: the reason goes to logs and to the API.
    assert check_shape(shape, limits(label_value_length_limit=10)) == (
        'label_value_length_limit exceeded (metric: d, label name: x, value: '
        '"\\x1bvalue-that-is-long", length: 19, limit: 10)'
    )
