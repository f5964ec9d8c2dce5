"""GPU SLIs that join NVML's view of a GPU with Triton's view of the models running on it.

The join key is the GPU UUID: NVML's ``gpu_uuid`` (or ``mig_uuid`` for a MIG instance) equals
the ``gpu_uuid`` label Triton puts on its ``nv_gpu_*`` series and on the raw ``nv_inference_*``
series of KIND_GPU model instances.  UUIDs are compared case-insensitively.

Inputs, each the latest reading:

* ``nvml_samples``: what ``NvmlCollector.collect()`` returned (may be empty: no NVML here);
* per Triton target, its raw samples plus the Deriver's SLIs of its latest scrape
  (``sli:pending_requests``, ``sli:queue_time_seconds``): as ``Sample`` objects
  (``GpuSliDeriver.derive``), or column-wise as a ``TritonReading`` (``derive_columns``), which
  is what the collector passes every ``nvml.interval``.

The column-wise join exists because the join needs few of a scrape's series: the DCGM gauges
and pending-request counts for their values, and otherwise only the labels of the
``nv_inference_*`` series (which models exist, which GPUs they run on).  Labels do not change
while a payload's structure does not, so a ``TritonGpuPlan`` finds all of that once per
structure (``collector.shape.Shape``) and each join then only indexes the value array, instead
of building and walking a ``Sample`` per series (600,000 of them for 1,000 targets of 600
series).  ``derive_columns`` returns exactly what ``derive`` returns for the same scrape (the
differential tests in ``tests/collector/test_gpu_join.py`` hold it so).

Every GPU that either view knows gets the SLIs below (labels ``gpu_uuid``; NVML values win,
Triton's DCGM values fill in when NVML has none, and a DCGM GPU whose gauges all read 0 is a
failed read, not an idle GPU):

==================================  ========  ==============================================
SLI                                 unit      meaning
==================================  ========  ==============================================
``sli:gpu_utilization_ratio``       ratio     GPU utilization, 0-1
``sli:gpu_memory_headroom_bytes``   bytes     memory total - used
``sli:gpu_memory_headroom_ratio``   ratio     1 - used / total
``sli:gpu_power_headroom_watts``    W         power limit - draw
``sli:gpu_power_headroom_ratio``    ratio     1 - draw / limit
``sli:gpu_throttling``              0/1       a performance-limiting clock reason is active
                                              (NVML only; see ``THROTTLE_REASONS``)
``sli:gpu_throttle_reason``         0/1       per performance-limiting reason {reason}
``sli:gpu_pending_requests``        requests  requests pending in Triton for models on it
``sli:gpu_queue_time_rising``       0/1       a model on it has rising average queue time
``sli:gpu_idle_while_queued``       0/1       utilization below the idle threshold while
                                              models on it have pending requests or rising
                                              queue time
``sli:gpu_model_placement``         1         {gpu_uuid, triton_target, model, version,
                                              namespace?}: the model has an instance there
==================================  ========  ==============================================

Which models run on a GPU: the ``gpu_uuid`` label of the model's raw ``nv_inference_*``
series.  When no model series of a target carries ``gpu_uuid`` (GPU metrics off for the
models, older Triton), the mapping is unknown and every model of that server is taken to run
on every GPU of that server (the GPUs in its ``nv_gpu_*``).  Pending requests of a model with
per-GPU pending series are counted on their GPU; otherwise the model's total counts on each of
its GPUs.  The queue-related SLIs are emitted only for GPUs some Triton target knows about, the
idle one only when the utilization is known too.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from tritonwatch.collector.derive import SliSpec
from tritonwatch.collector.nvml import CLOCK_EVENT_REASONS, THROTTLE_REASONS
from tritonwatch.collector.shape import Values
from tritonwatch.schemas.samples import Labels, Sample, label_value, make_labels

_G = ("gpu_uuid",)

#: Every SLI this module emits: name → unit, labels and meaning.
GPU_SLI_CATALOG: dict[str, SliSpec] = {
    "sli:gpu_utilization_ratio": SliSpec("ratio", _G, "GPU utilization, 0-1 (NVML, else DCGM)"),
    "sli:gpu_memory_headroom_bytes": SliSpec("bytes", _G, "GPU memory total - used"),
    "sli:gpu_memory_headroom_ratio": SliSpec("ratio", _G, "1 - GPU memory used / total"),
    "sli:gpu_power_headroom_watts": SliSpec("W", _G, "Power limit - power draw"),
    "sli:gpu_power_headroom_ratio": SliSpec("ratio", _G, "1 - power draw / limit"),
    "sli:gpu_throttling": SliSpec("0/1", _G, "A performance-limiting clock reason is active"),
    "sli:gpu_throttle_reason": SliSpec(
        "0/1", (*_G, "reason"), "Each performance-limiting clock reason, active or not"
    ),
    "sli:gpu_pending_requests": SliSpec(
        "requests", _G, "Requests pending in Triton for the models on this GPU"
    ),
    "sli:gpu_queue_time_rising": SliSpec(
        "0/1", _G, "A model on this GPU has rising average queue time"
    ),
    "sli:gpu_idle_while_queued": SliSpec(
        "0/1", _G, "Utilization below the idle threshold while models on it queue"
    ),
    "sli:gpu_model_placement": SliSpec(
        "1", (*_G, "triton_target", "model", "version", "namespace?"),
        "The model has an instance on this GPU",
    ),
}

_THROTTLE_ORDER = tuple(name for _, name in CLOCK_EVENT_REASONS if name in THROTTLE_REASONS)

ModelKey = tuple[str, str, str]  # (model, version, namespace)
_MODEL_FAMILY_PREFIX = "nv_inference_"


def _key(uuid: str) -> str:
    return uuid.strip().lower()


def _model_key(labels: Labels) -> ModelKey:
    return (label_value(labels, "model"), label_value(labels, "version"),
            label_value(labels, "namespace"))


@dataclass
class _Gpu:
    uuid: str  # as first seen (NVML's spelling wins)
    util: float | None = None
    mem_used: float | None = None
    mem_total: float | None = None
    power: float | None = None
    power_limit: float | None = None
    reasons: dict[str, float] | None = None


@dataclass
class _TritonTarget:
    gpus: dict[str, _Gpu] = field(default_factory=dict)
    model_gpus: dict[ModelKey, set[str]] = field(default_factory=dict)
    models: set[ModelKey] = field(default_factory=set)
    pending_by_gpu: dict[ModelKey, dict[str, float]] = field(default_factory=dict)
    pending_raw: dict[ModelKey, float] = field(default_factory=dict)
    pending_sli: dict[ModelKey, float] = field(default_factory=dict)
    queue_time: dict[ModelKey, float] = field(default_factory=dict)


# NVML's gauges and the ``_Gpu`` field each fills: a whole GPU's, and a MIG instance's (a
# sample with a ``mig_uuid``), which has no power readings of its own.
_NVML_GPU_FIELDS = {
    "nvml_gpu_utilization_ratio": "util",
    "nvml_gpu_memory_used_bytes": "mem_used",
    "nvml_gpu_memory_total_bytes": "mem_total",
    "nvml_gpu_power_watts": "power",
    "nvml_gpu_power_limit_watts": "power_limit",
}
_NVML_MIG_FIELDS = {
    "nvml_mig_utilization_ratio": "util",
    "nvml_mig_memory_used_bytes": "mem_used",
    "nvml_mig_memory_total_bytes": "mem_total",
}


def _nvml_view(samples: Iterable[Sample]) -> dict[str, _Gpu]:
    gpus: dict[str, _Gpu] = {}
    lost: set[str] = set()
    for name, labels, value in samples:
        mig = label_value(labels, "mig_uuid")
        uuid = mig or label_value(labels, "gpu_uuid")
        if not uuid:
            continue
        k = _key(uuid)
        if name == "nvml_gpu_up" and value == 0.0:
            lost.add(k)
        gpu = gpus.setdefault(k, _Gpu(uuid))
        nvml_field = (_NVML_MIG_FIELDS if mig else _NVML_GPU_FIELDS).get(name)
        if nvml_field is not None:
            setattr(gpu, nvml_field, value)
        elif name == "nvml_gpu_clocks_event_active" and not mig:
            if gpu.reasons is None:
                gpu.reasons = {}
            gpu.reasons[label_value(labels, "reason")] = value
    for k in lost:  # a lost GPU has no readings this pass; keep only its identity
        gpus[k] = _Gpu(gpus[k].uuid)
    return gpus


_DCGM_FIELDS = {
    "nv_gpu_utilization": "util",
    "nv_gpu_memory_used_bytes": "mem_used",
    "nv_gpu_memory_total_bytes": "mem_total",
    "nv_gpu_power_usage": "power",
    "nv_gpu_power_limit": "power_limit",
}


_PENDING_FAMILY = "nv_inference_pending_request_count"
# The Deriver's SLIs the join reads, and the field of ``_TritonTarget`` each one fills.
_SLI_FIELDS = {"sli:pending_requests": "pending_sli", "sli:queue_time_seconds": "queue_time"}


def _triton_view(samples: Iterable[Sample], view: _TritonTarget | None = None) -> _TritonTarget:
    """One target's view of its GPUs and models from its samples (added to ``view``, if given).

    The reference: ``TritonGpuPlan.view`` must return exactly what this returns.
    """
    view = _TritonTarget() if view is None else view
    for name, labels, value in samples:
        dcgm_field = _DCGM_FIELDS.get(name)
        if dcgm_field is not None:
            uuid = label_value(labels, "gpu_uuid")
            if uuid:
                gpu = view.gpus.setdefault(_key(uuid), _Gpu(uuid))
                setattr(gpu, dcgm_field, value)
            continue
        if name.startswith(_MODEL_FAMILY_PREFIX) and label_value(labels, "model"):
            model = _model_key(labels)
            view.models.add(model)
            uuid = label_value(labels, "gpu_uuid")
            if uuid:
                view.model_gpus.setdefault(model, set()).add(_key(uuid))
                view.gpus.setdefault(_key(uuid), _Gpu(uuid))
            if name == _PENDING_FAMILY:
                if uuid:
                    per_gpu = view.pending_by_gpu.setdefault(model, {})
                    per_gpu[_key(uuid)] = per_gpu.get(_key(uuid), 0.0) + value
                else:
                    view.pending_raw[model] = view.pending_raw.get(model, 0.0) + value
        elif name == "sli:pending_requests":
            model = _model_key(labels)
            view.models.add(model)
            view.pending_sli[model] = value
        elif name == "sli:queue_time_seconds":
            model = _model_key(labels)
            view.models.add(model)
            view.queue_time[model] = value
    # DCGM reports a failed read as 0 for every gauge: unknown, not idle.
    for k, gpu in list(view.gpus.items()):
        if not any((gpu.util, gpu.mem_used, gpu.power)):
            view.gpus[k] = _Gpu(gpu.uuid)
    return view


class TritonGpuPlan:
    """Where the join's inputs sit in one payload structure: ``_triton_view`` without samples.

    Built once from a shape's ``names`` and ``labels`` (one entry per series, aligned with the
    value arrays read against it), it keeps what ``_triton_view`` takes from labels alone (the
    GPUs with their UUID as first spelt, the models, which GPUs each runs on) and the positions
    of the series it reads values from: the DCGM gauges, the pending-request counts and any raw
    ``sli:pending_requests``/``sli:queue_time_seconds`` series.  ``view(values)`` then only
    indexes ``values`` with those positions.  Immutable by convention.
    """

    __slots__ = ("_dcgm", "_gpus", "_model_gpus", "_models", "_pending", "_positions", "_sli",
                 "size")

    def __init__(self, names: Sequence[str], labels: Sequence[Labels]) -> None:
        if len(names) != len(labels):
            raise ValueError(f"{len(names)} series names but {len(labels)} label sets")
        gpus: dict[str, str] = {}  # key -> UUID as first spelt, in first-seen order
        models: set[ModelKey] = set()
        model_gpus: dict[ModelKey, set[str]] = {}
        dcgm: list[tuple[int, str, str]] = []  # (position, gpu key, _Gpu field)
        pending: list[tuple[int, ModelKey, str]] = []  # (position, model, gpu key or "")
        sli: list[tuple[int, str, ModelKey]] = []  # (position, _TritonTarget field, model)
        # The same walk, branch for branch, as _triton_view, less what depends on values.
        for i, (name, lbls) in enumerate(zip(names, labels, strict=True)):
            dcgm_field = _DCGM_FIELDS.get(name)
            if dcgm_field is not None:
                uuid = label_value(lbls, "gpu_uuid")
                if uuid:
                    gpus.setdefault(_key(uuid), uuid)
                    dcgm.append((i, _key(uuid), dcgm_field))
                continue
            if name.startswith(_MODEL_FAMILY_PREFIX) and label_value(lbls, "model"):
                model = _model_key(lbls)
                models.add(model)
                uuid = label_value(lbls, "gpu_uuid")
                if uuid:
                    model_gpus.setdefault(model, set()).add(_key(uuid))
                    gpus.setdefault(_key(uuid), uuid)
                if name == _PENDING_FAMILY:
                    pending.append((i, model, _key(uuid) if uuid else ""))
            elif name in _SLI_FIELDS:
                model = _model_key(lbls)
                models.add(model)
                sli.append((i, _SLI_FIELDS[name], model))
        self.size = len(names)
        self._gpus = tuple(gpus.items())
        self._models = frozenset(models)
        self._model_gpus = {m: frozenset(g) for m, g in model_gpus.items()}
        self._dcgm = tuple((k, f) for _, k, f in dcgm)
        self._pending = tuple((m, k) for _, m, k in pending)
        self._sli = tuple((f, m) for _, f, m in sli)
        self._positions = np.array(
            [i for i, *_ in dcgm] + [i for i, *_ in pending] + [i for i, *_ in sli], np.intp
        )

    def view(self, values: Values, derived: Iterable[Sample] = ()) -> _TritonTarget:
        """``_triton_view`` of the series with ``values``, then of ``derived``."""
        if len(values) != self.size:
            raise ValueError(f"{len(values)} values for a payload of {self.size} series")
        read = values[self._positions].tolist()  # Python floats, as Shape.samples gives
        n_dcgm, n_pending = len(self._dcgm), len(self._pending)
        gpus = {k: _Gpu(uuid) for k, uuid in self._gpus}
        view = _TritonTarget(
            gpus=gpus, model_gpus={m: set(g) for m, g in self._model_gpus.items()},
            models=set(self._models),
        )
        # Each kind in exposition order, as _triton_view meets them: the last reading of a
        # gauge wins, and sums add up in the same order (so NaN and -0.0 come out the same).
        for (k, dcgm_field), value in zip(self._dcgm, read[:n_dcgm], strict=True):
            setattr(gpus[k], dcgm_field, value)
        for (model, k), value in zip(self._pending, read[n_dcgm:n_dcgm + n_pending],
                                     strict=True):
            if k:
                per_gpu = view.pending_by_gpu.setdefault(model, {})
                per_gpu[k] = per_gpu.get(k, 0.0) + value
            else:
                view.pending_raw[model] = view.pending_raw.get(model, 0.0) + value
        for (sli_field, model), value in zip(self._sli, read[n_dcgm + n_pending:], strict=True):
            getattr(view, sli_field)[model] = value
        return _triton_view(derived, view)


#: The plan of a target with no scrape to join (never scraped, or down).
EMPTY_PLAN = TritonGpuPlan((), ())


class TritonReading(NamedTuple):
    """One target's latest scrape, column-wise, as ``GpuSliDeriver.derive_columns`` takes it."""

    plan: TritonGpuPlan  # built from the shape ``values`` were read against
    values: Values
    derived: Sequence[Sample]  # the Deriver's SLIs of the same scrape


class GpuSliDeriver:
    """Joins NVML and Triton per GPU; remembers queue times so it can tell "rising"."""

    def __init__(self, *, idle_utilization_below: float = 0.1,
                 queue_time_rise_min_s: float = 0.001) -> None:
        self.idle_utilization_below = idle_utilization_below
        self.queue_time_rise_min_s = queue_time_rise_min_s
        self._previous_queue_time: dict[tuple[str, ModelKey], float] = {}
        # The queue-time history makes a join read-modify-write: one join at a time.
        self._lock = threading.Lock()

    def derive(
        self,
        nvml_samples: Iterable[Sample],
        triton_samples_by_target: Mapping[str, Iterable[Sample]],
    ) -> list[Sample]:
        """The GPU SLIs, from each Triton target's samples (raw plus derived)."""
        targets = {name: _triton_view(s) for name, s in triton_samples_by_target.items()}
        return self._join(_nvml_view(nvml_samples), targets)

    def derive_columns(
        self,
        nvml_samples: Iterable[Sample],
        readings: Mapping[str, TritonReading],
    ) -> list[Sample]:
        """The GPU SLIs, from each Triton target's column-wise scrape; same result as
        ``derive`` with ``plan``'s shape's samples of ``values`` plus ``derived``."""
        targets = {name: r.plan.view(r.values, r.derived) for name, r in readings.items()}
        return self._join(_nvml_view(nvml_samples), targets)

    def _join(self, nvml: dict[str, _Gpu], targets: dict[str, _TritonTarget]) -> list[Sample]:
        with self._lock:
            return self._join_locked(nvml, targets)

    def _join_locked(
        self, nvml: dict[str, _Gpu], targets: dict[str, _TritonTarget]
    ) -> list[Sample]:
        # Merge: NVML's readings first, DCGM's fill in what NVML lacks.
        merged: dict[str, _Gpu] = {k: _Gpu(g.uuid, g.util, g.mem_used, g.mem_total, g.power,
                                           g.power_limit, g.reasons) for k, g in nvml.items()}
        for view in targets.values():
            for k, g in view.gpus.items():
                m = merged.setdefault(k, _Gpu(g.uuid))
                m.util = g.util if m.util is None else m.util
                m.mem_used = g.mem_used if m.mem_used is None else m.mem_used
                m.mem_total = g.mem_total if m.mem_total is None else m.mem_total
                m.power = g.power if m.power is None else m.power
                m.power_limit = g.power_limit if m.power_limit is None else m.power_limit

        # Models per GPU, pending per GPU, rising queue time per GPU.
        known: set[str] = set()
        pending: dict[str, float] = {}
        rising: dict[str, bool] = {}
        placement: list[Sample] = []
        current_queue: dict[tuple[str, ModelKey], float] = {}
        for target, view in targets.items():
            mapped = bool(view.model_gpus)
            known |= set(view.gpus)
            for model in sorted(view.models):
                gpus = view.model_gpus.get(model, set()) if mapped else set(view.gpus)
                for k in sorted(gpus):
                    place = {"gpu_uuid": merged[k].uuid, "triton_target": target,
                              "model": model[0], "version": model[1]}
                    if model[2]:
                        place["namespace"] = model[2]
                    placement.append(Sample("sli:gpu_model_placement",
                                            make_labels(place), 1.0))
                # Per-GPU pending series are exact; otherwise the model's total (the Deriver's
                # sum, else the raw series without gpu_uuid) counts on each of its GPUs.
                per_gpu = view.pending_by_gpu.get(model)
                total = view.pending_sli.get(model, view.pending_raw.get(model, 0.0))
                for k in gpus:
                    add = per_gpu.get(k, 0.0) if per_gpu is not None else total
                    pending[k] = pending.get(k, 0.0) + add
                queue = view.queue_time.get(model)
                if queue is None:
                    continue
                current_queue[(target, model)] = queue
                before = self._previous_queue_time.get((target, model))
                up = before is not None and queue - before >= self.queue_time_rise_min_s
                for k in gpus:
                    rising[k] = rising.get(k, False) or up
        self._previous_queue_time = current_queue

        out: list[Sample] = []
        for k in sorted(merged):
            g = merged[k]
            labels: Labels = (("gpu_uuid", g.uuid),)

            def emit(name: str, value: float, lbl: Labels = labels) -> None:
                out.append(Sample(name, lbl, value))

            if g.util is not None:
                emit("sli:gpu_utilization_ratio", g.util)
            if g.mem_total and g.mem_used is not None:
                emit("sli:gpu_memory_headroom_bytes", g.mem_total - g.mem_used)
                emit("sli:gpu_memory_headroom_ratio", 1.0 - g.mem_used / g.mem_total)
            if g.power_limit and g.power is not None:
                emit("sli:gpu_power_headroom_watts", g.power_limit - g.power)
                emit("sli:gpu_power_headroom_ratio", 1.0 - g.power / g.power_limit)
            if g.reasons is not None:
                active = [r for r in _THROTTLE_ORDER if g.reasons.get(r, 0.0) > 0]
                emit("sli:gpu_throttling", 1.0 if active else 0.0)
                for reason in _THROTTLE_ORDER:
                    emit("sli:gpu_throttle_reason", 1.0 if reason in active else 0.0,
                         make_labels((*labels, ("reason", reason))))
            if k in known:
                queued = pending.get(k, 0.0)
                up = rising.get(k, False)
                emit("sli:gpu_pending_requests", queued)
                emit("sli:gpu_queue_time_rising", 1.0 if up else 0.0)
                if g.util is not None:
                    idle = g.util < self.idle_utilization_below and (queued > 0 or up)
                    emit("sli:gpu_idle_while_queued", 1.0 if idle else 0.0)
        out.extend(placement)
        return out


def gpu_slis(
    nvml_samples: Iterable[Sample],
    triton_samples_by_target: Mapping[str, Iterable[Sample]],
    *,
    idle_utilization_below: float = 0.1,
) -> list[Sample]:
    """One-shot join without history (no "rising queue time"); see ``GpuSliDeriver``."""
    deriver = GpuSliDeriver(idle_utilization_below=idle_utilization_below)
    return deriver.derive(nvml_samples, triton_samples_by_target)
