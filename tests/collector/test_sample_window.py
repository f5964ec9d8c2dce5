"""``SampleWindow``: the derived samples a scrape keeps until the next one, as a window over the
lists and the array handed to the store, read exactly as the samples they replace; and what the
collector keeps of a scrape with and without target labels."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tritonwatch.collector.target_state import TargetState
from tritonwatch.schemas.config import TargetConfig
from tritonwatch.schemas.latest import LatestValues, SampleWindow
from tritonwatch.schemas.samples import Sample, make_labels

NAMES = ["raw_a", "raw_b", "sli:x", "sli:y", "up"]
LABELS = [make_labels({"i": str(i)}) for i in range(len(NAMES))]
VALUES = np.array([1.0, 2.0, -0.0, math.inf, 1.0])


def test_a_window_reads_as_the_samples_of_its_range() -> None:
    w = SampleWindow(NAMES, LABELS, VALUES, 2, 4)
    expected = [Sample("sli:x", LABELS[2], -0.0), Sample("sli:y", LABELS[3], math.inf)]
    assert len(w) == 2 and list(w) == expected and w == expected
    assert w[0] == expected[0] and w[-1] == expected[1] and w[:1] == expected[:1]
    assert math.copysign(1.0, w[0].value) == -1.0  # -0.0 kept bit for bit
    assert all(type(s.value) is float for s in w)
    with pytest.raises(IndexError):
        w[2]
    assert list(SampleWindow(NAMES, LABELS, VALUES, 5, 5)) == []
    with pytest.raises(ValueError, match="outside"):
        SampleWindow(NAMES[:3], LABELS, VALUES, 2, 4)


def test_latest_values_filter_a_window_by_name_when_read() -> None:
    latest = LatestValues()
    latest.put_window("t", "metrics", 10.0, SampleWindow(NAMES, LABELS, VALUES, 2, 5))
    latest.put("t", "api", 11.0, [Sample("sli:z", (), 3.0), Sample("raw", (), 4.0)])
    got = [(v.target, v.name, v.value, v.ts) for v in latest.values()]
    # "up" is stored but not exported; the list source was filtered when put.
    assert got == [("t", "sli:z", 3.0, 11.0), ("t", "sli:x", -0.0, 10.0),
                   ("t", "sli:y", math.inf, 10.0)]
    latest.drop("t", "metrics")
    assert [v.name for v in latest.values()] == ["sli:z"]


def test_derived_series_lists_are_kept_once_while_equal() -> None:
    s = TargetState(TargetConfig(name="t", metrics_url="http://x/metrics", labels={"c": "eu"}))
    names, labels = s.derived_series(["sli:x"], [make_labels({"m": "a"})])
    again = s.derived_series(["sli:x"], [make_labels({"m": "a"})])
    assert again[0] is names and again[1] is labels
    other = s.derived_series(["sli:x"], [make_labels({"m": "b"})])
    assert other[1] == [make_labels({"m": "b"})] and other[1] is not labels
    assert s.latest == []  # never scraped
