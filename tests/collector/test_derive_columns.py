"""Differential tests: ``Deriver.derive_columns`` returns exactly what ``derive(snapshot)`` does.

Two derivers are fed the same scrapes, one through ``derive(shape.snapshot(...))``, the other
through ``derive_columns(shape, values, ...)``.  At every step their outputs must be equal
(names, labels, order, and values compared by ``repr``: bit for bit, ``-0.0`` apart from
``0.0``), and so must their state (per-source counter baselines, source timestamps, model
bookkeeping), which is what makes every later call agree whichever path it takes: stats-API
snapshots through ``derive``, path switches, shape changes.

Inputs: every payload fixture, generated Triton payloads (steady and reshuffled), every
scenario of test_derive.py replayed through both paths, counter resets, NaN/Inf, series that
come and go, gaps, repeated and older timestamps, duplicated series, and hypothesis-generated
sequences over a small universe of series that exercises every role.
"""

from __future__ import annotations

import inspect
import math
import random
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench.common import Template
from bench.payloads import triton_payload
from tests.collector import test_derive
from tests.collector.test_derive import CONFIGS, KW0, KW1, STATS0, STATS1, _stats, core
from tests.collector.test_parse import ALL_PROM, read
from tritonwatch.collector.derive import DERIVED_FROM, Deriver
from tritonwatch.collector.parse import parse
from tritonwatch.collector.shape import Shape, parse_columns
from tritonwatch.schemas.samples import MetricFamily, Sample, Snapshot, make_labels
from tritonwatch.schemas.triton import ModelConfigInfo

Values = npt.NDArray[np.float64]
Row = tuple[str, object, str]

BENCH_CONFIGS = {
    f"model_{i}": ModelConfigInfo(
        name=f"model_{i}",
        max_batch_size=8 * (i % 3),
        preferred_batch_sizes=(4, 8),
        platform="ensemble" if i == 5 else "",
    )
    for i in range(60)
}


def rows(out: Sequence[Sample]) -> list[Row]:
    return [(s.name, s.labels, repr(s.value)) for s in out]


def state_of(d: Deriver) -> tuple[object, ...]:
    """Everything in a deriver that a later call reads, as derive(snapshot) would hold it."""
    states = [dict(src) for src in d._state]
    cols = d._cols
    if cols is not None:
        held = cols.states()
        for src in (0, 1):
            if cols.plan.present[src]:
                assert not d._state[src], "a source held in columns must not keep a stale dict"
                states[src] = held[src]
    return (
        [{k: (repr(t), repr(v)) for k, (t, v) in src.items()} for src in states],
        list(d._last_ts),
        set(d._kv_bad),
        set(d._core_from_metrics),
        set(d._cache_from_metrics),
        d.tracked_series(),
    )


def shape_of(families: Sequence[MetricFamily]) -> tuple[Shape, Values]:
    values = np.array([s.value for f in families for s in f.samples], dtype=np.float64)
    return Shape(list(families)), values


class Pair:
    """A reference deriver (``derive``) and a column deriver, checked after every call."""

    def __init__(
        self, *, max_gap_s: float = 300.0, configs: Mapping[str, ModelConfigInfo] = CONFIGS
    ) -> None:
        self.ref = Deriver("t", max_gap_s=max_gap_s)
        self.col = Deriver("t", max_gap_s=max_gap_s)
        self.configs = configs
        self.outputs = 0  # samples compared, so a test can tell it compared something

    def scrape(self, shape: Shape, values: Values, ts: float) -> list[Sample]:
        """One /metrics scrape: derive(snapshot) against derive_columns."""
        snap = shape.snapshot("t", ts, values, keep=DERIVED_FROM)
        expected = self.ref.derive(snap, self.configs)
        got = self.col.derive_columns(shape, values, ts, self.configs)
        return self._check(expected, got)

    def both_derive(self, snap: Snapshot) -> list[Sample]:
        """A snapshot both take through derive() (the stats API job, or a path switch)."""
        return self._check(self.ref.derive(snap, self.configs), self.col.derive(snap, self.configs))

    def _check(self, expected: list[Sample], got: list[Sample]) -> list[Sample]:
        assert rows(got) == rows(expected)
        assert state_of(self.col) == state_of(self.ref)
        self.outputs += len(expected)
        return expected


def stats_snapshot(ts: float, scale: float = 1.0, **labels: str) -> Snapshot:
    """A statistics-API snapshot (triton_stats_* families only), counters times ``scale``."""
    kw = {**STATS0, "success": STATS0["success"] * scale, "inference": 400 * scale}
    if labels:
        kw["labels"] = labels
    samples = _stats(**kw)
    return test_derive.snap(ts, samples, target="t")


def evolve(values: Values, rng: random.Random, *, resets: float = 0.0, bad: float = 0.0) -> Values:
    """Counters (and gauges) moved on; a share of series reset, another made non-finite."""
    out = values.copy()
    for i in range(len(out)):
        r = rng.random()
        if r < bad:
            out[i] = rng.choice([math.nan, math.inf, -math.inf])
        elif r < bad + resets:
            out[i] = float(rng.randrange(0, 5))
        elif math.isfinite(out[i]):
            out[i] += rng.choice([0.0, 1.0, 3.0, 0.5, 1234.0])
        else:
            out[i] = float(rng.randrange(0, 100))
    return out


def run_sequence(pair: Pair, shape: Shape, values: Values, seed: int) -> None:
    """A scrape sequence over one shape that walks every timing and value rule."""
    rng = random.Random(seed)
    gap = pair.ref.max_gap_s
    ts = 1000.0
    steps: list[tuple[float, dict[str, float]]] = [
        (0.0, {}),  # the first scrape: no baseline
        (10.0, {}),  # ordinary interval
        (10.0, {}),
        (0.0, {}),  # the same timestamp again: keep the newer baseline
        (-5.0, {}),  # older than the last one
        (15.0, {"resets": 0.3}),  # counter resets
        (10.0, {"bad": 0.2}),  # NaN and Inf on a fifth of the series
        (10.0, {}),  # the series back from NaN have no baseline
        (gap + 1.0, {}),  # a gap longer than max_gap: no rates
        (10.0, {"resets": 0.1, "bad": 0.05}),
        (10.0, {}),
    ]
    for dt, kw in steps:
        ts += dt
        values = evolve(values, rng, **kw) if kw or dt else values
        pair.scrape(shape, values, ts)
        if rng.random() < 0.3:
            pair.both_derive(stats_snapshot(ts + 1.0, scale=1 + rng.random()))


# --------------------------------------------------------------------------------------------
# Payload fixtures and generated Triton payloads


@pytest.mark.parametrize("path", ALL_PROM, ids=lambda p: p.name)
def test_every_fixture_derives_alike_through_a_scrape_sequence(path):
    shape, values = parse_columns(read(path))
    pair = Pair(max_gap_s=60.0)
    run_sequence(pair, shape, values, seed=len(shape))


def test_rig_captures_in_sequence_change_shape_and_stay_alike():
    rig = [p for p in ALL_PROM if p.parent.name == "rig"]
    assert rig
    pair = Pair()
    shape: Shape | None = None
    ts = 0.0
    for path in rig * 2:
        shape, values = parse_columns(read(path), shape)
        ts += 5.0
        pair.scrape(shape, values, ts)
    assert pair.outputs > 0


@pytest.mark.parametrize("seed", [0, 1])
def test_steady_template_payloads_with_counters_advancing(seed):
    template = Template(seed, models=20, gpus=8)
    pair = Pair(max_gap_s=5.0, configs=BENCH_CONFIGS)
    shape: Shape | None = None
    shapes = set()
    for step in range(8):
        shape, values = parse_columns(template.render(step), shape)
        shapes.add(id(shape))
        out = pair.scrape(shape, values, 1000.0 + step)
    assert len(shapes) <= 2  # the first parse, then one steady shape: arrays carried over
    assert any(s.name == "sli:request_rate" for s in out)
    assert any(s.name == "sli:energy_per_inference_joules" for s in out)


@pytest.mark.parametrize(
    "kw",
    [
        {"models": 1, "gpus": 1},
        {"models": 5, "gpus": 2, "trtllm": False},
        {"models": 20, "gpus": 8},
        {"models": 3, "gpus": 0},
    ],
    ids=str,
)
def test_generated_payloads_reshuffled_every_step(kw):
    # triton_payload reorders series inside a family per step: a new shape every scrape.
    pair = Pair(configs=BENCH_CONFIGS)
    for step in range(4):
        shape, values = parse_columns(triton_payload(**kw, step=step))
        pair.scrape(shape, values, 100.0 + 10 * step)
    assert pair.outputs > 0


def test_series_appearing_and_disappearing_between_scrapes():
    pair = Pair(configs=BENCH_CONFIGS)
    ts = 0.0
    rng = random.Random(5)
    for models, gpus in [(3, 2), (5, 2), (5, 3), (2, 1), (5, 3), (0, 0), (4, 2)]:
        text = triton_payload(models=models, gpus=gpus, step=int(ts))
        families = parse(text)
        # Drop a random tenth of the samples too: series vanish inside families.
        kept = [
            f._replace(samples=tuple(s for s in f.samples if rng.random() > 0.1))
            for f in families
        ]
        for _ in range(2):
            ts += 10.0
            shape, values = shape_of(kept)
            pair.scrape(shape, values, ts)
            pair.scrape(shape, evolve(values, rng, resets=0.05), ts + 5.0)
    assert pair.outputs > 0


def test_template_with_resets_nan_gaps_and_interleaved_stats():
    template = Template(2, models=20, gpus=8)
    shape, values = parse_columns(template.render(0))
    shape, values = parse_columns(template.render(1), shape)
    pair = Pair(max_gap_s=30.0, configs=BENCH_CONFIGS)
    run_sequence(pair, shape, values, seed=7)
    assert pair.outputs > 0


# --------------------------------------------------------------------------------------------
# Path switches and sources


def test_switching_paths_for_the_same_metrics_source():
    m2 = core(**KW1, labels={"model": "m2"})
    shape, v0 = shape_of(test_derive.snap(0.0, core(**KW0) + m2).families)
    _, v1 = shape_of(test_derive.snap(0.0, core(**KW1) + m2).families)
    pair = Pair()
    pair.scrape(shape, v0, 0.0)
    pair.both_derive(shape.snapshot("t", 10.0, v1))  # derive() on the column deriver
    pair.scrape(shape, v1 * 2, 20.0)  # back to columns: arrays reloaded from the dicts
    pair.scrape(shape, v1 * 3, 30.0)
    pair.both_derive(stats_snapshot(31.0))  # stats only: the column state stays in place
    assert pair.col._cols is not None
    out = pair.scrape(shape, v1 * 4, 40.0)
    assert any(s.name == "sli:request_rate" for s in out)


def test_absent_metrics_source_expires_while_held_in_columns():
    shape, v0 = shape_of(test_derive.snap(0.0, core(**KW0)).families)
    pair = Pair(max_gap_s=30.0)
    pair.scrape(shape, v0, 0.0)
    pair.scrape(shape, v0 + 1, 10.0)
    for ts in (20.0, 35.0, 50.0):  # stats only; the metrics baselines age out at 40+
        pair.both_derive(stats_snapshot(ts, scale=ts))
    assert pair.col.tracked_series() == pair.ref.tracked_series()
    pair.scrape(shape, v0 + 2, 55.0)
    pair.scrape(shape, v0 + 3, 60.0)


def test_shape_holding_stats_families_owns_both_sources():
    # A combined snapshot read column-wise: both sources' state lives in the arrays.
    samples = core(**KW0) + _stats(**STATS0)
    shape, v0 = shape_of(test_derive.snap(0.0, samples).families)
    _, v1 = shape_of(test_derive.snap(0.0, core(**KW1) + _stats(**STATS1)).families)
    pair = Pair()
    pair.scrape(shape, v0, 0.0)
    pair.scrape(shape, v1, 10.0)
    pair.both_derive(stats_snapshot(15.0, scale=2.0))  # releases the stats state
    pair.scrape(shape, v1 * 1.5, 20.0)
    metrics_only, m = shape_of(test_derive.snap(0.0, core(**KW1)).families)
    pair.scrape(metrics_only, m * 2, 30.0)  # a new shape without the stats families
    pair.scrape(shape, v1 * 3, 40.0)


_SIGNED = (
    'nv_inference_request_success{{model="a",version="1"}} {v}\n'
    'nv_inference_request_failure{{model="a",version="1",reason="BACKEND"}} {v}\n'
    'nv_inference_count{{model="a",version="1"}} {v}\n'
    'nv_inference_exec_count{{model="a",version="1"}} {v}\n'
    'nv_inference_pending_request_count{{model="a",version="1"}} {g}\n'
    'nv_energy_consumption{{gpu_uuid="G0"}} {v}\n'
)


def test_counters_below_zero_are_skipped_alike_and_no_rate_goes_negative():
    pair = Pair()
    shape: Shape | None = None
    ts = 1000.0
    pending = []
    for v in [100, 140, -20, -60, 30, 70, 10, -5, 0, 20]:
        shape, values = parse_columns(_SIGNED.format(v=v, g=-v), shape)
        out = pair.scrape(shape, values, ts)
        bad = [s for s in out if s.name.endswith(("_rate", "_joules")) and s.value < 0]
        assert not bad, bad
        pending += [s.value for s in out if s.name == "sli:pending_requests"]
        ts += 10.0
    assert pair.outputs > 0
    # Gauges may be below zero: they are passed on as they are.
    assert pending == [-v for v in [100, 140, -20, -60, 30, 70, 10, -5, 0, 20]]


def test_duplicated_series_count_once_even_when_the_first_is_not_finite():
    labels = {"model": "resnet", "version": "1"}

    def dup(first: float, second: float, other: float) -> list[MetricFamily]:
        return [
            MetricFamily(
                "nv_inference_count",
                "counter",
                "",
                (
                    Sample("nv_inference_count", make_labels(labels), first),
                    Sample("nv_inference_count", make_labels(labels), second),
                ),
            ),
            # The other spelling of the same counter shares its state key.
            MetricFamily(
                "nv_inference_count_total",
                "counter",
                "",
                (Sample("nv_inference_count_total", make_labels(labels), other),),
            ),
            MetricFamily(
                "nv_inference_exec_count",
                "counter",
                "",
                (Sample("nv_inference_exec_count", make_labels(labels), other),),
            ),
        ]

    shape, _ = shape_of(dup(0, 0, 0))
    pair = Pair()
    for ts, vals in [
        (0.0, (10.0, 20.0, 30.0)),
        (10.0, (11.0, 25.0, 33.0)),
        (20.0, (math.nan, 27.0, 40.0)),  # the second copy now sets the state key
        (30.0, (math.nan, math.nan, 41.0)),  # and now the other spelling
        (40.0, (15.0, math.inf, 45.0)),
        (40.0, (16.0, 1.0, 46.0)),
        (50.0, (17.0, 1.0, 47.0)),
    ]:
        pair.scrape(shape, shape_of(dup(*vals))[1], ts)
    assert pair.col._plan is not None and pair.col._plan.has_dups


def test_unreadable_batch_size_and_index_labels_are_skipped_alike():
    def stats(n: float) -> list[MetricFamily]:
        lab = {"model": "resnet", "version": "1"}
        return list(
            test_derive.snap(
                0.0,
                [
                    Sample("triton_stats_batch_executions",
                           make_labels({**lab, "batch_size": "x"}), n),
                    Sample("triton_stats_batch_executions",
                           make_labels({**lab, "batch_size": "4"}), 2 * n),
                    Sample("triton_stats_batch_executions",
                           make_labels({**lab, "batch_size": "04"}), 3 * n),
                    Sample("triton_stats_response_success_count",
                           make_labels({**lab, "index": "1"}), n),
                    Sample("triton_stats_response_success_ns", make_labels(lab), n),
                    Sample("triton_stats_success_count", make_labels(lab), n),
                ],
            ).families
        )

    shape, _ = shape_of(stats(0))
    pair = Pair()
    for ts, n in [(0.0, 1.0), (10.0, 5.0), (20.0, 9.0), (30.0, 2.0)]:
        pair.scrape(shape, shape_of(stats(n))[1], ts)
    assert pair.outputs > 0


def test_empty_shape_expires_both_sources():
    pair = Pair(max_gap_s=10.0)
    shape, v0 = shape_of(test_derive.snap(0.0, core(**KW0)).families)
    pair.scrape(shape, v0, 0.0)
    pair.both_derive(stats_snapshot(1.0))
    empty = Shape([])
    pair.scrape(empty, np.empty(0), 5.0)
    pair.scrape(empty, np.empty(0), 20.0)
    assert pair.col.tracked_series() == 0


# --------------------------------------------------------------------------------------------
# Every scenario of test_derive.py, replayed through both paths


class _MirroredDeriver(Deriver):
    """A Deriver that, on every derive(snap), checks a column-wise twin gives the same."""

    def __init__(self, target: str, *, max_gap_s: float = 300.0) -> None:
        super().__init__(target, max_gap_s=max_gap_s)
        self.twin = Deriver(target, max_gap_s=max_gap_s)
        self.shape: Shape | None = None
        self.structure: object = None

    def derive(self, snap: Snapshot, configs: Mapping[str, ModelConfigInfo]) -> list[Sample]:
        expected = super().derive(snap, configs)
        if snap.families and all(f.name.startswith("triton_stats_") for f in snap.families):
            got = self.twin.derive(snap, configs)  # as the stats-API job does
        else:
            structure = [
                (f.name, f.type, f.help, [(s.name, s.labels) for s in f.samples])
                for f in snap.families
            ]
            if self.shape is None or structure != self.structure:  # keep an unchanged shape
                self.shape, self.structure = Shape(list(snap.families)), structure
            values = np.array([s.value for s in snap.samples()], dtype=np.float64)
            got = self.twin.derive_columns(self.shape, values, snap.ts, configs)
        assert rows(got) == rows(expected)
        assert state_of(self.twin) == state_of(self)
        return expected


def _plain_tests() -> list[Callable[[], Any]]:
    found = []
    for name, fn in sorted(vars(test_derive).items()):
        if name.startswith("test_") and callable(fn):
            if not inspect.signature(fn).parameters:  # fixtures and parameters aside
                found.append(fn)
    return found


@pytest.mark.parametrize("scenario", _plain_tests(), ids=lambda fn: fn.__name__)
def test_derive_scenario_gives_the_same_through_columns(scenario, monkeypatch):
    monkeypatch.setattr(test_derive, "Deriver", _MirroredDeriver)
    scenario()


# --------------------------------------------------------------------------------------------
# Hypothesis: random value and timing sequences over a universe exercising every role

_A = {"model": "a", "version": "1"}
_B = {"model": "b", "version": "2", "namespace": "ns"}
_E = {"model": "ens", "version": "1"}
_UNIVERSE: list[tuple[str, dict[str, str]]] = [
    ("nv_inference_request_success", {**_A, "gpu_uuid": "G0"}),
    ("nv_inference_request_success", {**_A, "gpu_uuid": "G1"}),
    ("nv_inference_request_success", _B),
    ("nv_inference_request_success", _E),
    ("nv_inference_request_success_total", _B),  # the other spelling of a series above
    ("nv_inference_count", {**_A, "gpu_uuid": "G0"}),
    ("nv_inference_count", {**_A, "gpu_uuid": "G1"}),
    ("nv_inference_count", _B),
    ("nv_inference_count", _E),
    ("nv_inference_exec_count", _A),
    ("nv_inference_exec_count", _B),
    ("nv_inference_request_failure", {**_A, "reason": "REJECTED"}),
    ("nv_inference_request_failure", {**_A, "reason": "BACKEND"}),
    ("nv_inference_request_failure", _B),
    ("nv_inference_queue_duration_us", _A),
    ("nv_inference_compute_infer_duration_us", _A),
    ("nv_inference_request_duration_us", _B),
    ("nv_inference_pending_request_count", _A),
    ("nv_inference_pending_request_count", {"version": "1"}),  # no model label
    ("nv_cache_num_hits_per_model", _A),
    ("nv_cache_num_misses_per_model", _A),
    ("nv_inference_first_response_histogram_ms_sum", _B),
    ("nv_inference_first_response_histogram_ms_count", _B),
    ("vllm:generation_tokens_total", _B),
    ("nv_trt_llm_kv_cache_block_metrics", {**_B, "kv_cache_block_type": "used"}),
    ("nv_trt_llm_kv_cache_block_metrics", {**_B, "kv_cache_block_type": "free"}),
    ("nv_trt_llm_kv_cache_block_metrics", {**_B, "kv_cache_block_type": "max"}),
    ("nv_trt_llm_request_metrics", {**_B, "request_type": "active"}),
    ("nv_trt_llm_request_metrics", {**_B, "request_type": "scheduled"}),
    ("nv_gpu_utilization", {"gpu_uuid": "G0"}),
    ("nv_gpu_power_usage", {"gpu_uuid": "G0"}),
    ("nv_gpu_power_limit", {"gpu_uuid": "G0"}),
    ("nv_gpu_utilization", {"gpu_uuid": "G1"}),
    ("nv_energy_consumption", {"gpu_uuid": "G0"}),
    ("nv_energy_consumption", {"gpu_uuid": "G1"}),
    ("nv_cpu_utilization", {}),  # not read by the deriver
    ("triton_stats_success_count", _A),
    ("triton_stats_fail_count", _A),
    ("triton_stats_batch_executions", {**_A, "batch_size": "4"}),
    ("triton_stats_batch_executions", {**_A, "batch_size": "8"}),
    ("triton_stats_response_success_count", {**_A, "index": "0"}),
    ("triton_stats_response_success_ns", {**_A, "index": "0"}),
]
_HYPO_CONFIGS = {
    "a": ModelConfigInfo(name="a", max_batch_size=8, preferred_batch_sizes=(4,)),
    "ens": ModelConfigInfo(name="ens", max_batch_size=8, platform="ensemble"),
}
_FAMILY_OF = {name: name.removesuffix("_total").removesuffix("_sum").removesuffix("_count")
              for name, _ in _UNIVERSE}


def _families(present: Sequence[bool], values: Sequence[float]) -> list[MetricFamily]:
    by_family: dict[str, list[Sample]] = {}
    for (name, labels), here, value in zip(_UNIVERSE, present, values, strict=True):
        if here:
            by_family.setdefault(_FAMILY_OF[name], []).append(
                Sample(name, make_labels(labels), value)
            )
    return [MetricFamily(name, "untyped", "", tuple(s)) for name, s in by_family.items()]


_value = st.one_of(
    st.sampled_from([0.0, -0.0, 1.0, 2.0, 5.0, 100.0, 0.1, -1.0, math.nan, math.inf, -math.inf]),
    st.floats(min_value=0, max_value=1e6, allow_nan=False),
    st.floats(allow_nan=True, allow_infinity=True),
)
_step = st.tuples(
    st.sampled_from(["columns", "columns", "columns", "stats", "derive"]),
    st.integers(min_value=0, max_value=3),  # which of a few presence masks (shape)
    st.sampled_from([0.0, 1.0, 1.0, 7.5, -3.0, 31.0, 1e-9]),  # dt; max_gap is 30
    st.lists(_value, min_size=len(_UNIVERSE), max_size=len(_UNIVERSE)),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    masks=st.lists(
        st.lists(st.booleans(), min_size=len(_UNIVERSE), max_size=len(_UNIVERSE)),
        min_size=4,
        max_size=4,
    ),
    steps=st.lists(_step, min_size=1, max_size=12),
)
def test_random_sequences_derive_alike(masks, steps):
    masks[0] = [True] * len(_UNIVERSE)
    pair = Pair(max_gap_s=30.0, configs=_HYPO_CONFIGS)
    shapes: dict[int, Shape] = {}
    ts = 100.0
    for how, mask_id, dt, values in steps:
        ts += dt
        families = _families(masks[mask_id], values)
        if how == "stats":
            stats = [f for f in families if f.name.startswith("triton_stats_")]
            pair.both_derive(Snapshot("t", ts, tuple(stats)))
            continue
        # The same presence mask is the same Shape object, as parse_columns keeps it.
        if mask_id not in shapes:
            shapes[mask_id] = shape_of(families)[0]
        shape = shapes[mask_id]
        column = np.array([s.value for f in families for s in f.samples], dtype=np.float64)
        if how == "derive":
            pair.both_derive(shape.snapshot("t", ts, column, keep=DERIVED_FROM))
        else:
            pair.scrape(shape, column, ts)
