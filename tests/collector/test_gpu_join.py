"""Differential tests: the column-wise GPU join (``TritonGpuPlan``) sees what the sample walk does.

``TritonGpuPlan(shape.names, shape.labels).view(values, derived)`` and the sample walk
``_triton_view(shape.samples(values) + derived)`` must both equal ``expected_view``, an oracle
written from the module's documented rules with an algorithm of its own (itself checked against
a view worked out by hand), and ``GpuSliDeriver.derive_columns`` must return exactly what
``derive`` returns for the same scrapes, run after run.  Checked over every recorded payload,
generated Triton payloads, values the join must carry through (NaN, infinities, -0.0, DCGM
gauges that all read 0), targets without GPUs, hypothesis-generated series, and targets whose
payload structure changes between runs.
"""

from __future__ import annotations

import asyncio
import math
import operator
import random
import threading
from collections.abc import Callable, Iterable, Mapping
from functools import reduce
from typing import Any, TypeVar

import httpx
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.collector.test_parse import ALL_PROM, FIXTURES, PAYLOAD_SHAPES, read
from tests.payloads import triton_payload
from tritonwatch.collector.derive import DERIVED_FROM, Deriver
from tritonwatch.collector.gpu import (
    EMPTY_PLAN,
    GpuSliDeriver,
    TritonGpuPlan,
    TritonReading,
    _triton_view,
    _TritonTarget,
)
from tritonwatch.collector.jobs import Collector
from tritonwatch.collector.shape import Shape, parse_columns
from tritonwatch.schemas.config import validate_config
from tritonwatch.schemas.samples import Sample, TargetHealth, label_value, make_labels
from tritonwatch.store import Query

A = "GPU-aaaaaaaa-0000-0000-0000-000000000000"


#: Triton's DCGM gauges and the GPU field each one fills, written out here (from Triton's
#: metrics documentation) rather than taken from collector.gpu: the oracle shares no code with
#: what it checks.
DCGM = {
    "nv_gpu_utilization": "util",
    "nv_gpu_memory_used_bytes": "mem_used",
    "nv_gpu_memory_total_bytes": "mem_total",
    "nv_gpu_power_usage": "power",
    "nv_gpu_power_limit": "power_limit",
}
GPU_FIELDS = ("util", "mem_used", "mem_total", "power", "power_limit")
PENDING = "nv_inference_pending_request_count"

K = TypeVar("K")
V = TypeVar("V")


def grouped(pairs: Iterable[tuple[K, V]]) -> dict[K, list[V]]:
    """Values by key, keys in order of first appearance, values in order."""
    out: dict[K, list[V]] = {}
    for key, value in pairs:
        out.setdefault(key, []).append(value)
    return out


def total(values: list[float]) -> float:
    # Added one by one in arrival order, from 0.0: the sum a running counter gives.
    return reduce(operator.add, values, 0.0)


def expected_view(samples: Iterable[Sample]) -> tuple[list[Any], ...]:
    """The join's view of one target, as collector/gpu.py's docstring states it: the oracle.

    Computed its own way (classify every sample once, then group and reduce each part), and
    shaped like ``canon_view``.  What it encodes: a GPU is any UUID (case and spaces folded)
    on a DCGM gauge or a model's ``nv_inference_*`` series, spelt as first seen; its gauges are
    the last reading of each, all forgotten when utilization, memory used and power all read
    0 (a failed DCGM read); models are those of ``nv_inference_*`` series with a model label
    plus those of raw ``sli:pending_requests``/``sli:queue_time_seconds``; pending counts sum
    per model and GPU, or per model where the series has no GPU; the SLIs keep their last
    value.
    """
    rows = []  # (kind, model, gpu key, gpu spelling, name, value)
    for name, labels, value in samples:
        uuid = label_value(labels, "gpu_uuid")
        model = (label_value(labels, "model"), label_value(labels, "version"),
                 label_value(labels, "namespace"))
        if name in DCGM:
            kind = "dcgm"
        elif name.startswith("nv_inference_") and model[0]:
            kind = "pending" if name == PENDING else "model"
        elif name in ("sli:pending_requests", "sli:queue_time_seconds"):
            kind = name
        else:
            continue
        rows.append((kind, model, uuid.strip().lower(), uuid, name, value))

    on_gpu = [r for r in rows if r[3] and r[0] in ("dcgm", "model", "pending")]
    spelling = {key: spelt[0] for key, spelt in grouped((r[2], r[3]) for r in on_gpu).items()}
    readings = grouped(((r[2], DCGM[r[4]]), r[5]) for r in rows if r[0] == "dcgm" and r[3])
    gpus = []
    for key, uuid in spelling.items():
        last = {f: readings[(key, f)][-1] if (key, f) in readings else None for f in GPU_FIELDS}
        if not (last["util"] or last["mem_used"] or last["power"]):
            last = dict.fromkeys(GPU_FIELDS)
        gpus.append((key, uuid, *(repr(last[f]) for f in GPU_FIELDS), None))

    models = sorted({r[1] for r in rows if r[0] != "dcgm"})
    model_rows = [r for r in rows if r[0] in ("model", "pending") and r[3]]
    model_gpus = [(m, sorted(set(keys)))
                  for m, keys in grouped((r[1], r[2]) for r in model_rows).items()]
    per_gpu = grouped((r[1], (r[2], r[5])) for r in rows if r[0] == "pending" and r[3])
    pending_by_gpu = [(m, [(k, repr(total(vs))) for k, vs in grouped(pairs).items()])
                      for m, pairs in per_gpu.items()]

    def by_model(kind: str, reduce_: Callable[[list[float]], float]) -> list[tuple[object, str]]:
        chosen = (r for r in rows if r[0] == kind and (kind != "pending" or not r[3]))
        return [(m, repr(reduce_(vs))) for m, vs in grouped((r[1], r[5]) for r in chosen).items()]

    return (
        gpus, models, model_gpus, pending_by_gpu,
        by_model("pending", total),
        by_model("sli:pending_requests", lambda vs: vs[-1]),
        by_model("sli:queue_time_seconds", lambda vs: vs[-1]),
    )


def canon_view(view: _TritonTarget) -> tuple[object, ...]:
    """Everything in a view, order included where it is a dict's, floats by repr (so NaN
    equals NaN, -0.0 differs from 0.0 and a numpy scalar differs from a Python float)."""

    def floats(d: Mapping[Any, float]) -> list[tuple[object, str]]:
        return [(k, repr(v)) for k, v in d.items()]

    return (
        [(k, g.uuid, *map(repr, (g.util, g.mem_used, g.mem_total, g.power, g.power_limit)),
          g.reasons) for k, g in view.gpus.items()],
        sorted(view.models),
        [(m, sorted(g)) for m, g in view.model_gpus.items()],
        [(m, floats(d)) for m, d in view.pending_by_gpu.items()],
        floats(view.pending_raw),
        floats(view.pending_sli),
        floats(view.queue_time),
    )


def canon_samples(samples: list[Sample]) -> list[tuple[str, object, str]]:
    return [(s.name, s.labels, repr(s.value)) for s in samples]


def nvml_for(uuids: Iterable[str]) -> list[Sample]:
    """NVML readings for some of the GPUs (so NVML-wins and DCGM-fills-in both happen)."""
    out = []
    for i, uuid in enumerate(sorted(uuids)[::2]):
        g = make_labels({"gpu_uuid": uuid.upper(), "index": str(i)})
        out += [Sample("nvml_gpu_up", g, 1.0), Sample("nvml_gpu_utilization_ratio", g, 0.05),
                Sample("nvml_gpu_memory_used_bytes", g, 1e9),
                Sample("nvml_gpu_memory_total_bytes", g, 8e10)]
    return out


def assert_join_matches(shape: Shape, values: np.ndarray, derived: list[Sample]) -> None:
    """The plan's view and the column-wise join equal the sample walk's, for one scrape."""
    plan = TritonGpuPlan(shape.names, shape.labels)
    samples = shape.samples(values) + derived
    expected = expected_view(samples)
    assert canon_view(plan.view(values, derived)) == expected
    assert canon_view(_triton_view(samples)) == expected
    nvml = nvml_for(gpu[0] for gpu in expected[0])
    columns = GpuSliDeriver().derive_columns(nvml, {"t": TritonReading(plan, values, derived)})
    assert canon_samples(columns) == canon_samples(GpuSliDeriver().derive(nvml, {"t": samples}))


def perturbed(shape: Shape, values: np.ndarray, seed: int) -> np.ndarray:
    """``values`` with odd readings where the join reads values, and one GPU's DCGM gauges
    all at 0 (a failed read)."""
    rng = random.Random(seed)
    odd = [math.nan, math.inf, -math.inf, -0.0, 0.0, 1e-300, 7.0]
    out = values.copy()
    for i, name in enumerate(shape.names):
        if name.startswith("nv_gpu_") or name.startswith("sli:") or "pending" in name:
            if rng.random() < 0.5:
                out[i] = rng.choice(odd)
    uuids = [label_value(lbl, "gpu_uuid") for lbl in shape.labels]
    first = next((u for n, u in zip(shape.names, uuids, strict=True) if n in DCGM and u), None)
    for i, (name, uuid) in enumerate(zip(shape.names, uuids, strict=True)):
        if name in DCGM and uuid == first:
            out[i] = 0.0
    return out


def scrape_pair(first: str, second: str) -> tuple[Shape, np.ndarray, list[Sample]]:
    """The second of two consecutive scrapes and the Deriver's SLIs of it (rates included)."""
    deriver = Deriver("t")
    shape = None
    derived: list[Sample] = []
    values = np.empty(0)
    for ts, text in ((1000.0, first), (1015.0, second)):
        shape, values = parse_columns(text, shape)
        derived = deriver.derive(shape.snapshot("t", ts, values, keep=DERIVED_FROM), {})
    assert shape is not None
    return shape, values, derived


def test_the_oracle_agrees_with_a_view_worked_out_by_hand():
    def s(name: str, value: float, **labels: str) -> Sample:
        return Sample(name, make_labels(labels), value)

    m, n, o = ("m", "1", ""), ("n", "2", ""), ("o", "1", "")
    samples = [
        s("nv_gpu_utilization", 0.5, gpu_uuid="GPU-A"),
        s("nv_gpu_memory_used_bytes", 100.0, gpu_uuid="GPU-A"),
        s("nv_gpu_power_usage", 0.0, gpu_uuid="GPU-A"),
        s("nv_gpu_utilization", 0.75, gpu_uuid="GPU-A"),  # a later reading wins
        # GPU-B: utilization, memory and power all 0 is a failed read, total or not.
        s("nv_gpu_utilization", 0.0, gpu_uuid="GPU-B"),
        s("nv_gpu_memory_used_bytes", 0.0, gpu_uuid="GPU-B"),
        s("nv_gpu_memory_total_bytes", 800.0, gpu_uuid="GPU-B"),
        s("nv_gpu_power_usage", 0.0, gpu_uuid=""),  # no GPU: ignored
        s("nv_inference_request_success", 7.0, model="m", version="1", gpu_uuid=" gpu-a "),
        s("nv_inference_pending_request_count", 2.0, model="m", version="1", gpu_uuid="gpu-a"),
        s("nv_inference_pending_request_count", 3.0, model="m", version="1", gpu_uuid="GPU-C"),
        s("nv_inference_pending_request_count", 0.5, model="m", version="1", gpu_uuid="gpu-c"),
        s("nv_inference_pending_request_count", 4.0, model="n", version="2"),
        s("nv_inference_pending_request_count", 1.5, model="n", version="2"),
        s("nv_inference_request_success", 1.0, version="1", gpu_uuid="GPU-D"),  # no model
        s("nv_cpu_utilization", 0.3),
        s("sli:queue_time_seconds", 0.25, model="n", version="2"),
        s("sli:pending_requests", 5.0, model="o", version="1"),
        s("sli:pending_requests", 6.0, model="o", version="1"),
    ]
    by_hand = (
        [("gpu-a", "GPU-A", "0.75", "100.0", "None", "0.0", "None", None),
         ("gpu-b", "GPU-B", "None", "None", "None", "None", "None", None),
         ("gpu-c", "GPU-C", "None", "None", "None", "None", "None", None)],
        [m, n, o],
        [(m, ["gpu-a", "gpu-c"])],
        [(m, [("gpu-a", "2.0"), ("gpu-c", "3.5")])],
        [(n, "5.5")],
        [(o, "6.0")],
        [(n, "0.25")],
    )
    assert expected_view(samples) == by_hand
    names = [x.name for x in samples]
    labels = [x.labels for x in samples]
    values = np.array([x.value for x in samples], np.float64)
    view = TritonGpuPlan(names, labels).view(values)
    assert canon_view(view) == by_hand
    assert canon_view(_triton_view(samples)) == by_hand


# --------------------------------------------------------------------------------------------
# Recorded and generated payloads


@pytest.mark.parametrize("path", ALL_PROM, ids=lambda p: p.name)
def test_every_fixture_joins_like_the_sample_walk(path):
    text = read(path)
    shape, values, derived = scrape_pair(text, text)
    assert_join_matches(shape, values, derived)
    assert_join_matches(shape, values, [])
    assert_join_matches(shape, perturbed(shape, values, seed=1), derived)


def test_rig_captures_under_load_join_like_the_sample_walk():
    rig = FIXTURES / "rig"
    shape, values, derived = scrape_pair(read(rig / "metrics-load-1.prom"),
                                         read(rig / "metrics-load-2.prom"))
    assert any(s.name == "sli:pending_requests" for s in derived)
    assert_join_matches(shape, values, derived)
    assert_join_matches(shape, perturbed(shape, values, seed=2), derived)


@pytest.mark.parametrize("kwargs", PAYLOAD_SHAPES, ids=repr)
def test_generated_payloads_join_like_the_sample_walk(kwargs):
    step = kwargs.get("step", 0)
    shape, values, derived = scrape_pair(triton_payload(**kwargs),
                                         triton_payload(**{**kwargs, "step": step + 1}))
    assert_join_matches(shape, values, derived)
    for seed in range(3):
        assert_join_matches(shape, perturbed(shape, values, seed), derived)


def test_a_target_without_a_scrape_joins_only_its_derived_slis():
    derived = [Sample("sli:queue_time_seconds", make_labels({"model": "m", "version": "1"}), 0.1)]
    view = EMPTY_PLAN.view(np.empty(0), derived)
    assert canon_view(view) == expected_view(derived)


def test_values_of_another_structure_are_refused():
    shape, values = parse_columns(triton_payload(models=2, gpus=1))
    plan = TritonGpuPlan(shape.names, shape.labels)
    with pytest.raises(ValueError, match=f"{len(values) - 1} values for a payload of"):
        plan.view(values[:-1])


# --------------------------------------------------------------------------------------------
# Generated series: per-GPU pending counts, UUID spellings, raw sli:* series, odd values

_NAMES = (*DCGM, "nv_energy_consumption", "nv_inference_pending_request_count",
          "nv_inference_request_success", "nv_inference_queue_duration_us",
          "sli:pending_requests", "sli:queue_time_seconds", "nv_cpu_utilization")
_VALUES = st.one_of(
    st.sampled_from([0.0, -0.0, 1.0, 0.5, 3.0, math.nan, math.inf, -math.inf]),
    st.floats(allow_nan=True, allow_infinity=True),
)
_LABELS = st.builds(
    lambda uuid, model, version, namespace: make_labels(
        {k: v for k, v in (("gpu_uuid", uuid), ("model", model), ("version", version),
                           ("namespace", namespace)) if v is not None}
    ),
    st.sampled_from([None, "", A, A.lower(), " GPU-b ", "GPU-B", "MIG-c"]),
    st.sampled_from([None, "", "m", "n"]),
    st.sampled_from([None, "1", "2"]),
    st.sampled_from([None, "", "team"]),
)
_SAMPLES = st.lists(st.builds(Sample, st.sampled_from(_NAMES), _LABELS, _VALUES), max_size=40)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(raw=_SAMPLES, derived=_SAMPLES)
def test_generated_series_join_like_the_sample_walk(raw, derived):
    names = [s.name for s in raw]
    labels = [s.labels for s in raw]
    values = np.array([s.value for s in raw], np.float64)
    plan = TritonGpuPlan(names, labels)
    samples = [Sample(n, lbl, v) for n, lbl, v in zip(names, labels, values.tolist(),
                                                       strict=True)]
    expected = expected_view(samples + derived)
    assert canon_view(plan.view(values, derived)) == expected
    nvml = nvml_for(gpu[0].upper() for gpu in expected[0])
    columns = GpuSliDeriver().derive_columns(nvml, {"t": TritonReading(plan, values, derived)})
    assert canon_samples(columns) == canon_samples(
        GpuSliDeriver().derive(nvml, {"t": samples + derived}))


# --------------------------------------------------------------------------------------------
# Through the collector: plans per shape, shape changes, targets going down


class Scripted:
    """/metrics of several targets, each answering its next scripted body (None: down)."""

    def __init__(self, bodies: dict[str, list[str | None]]) -> None:
        self.bodies = bodies
        self.step = 0

    def handler(self, request: httpx.Request) -> httpx.Response:
        body = self.bodies[request.url.host][self.step]
        if body is None:
            raise httpx.ConnectError("refused", request=request)
        return httpx.Response(200, text=body)


class FakeNvml:
    def __init__(self, samples: list[Sample]) -> None:
        self.samples = samples

    def collect(self) -> tuple[list[Sample], TargetHealth]:
        return self.samples, TargetHealth("h", "nvml", 1000.0, True, 0.0, len(self.samples))

    def close(self) -> None:
        pass


def test_collector_joins_like_the_sample_walk_across_shape_changes_and_outages(store):
    p = triton_payload
    # triton_payload reorders series inside families per step: every step is a new shape,
    # except where a body repeats.
    bodies: dict[str, list[str | None]] = {
        "changing": [p(models=3, gpus=2, step=0), p(models=3, gpus=2, step=0),
                     p(models=3, gpus=2, step=0), p(models=3, gpus=2, step=1),
                     p(models=5, gpus=3, seed=4), None, p(models=2, gpus=0),
                     p(models=3, gpus=2, step=2), p(models=3, gpus=2, step=2),
                     p(models=3, gpus=2, step=2)],
        "steady": [p(models=4, gpus=2, seed=9)] * 10,
        "cpu": [p(models=3, gpus=0, seed=2, step=i) for i in range(10)],
    }
    config = validate_config({
        "nvml": {"enabled": True, "host": "h"},
        "targets": [{"name": n, "metrics_url": f"http://{n}/metrics"} for n in bodies],
    })
    script = Scripted(bodies)
    now = [1000.0]
    collector = Collector(config, store, clock=lambda: now[0],
                          client=httpx.AsyncClient(transport=httpx.MockTransport(script.handler)))
    uuids = {label_value(lbl, "gpu_uuid") for body in bodies["changing"] if body
             for lbl in parse_columns(body)[0].labels} - {""}
    collector.nvml = FakeNvml(nvml_for(uuids))  # type: ignore[assignment]
    reference = GpuSliDeriver()  # fed the sample walk, in lockstep with the collector's
    joined: list[list[Sample]] = []

    async def go() -> list[TritonGpuPlan]:
        plans = []
        for step in range(len(bodies["changing"])):
            script.step = step
            for name in bodies:
                await collector.scrape(name)
            await collector.read_nvml()
            plans.append(collector.targets["changing"]._gpu_plan[1])
            now[0] += 15
        await collector.close()
        return plans

    real = collector.gpu_deriver
    assert real is not None

    def spy(nvml, readings):
        out = real_derive_columns(nvml, readings)
        triton = {n: st.latest_raw + st.latest for n, st in collector.targets.items()}
        assert canon_samples(out) == canon_samples(reference.derive(nvml, triton))
        joined.append(out)
        return out

    real_derive_columns = real.derive_columns
    real.derive_columns = spy  # type: ignore[method-assign]
    plans = asyncio.run(go())
    assert len(joined) == len(bodies["changing"])
    # One plan per shape: a first scrape's shape is replaced by a settled one when the
    # structure repeats (collector.shape), which later scrapes reuse; every new structure gets
    # a new plan, and an outage keeps the last (its shape may come back).
    assert plans[2] is plans[1] and plans[9] is plans[8] and plans[5] is plans[4]
    assert len({id(x) for x in plans}) == 7
    # While "changing" was down it was joined as having no scrape at all.
    down = joined[5]
    assert not any(label_value(s.labels, "triton_target") == "changing" for s in down)
    assert any(label_value(s.labels, "triton_target") == "changing" for s in joined[4])


def test_the_join_runs_in_a_worker_thread_not_on_the_event_loop(store):
    body = triton_payload(models=2, gpus=1)
    config = validate_config({"nvml": {"enabled": True, "host": "h"},
                              "targets": [{"name": "a", "metrics_url": "http://a/metrics"}]})
    collector = Collector(config, store, clock=lambda: 1000.0, client=httpx.AsyncClient(
        transport=httpx.MockTransport(lambda request: httpx.Response(200, text=body))))
    collector.nvml = FakeNvml([])  # type: ignore[assignment]
    deriver = collector.gpu_deriver
    assert deriver is not None
    seen = []
    join = deriver.derive_columns

    def spy(nvml, readings):
        try:
            asyncio.get_running_loop()
            seen.append("event loop")
        except RuntimeError:
            seen.append(threading.current_thread().name)
        return join(nvml, readings)

    deriver.derive_columns = spy  # type: ignore[method-assign]

    async def go():
        await collector.scrape("a")
        await collector.read_nvml()
        await collector.close()

    asyncio.run(go())
    assert len(seen) == 1 and seen[0] != "event loop"
    store.flush()
    assert store.read(Query("sli:gpu_utilization_ratio", start=0, end=2000)).series()


def test_a_scrape_replacing_the_last_scrape_meanwhile_never_mismatches_plan_and_values(store):
    config = validate_config({"targets": [{"name": "a", "metrics_url": "http://a/metrics"}]})
    state = Collector(config, store).targets["a"]
    scrapes: list[tuple[tuple[Shape, np.ndarray, list[Sample]], Any]] = []
    for i, body in enumerate(
        (triton_payload(models=2, gpus=1), triton_payload(models=4, gpus=3, seed=5))
    ):
        shape, values = parse_columns(body)
        # Each scrape's derived SLIs name it: the reading must never mix two scrapes.
        derived = [Sample("sli:scrape", (), float(i))]
        scrapes.append(((shape, values, derived), expected_view(shape.samples(values))))
    expected = {repr(c): float(i) for i, (_, c) in enumerate(scrapes)}
    stop = threading.Event()

    def scraper() -> None:
        i = 0
        while not stop.is_set():
            state.last_scrape = scrapes[i % 2][0]
            i += 1

    thread = threading.Thread(target=scraper)
    thread.start()
    try:
        for _ in range(300):
            reading = state.gpu_reading()
            seen = repr(canon_view(reading.plan.view(reading.values)))
            assert seen in expected
            assert [s.value for s in reading.derived] == [expected[seen]]
    finally:
        stop.set()
        thread.join()
