"""GPU SLIs that join NVML's view of a GPU with Triton's view of the models running on it.

The join key is the GPU UUID: NVML's ``gpu_uuid`` (or ``mig_uuid`` for a MIG instance) equals
the ``gpu_uuid`` label Triton puts on its ``nv_gpu_*`` series and on the raw ``nv_inference_*``
series of KIND_GPU model instances.  UUIDs are compared case-insensitively.

Inputs, each the latest reading:

* ``nvml_samples``: what ``NvmlCollector.collect()`` returned (may be empty: no NVML here);
* ``triton_samples_by_target``: per Triton target, its raw samples plus the Deriver's SLIs of
  its latest scrape (``sli:pending_requests``, ``sli:queue_time_seconds``).

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

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from collector.derive import SliSpec
from collector.nvml import CLOCK_EVENT_REASONS, THROTTLE_REASONS
from schemas.samples import Labels, Sample, label_value, make_labels

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
        if mig:
            if name == "nvml_mig_utilization_ratio":
                gpu.util = value
            elif name == "nvml_mig_memory_used_bytes":
                gpu.mem_used = value
            elif name == "nvml_mig_memory_total_bytes":
                gpu.mem_total = value
            continue
        if name == "nvml_gpu_utilization_ratio":
            gpu.util = value
        elif name == "nvml_gpu_memory_used_bytes":
            gpu.mem_used = value
        elif name == "nvml_gpu_memory_total_bytes":
            gpu.mem_total = value
        elif name == "nvml_gpu_power_watts":
            gpu.power = value
        elif name == "nvml_gpu_power_limit_watts":
            gpu.power_limit = value
        elif name == "nvml_gpu_clocks_event_active":
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


def _triton_view(samples: Iterable[Sample]) -> _TritonTarget:
    view = _TritonTarget()
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
            if name == "nv_inference_pending_request_count":
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


class GpuSliDeriver:
    """Joins NVML and Triton per GPU; remembers queue times so it can tell "rising"."""

    def __init__(self, *, idle_utilization_below: float = 0.1,
                 queue_time_rise_min_s: float = 0.001) -> None:
        self.idle_utilization_below = idle_utilization_below
        self.queue_time_rise_min_s = queue_time_rise_min_s
        self._previous_queue_time: dict[tuple[str, ModelKey], float] = {}

    def derive(
        self,
        nvml_samples: Iterable[Sample],
        triton_samples_by_target: Mapping[str, Iterable[Sample]],
    ) -> list[Sample]:
        nvml = _nvml_view(nvml_samples)
        targets = {name: _triton_view(s) for name, s in triton_samples_by_target.items()}

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
