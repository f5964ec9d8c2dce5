"""``TargetState.stored_series``: the lists a scrape hands to the store, shared between scrapes
while the series do not change (the buffer keeps one copy per target, not one per scrape)."""

from __future__ import annotations

from tritonwatch.collector.shape import parse_columns
from tritonwatch.collector.target_state import TargetState
from tritonwatch.schemas.config import TargetConfig
from tritonwatch.schemas.samples import make_labels

PAYLOAD = """# HELP nv_inference_count Number of inferences
# TYPE nv_inference_count counter
nv_inference_count{model="a",version="1"} 10
nv_inference_count{model="b",version="1"} 20
"""


def state(**labels: str) -> TargetState:
    return TargetState(TargetConfig(name="t", metrics_url="http://x/metrics", labels=labels))


def test_unchanged_series_reuse_the_same_lists() -> None:
    s = state()
    shape, _ = parse_columns(PAYLOAD)
    up = [make_labels({})]
    names, labels = s.stored_series(shape, ["up"], up)
    assert names == [*shape.names, "up"]
    assert labels == shape.labels + up
    again = s.stored_series(shape, ["up"], [make_labels({})])  # equal, not the same objects
    assert again[0] is names and again[1] is labels


def test_changed_derived_series_or_shape_make_new_lists() -> None:
    s = state()
    shape, _ = parse_columns(PAYLOAD)
    names, _labels = s.stored_series(shape, ["up"], [make_labels({})])
    more = s.stored_series(shape, ["up", "sli:x"], [make_labels({}), make_labels({"m": "a"})])
    assert more[0] == [*shape.names, "up", "sli:x"] and more[0] is not names
    relabeled = s.stored_series(shape, ["up", "sli:x"], [make_labels({}),
                                                          make_labels({"m": "b"})])
    assert relabeled[1][-1] == make_labels({"m": "b"}) and relabeled[1] is not more[1]
    other, _ = parse_columns(PAYLOAD.replace('model="b"', 'model="c"'))
    changed = s.stored_series(other, ["up", "sli:x"], [make_labels({}), make_labels({"m": "b"})])
    assert changed[1][1] == make_labels({"model": "c", "version": "1"})
    assert names == [*shape.names, "up"]  # lists handed out before are never mutated


def test_target_labels_are_added_to_the_shape_series() -> None:
    s = state(cluster="eu")
    shape, _ = parse_columns(PAYLOAD)
    _, labels = s.stored_series(shape, ["up"], [make_labels({"cluster": "eu"})])
    assert labels[0] == make_labels({"cluster": "eu", "model": "a", "version": "1"})
    assert labels[-1] == make_labels({"cluster": "eu"})
