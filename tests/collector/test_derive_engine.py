"""collector/derive: the columnar engine on real captures and on the traps of its accumulation.

test_derive.py checks every SLI formula on hand-built snapshots; here the expected values are
worked out by hand from the captures in tests/fixtures/rig (a real tritonserver's /metrics and
statistics API), and the accumulation rules that only show column-wise are pinned: counters
below zero, duplicated series, unreadable index labels, shapes that change between scrapes,
sources that come and go.  Values are compared exactly where the arithmetic is exact.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from tests.collector.test_derive import CONFIGS, KW0, KW1, M1, STATS0, _stats, core, get, snap
from tritonwatch.collector.derive import DERIVED_FROM, Deriver
from tritonwatch.collector.shape import Shape, parse_columns
from tritonwatch.collector.triton import parse_model_config, stats_families
from tritonwatch.schemas.samples import MetricFamily, Sample, Snapshot, make_labels

RIG = Path(__file__).resolve().parents[1] / "fixtures" / "rig"
BATCHER = {"model": "batcher", "version": "1"}
LLM = {"model": "fake_llm", "version": "1"}
RIG_CONFIGS = {
    info.name: info
    for info in (
        parse_model_config(json.loads((RIG / name).read_text()))
        for name in ("config-batcher-http.json", "config-fake_llm-http.json")
    )
}


def columns(families: list[MetricFamily]) -> tuple[Shape, np.ndarray]:
    values = np.array([s.value for f in families for s in f.samples], dtype=np.float64)
    return Shape(families), values


def rows(out: list[Sample]) -> list[tuple[str, object, str]]:
    return [(s.name, s.labels, repr(s.value)) for s in out]


# --- real captures --------------------------------------------------------------------------


def test_rig_scrapes_give_the_hand_computed_slis():
    d = Deriver("t")
    shape, v1 = parse_columns((RIG / "metrics-load-1.prom").read_bytes())
    assert d.derive_columns(shape, v1, 100.0, RIG_CONFIGS) is not None
    shape, v2 = parse_columns((RIG / "metrics-load-2.prom").read_bytes(), shape)
    out = d.derive_columns(shape, v2, 110.0, RIG_CONFIGS)
    # Numbers read off the two captures (nv_inference_*{model="batcher"}).
    success, execs = 5525 - 2097, 1356 - 518
    assert get(out, "sli:request_rate", **BATCHER) == success / 10
    assert get(out, "sli:inference_rate", **BATCHER) == success / 10
    assert get(out, "sli:execution_rate", **BATCHER) == execs / 10
    assert get(out, "sli:avg_batch_size", **BATCHER) == pytest.approx(success / execs)
    assert get(out, "sli:batch_fill_rate", **BATCHER) == pytest.approx(success / execs / 16)
    assert get(out, "sli:queue_time_seconds", **BATCHER) == pytest.approx(
        (28801000 - 10769155) * 1e-6 / success
    )
    assert get(out, "sli:request_time_seconds", **BATCHER) == pytest.approx(
        (60788017 - 22742889) * 1e-6 / success
    )
    assert get(out, "sli:request_rate", **LLM) == (128 - 49) / 10
    # Every failure reason is listed at 0 in the capture: rate 0, success ratio 1.
    assert get(out, "sli:failure_rate", **BATCHER, reason="REJECTED") == 0.0
    assert get(out, "sli:success_ratio", **BATCHER) == 1.0


def test_snapshot_adapter_gives_what_the_engine_gives_on_every_rig_capture():
    engine, adapter = Deriver("t"), Deriver("t")
    shape: Shape | None = None
    ts = 0.0
    compared = 0
    for path in sorted(RIG.glob("*.prom")) * 2:
        shape, values = parse_columns(path.read_bytes(), shape)
        ts += 5.0
        want = engine.derive_columns(shape, values, ts, RIG_CONFIGS)
        got = adapter.derive(shape.snapshot("t", ts, values), RIG_CONFIGS)
        assert rows(got) == rows(want)
        compared += len(want)
    assert compared > 0
    assert adapter.tracked_series() == engine.tracked_series() > 0


def _stats_capture(scale: float) -> Snapshot:
    families = stats_families(json.loads((RIG / "stats-http.json").read_text()))
    scaled = tuple(
        f._replace(samples=tuple(s._replace(value=s.value * scale) for s in f.samples))
        for f in families
    )
    return Snapshot("t", 0.0, scaled)


def test_statistics_api_capture_gives_the_hand_computed_slis():
    d = Deriver("t")
    d.derive(_stats_capture(1.0)._replace(ts=100.0), RIG_CONFIGS)
    # Every counter doubled 20 s later: the deltas are the capture's own numbers.
    out = d.derive(_stats_capture(2.0)._replace(ts=120.0), RIG_CONFIGS)
    assert get(out, "sli:request_rate", **BATCHER) == 5533 / 20
    assert get(out, "sli:execution_rate", **BATCHER) == 1358 / 20
    assert get(out, "sli:queue_time_seconds", **BATCHER) == pytest.approx(
        28842153786e-9 / 5533
    )
    # batch_stats: 1 execution of 1, 1331 of 4, 26 of 8; max_batch_size 16, preferred 4 and 8.
    executions = 1 + 1331 + 26
    items = 1 * 1 + 4 * 1331 + 8 * 26
    assert get(out, "sli:stats_batch_fill_rate", **BATCHER) == pytest.approx(
        items / executions / 16
    )
    assert get(out, "sli:preferred_batch_hit_ratio", **BATCHER) == pytest.approx(
        (1331 + 26) / executions
    )
    busy_ns = 5397907 + 7267306745 + 141877343
    assert get(out, "sli:gpu_busy_seconds_rate", **BATCHER) == pytest.approx(busy_ns * 1e-9 / 20)


def test_statistics_api_between_scrapes_leaves_the_metrics_baselines_alone():
    d = Deriver("t")
    shape, v1 = parse_columns((RIG / "metrics-load-1.prom").read_bytes())
    d.derive_columns(shape, v1, 100.0, RIG_CONFIGS)
    d.derive(_stats_capture(1.0)._replace(ts=103.0), RIG_CONFIGS)
    d.derive(_stats_capture(2.0)._replace(ts=106.0), RIG_CONFIGS)
    shape, v2 = parse_columns((RIG / "metrics-load-2.prom").read_bytes(), shape)
    out = d.derive_columns(shape, v2, 110.0, RIG_CONFIGS)
    # /metrics showed the model's counters: the stats API never stands in for its request rate.
    assert get(out, "sli:request_rate", **BATCHER) == (5525 - 2097) / 10


# --- accumulation traps ---------------------------------------------------------------------

_SIGNED = (
    'nv_inference_request_success{{model="a",version="1"}} {v}\n'
    'nv_inference_request_failure{{model="a",version="1",reason="BACKEND"}} {v}\n'
    'nv_inference_count{{model="a",version="1"}} {v}\n'
    'nv_inference_exec_count{{model="a",version="1"}} {v}\n'
    'nv_inference_pending_request_count{{model="a",version="1"}} {g}\n'
    'nv_energy_consumption{{gpu_uuid="G0"}} {v}\n'
)


def test_counters_below_zero_are_skipped_and_gauges_below_zero_kept():
    d = Deriver("t")
    shape: Shape | None = None
    series = [100, 140, -20, -60, 30, 70, 10, -5, 0, 20]
    rates: list[float | None] = []
    pending = []
    for k, v in enumerate(series):
        shape, values = parse_columns(_SIGNED.format(v=v, g=-v), shape)
        out = d.derive_columns(shape, values, 1000.0 + 10 * k, {})
        assert not [s for s in out if s.name.endswith(("_rate", "_joules")) and s.value < 0]
        rates.append(get(out, "sli:request_rate", model="a", version="1"))
        pending.append(get(out, "sli:pending_requests", model="a", version="1"))
    # A negative counter is neither a delta nor a baseline, and like NaN it ends the series'
    # baseline: 30 after -60 starts afresh; 10 after 70 is a reset (10 over 10 s).
    assert rates == [None, 4.0, None, None, None, 4.0, 1.0, None, None, 2.0]
    assert pending == [-v for v in series]


def _dup(first: float, second: float, other: float, execs: float) -> list[MetricFamily]:
    labels = make_labels({"model": "resnet", "version": "1"})
    return [
        MetricFamily("nv_inference_count", "counter", "", (
            Sample("nv_inference_count", labels, first),
            Sample("nv_inference_count", labels, second),
        )),
        # The other spelling of the same counter shares its state key.
        MetricFamily("nv_inference_count_total", "counter", "", (
            Sample("nv_inference_count_total", labels, other),
        )),
        MetricFamily("nv_inference_exec_count", "counter", "", (
            Sample("nv_inference_exec_count", labels, execs),
        )),
    ]


def test_a_duplicated_series_counts_once_the_first_usable_copy_wins():
    d = Deriver("t")
    shape, _ = columns(_dup(0, 0, 0, 0))
    got = []
    for ts, vals in [
        (0.0, (10.0, 20.0, 30.0, 1.0)),
        (10.0, (11.0, 25.0, 33.0, 2.0)),  # 11 - 10
        (20.0, (math.nan, 27.0, 40.0, 3.0)),  # the second copy: 27 - 11
        (30.0, (math.nan, math.nan, 41.0, 4.0)),  # the other spelling: 41 - 27
        (40.0, (15.0, math.inf, 45.0, 5.0)),  # 15 < 41: a reset
        (40.0, (16.0, 1.0, 46.0, 6.0)),  # not newer: nothing, baseline kept
        (50.0, (17.0, 1.0, 47.0, 7.0)),  # 17 - 15
    ]:
        out = d.derive_columns(shape, columns(_dup(*vals))[1], ts, CONFIGS)
        got.append(get(out, "sli:inference_rate", **M1))
    assert got == [None, 0.1, 1.6, 1.4, 1.5, None, 0.2]


def test_unreadable_batch_size_and_index_labels_are_skipped():
    def stats(ts: float, n: float) -> Snapshot:
        return snap(ts, [
            Sample("triton_stats_batch_executions", make_labels({**M1, "batch_size": "x"}), n),
            Sample("triton_stats_batch_executions", make_labels({**M1, "batch_size": "4"}), 2 * n),
            # "04" reads as 4: the same batch size, summed.
            Sample("triton_stats_batch_executions", make_labels({**M1, "batch_size": "04"}),
                   3 * n),
            Sample("triton_stats_response_success_count", make_labels({**M1, "index": "1"}), n),
            Sample("triton_stats_response_success_ns", make_labels(M1), n),  # no index
            Sample("triton_stats_success_count", make_labels(M1), n),
        ])

    d = Deriver("t")
    d.derive(stats(0.0, 1.0), CONFIGS)
    out = d.derive(stats(10.0, 5.0), CONFIGS)
    # batch size 4: Δ8 + Δ12 executions, 80 items; resnet's max_batch_size is 8.
    assert get(out, "sli:stats_batch_fill_rate", **M1) == 0.5
    assert get(out, "sli:preferred_batch_hit_ratio", **M1) == 1.0
    assert get(out, "sli:request_rate", **M1) == 0.4
    assert get(out, "sli:server_itl_seconds", **M1) == 0.0  # 4 later responses, no ns indexed
    assert get(out, "sli:server_ttft_seconds", **M1) is None


def test_a_series_back_from_nan_has_no_baseline():
    d = Deriver("t")
    shape, v = columns(list(snap(0.0, core(**KW0)).families))
    d.derive_columns(shape, v, 0.0, CONFIGS)
    d.derive_columns(shape, np.full_like(v, math.nan), 10.0, CONFIGS)
    assert get(d.derive_columns(shape, v * 2, 20.0, CONFIGS), "sli:request_rate", **M1) is None
    out = d.derive_columns(shape, v * 3, 30.0, CONFIGS)
    assert get(out, "sli:request_rate", **M1) == KW0["success"] / 10


def test_a_new_shape_carries_the_baselines_over_by_series():
    d = Deriver("t")
    m2 = {"model": "bert", "version": "3"}
    first = list(snap(0.0, core(**KW0)).families)
    d.derive_columns(*columns(first), 0.0, CONFIGS)
    # The next payload lists the families in another order and adds a model.
    later = list(reversed(snap(0.0, core(**KW1) + core(success=9, count=9, execs=9,
                                                          labels=m2)).families))
    out = d.derive_columns(*columns(later), 10.0, CONFIGS)
    assert get(out, "sli:request_rate", **M1) == (KW1["success"] - KW0["success"]) / 10
    assert get(out, "sli:request_rate", **m2) is None  # a new series: no baseline yet


def test_absent_metrics_source_is_forgotten_after_max_gap():
    d = Deriver("t", max_gap_s=30.0)
    shape, v = columns(list(snap(0.0, core(**KW0)).families))
    d.derive_columns(shape, v, 0.0, CONFIGS)
    d.derive_columns(shape, v + 1, 10.0, CONFIGS)
    stats_series = len(_stats(**STATS0)) - 1  # triton_stats_fail_ns feeds no SLI
    for ts in (20.0, 35.0):
        d.derive(snap(ts, _stats(**STATS0)), CONFIGS)
    assert d.tracked_series() > stats_series  # 25 s without /metrics: kept
    d.derive(snap(50.0, _stats(**STATS0)), CONFIGS)
    assert d.tracked_series() == stats_series  # 40 s: the /metrics baselines are gone
    assert get(d.derive_columns(shape, v + 2, 55.0, CONFIGS), "sli:request_rate", **M1) is None
    out = d.derive_columns(shape, v + 3, 60.0, CONFIGS)
    assert get(out, "sli:request_rate", **M1) == 1 / 5


def test_an_empty_payload_expires_both_sources():
    d = Deriver("t", max_gap_s=10.0)
    shape, v = columns(list(snap(0.0, core(**KW0)).families))
    d.derive_columns(shape, v, 0.0, CONFIGS)
    d.derive(snap(1.0, _stats(**STATS0)), CONFIGS)
    tracked = d.tracked_series()
    d.derive_columns(Shape([]), np.empty(0), 5.0, CONFIGS)
    assert d.tracked_series() == tracked > 0
    d.derive_columns(Shape([]), np.empty(0), 20.0, CONFIGS)
    assert d.tracked_series() == 0


def test_families_the_deriver_does_not_read_are_skipped_whole():
    # A family outside DERIVED_FROM still makes its source present (and so replaces its
    # state), but its samples are never read.
    assert "nv_cpu_utilization" not in DERIVED_FROM
    d = Deriver("t")
    extra = MetricFamily("nv_cpu_utilization", "gauge", "", (Sample("nv_cpu_utilization", (),
                                                                      0.5),))
    d.derive(Snapshot("t", 0.0, (*snap(0.0, core(**KW0)).families, extra)), CONFIGS)
    out = d.derive(Snapshot("t", 10.0, (*snap(0.0, core(**KW1)).families, extra)), CONFIGS)
    assert get(out, "sli:request_rate", **M1) == 4.0
    assert all(s.name.startswith("sli:") for s in out)


def test_a_plan_rebuilds_its_state_keys_from_its_shape():
    # Plans no longer keep their state keys; the ones rebuilt from the shape must be what the
    # plan numbered its counter states by: (role key, labels) in order of first appearance.
    from tritonwatch.collector.derive.accumulate import Plan
    from tritonwatch.collector.derive.catalog import METRICS, ROLES

    families = list(snap(0.0, core(**KW0) + core(**KW0, labels={"model": "b", "version": "2"})
                         ).families)
    # A series listed twice shares its state with the first copy.
    families.append(families[0])
    shape, _ = columns(families)
    plan = Plan(shape, METRICS)
    expected: dict[object, int] = {}
    for i in plan.m_idx[plan.c_pos].tolist():
        expected.setdefault((ROLES[shape.names[i]].key, shape.labels[i]), len(expected))
    assert plan.n_states == len(expected) > 0 and plan.has_dups
    assert plan.state_keys() == list(expected)
    assert plan.c_u.tolist() == [expected[(ROLES[shape.names[i]].key, shape.labels[i])]
                                 for i in plan.m_idx[plan.c_pos].tolist()]


def test_every_gauge_key_of_a_plan_has_an_entry_numbered_in_order():
    # accumulate() takes the gauge keys of a scrape whose every value is usable as
    # range(len(gauge_keys)) instead of np.unique of the plan's slots: each key's number
    # must appear among the slots, numbered as the keys first appear.
    from tests.payloads import Template
    from tritonwatch.collector.derive.accumulate import Plan
    from tritonwatch.collector.derive.catalog import METRICS

    shapes = [columns(list(snap(0.0, core(**KW0) + core(**KW0, labels={
        "model": "b", "version": "2"})).families))[0],
        parse_columns(Template(seed=1, models=3, gpus=2).render(0))[0]]
    for shape in shapes:
        plan = Plan(shape, METRICS)
        slots = plan.g_slot.tolist()
        assert plan.gauge_keys  # not vacuous
        assert sorted(set(slots)) == list(range(len(plan.gauge_keys)))
        assert [s for i, s in enumerate(slots) if s not in slots[:i]] == sorted(set(slots))


def test_model_and_gpu_labels_of_derived_samples_are_shared_between_scrapes():
    d = Deriver("t")
    fams = list(snap(0.0, core(**KW0)).families)
    d.derive_columns(*columns(fams), 0.0, CONFIGS)
    one = d.derive_columns(*columns(list(snap(0.0, core(**KW1)).families)), 10.0, CONFIGS)
    two = d.derive_columns(*columns(list(snap(0.0, core(**KW1)).families)), 20.0, CONFIGS)
    firsts = [s.labels for s in one if len(s.labels) == 2]  # the model's own labels
    seconds = [s.labels for s in two if len(s.labels) == 2]
    assert firsts and seconds and firsts[0] == seconds[0]
    assert all(labels is firsts[0] for labels in firsts + seconds)  # one tuple, every scrape


def test_equal_plans_share_read_only_arrays_and_keys_and_derive_alike():
    # Two targets with the same structure: one copy of the plan's arrays and keys between
    # them, never written to, and each target's own baselines still apart.
    from tritonwatch.collector.derive.accumulate import Plan
    from tritonwatch.collector.derive.catalog import METRICS

    fams = list(snap(0.0, core(**KW0)).families)
    a, b = Plan(columns(fams)[0], METRICS), Plan(columns(fams)[0], METRICS)
    for name in ("m_idx", "m_acc", "c_pos", "c_u", "c_slot", "c_scale", "c_acc", "m_gauge"):
        arr = getattr(a, name)
        assert arr is getattr(b, name) and not arr.flags.writeable, name
    assert a.slot_keys is b.slot_keys and a.seen_static is b.seen_static
    d1, d2 = Deriver("t1"), Deriver("t2")
    d1.derive_columns(*columns(fams), 0.0, CONFIGS)
    d2.derive_columns(*columns(list(snap(0.0, core(**KW1)).families)), 0.0, CONFIGS)
    later = list(snap(0.0, core(**KW1)).families)
    out1 = d1.derive_columns(*columns(later), 10.0, CONFIGS)
    out2 = d2.derive_columns(*columns(later), 10.0, CONFIGS)
    assert get(out1, "sli:request_rate", **M1) == (KW1["success"] - KW0["success"]) / 10
    assert get(out2, "sli:request_rate", **M1) == 0.0
