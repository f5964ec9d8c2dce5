"""Derived SLIs from consecutive snapshots of one Triton target, reset-aware.

``Deriver`` keeps, per target, the last ``(ts, value)`` of every counter series it uses and turns
each new :class:`~schemas.samples.Snapshot` into ``sli:*`` samples for the interval that ends at
``snap.ts``.  Formulas and traps: reference/triton-metrics.md §0, §3, §4, §6, §7.  Every output
name is documented in :data:`SLI_CATALOG`.

How the counters are read (the parts that are easy to get wrong):

* **Resets.**  A counter that went down restarted (server restart, model reload, unload+load):
  its increase is the new value, exactly as Prometheus ``increase()`` does, so a restart never
  yields a negative rate nor a spike.  (A reset that climbs past the old value before the next
  scrape is invisible, as in Prometheus.)
* **Counters below zero.**  A counter sample with a negative value is not a counter value (a
  broken exporter, or a gauge under a counter's name); it is skipped like NaN, neither a delta
  nor a baseline.  Taken as a reset, its "increase" would be the negative value itself, so a
  counter falling below zero gave a negative ``sli:request_rate``.  With this rule every counter
  delta, and every rate derived here, is >= 0.
* **Per series first, then sum.**  Deltas are taken per raw series and only then summed per
  model over ``gpu_uuid``, ``_tag`` labels and any other label except ``model``, ``version`` and
  ``namespace``.  A reset on one ``gpu_uuid`` series therefore cannot corrupt the sum.
* **No rate without a baseline.**  A series seen for the first time, or whose previous sample is
  more than ``max_gap_s`` old, contributes no delta for that interval; a ratio is skipped when
  its denominator did not move.
* **Sources.**  A snapshot may come from ``/metrics``, from the statistics API (families named
  ``triton_stats_*``), or hold both.  State is kept per source; a snapshot replaces the state of
  each source it contains, so series that disappeared are dropped (bounded memory) while the
  other source's state survives for the next alternate snapshot.  A source absent for longer
  than ``max_gap_s`` is forgotten.  When both sources describe the same model in one snapshot,
  the ``/metrics`` counters win for the request-level SLIs (one value per name, labels and ts).
* **Counter spellings.**  prometheus_client renames counter samples to ``<family>_total``; both
  spellings are accepted and share one state key.

Performance: one pass over the samples with one dict lookup per sample name; only samples of
the few families used here go further.  Everything else is aggregated per model afterwards.
The collector's steady state uses :meth:`Deriver.derive_columns` instead, which takes the
payload as a :class:`~collector.shape.Shape` and a value array: everything that depends on
names and labels is worked out once per shape, the counter baselines are kept as arrays
aligned with it, and a scrape is a few numpy operations.  It returns exactly what ``derive``
returns on the same payload, bit for bit (tests/collector/test_derive_columns.py holds it so);
measured on the 2,879-series bench payload: 0.23 ms per scrape instead of 1.0 ms for
``shape.snapshot()`` + ``derive()``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import TYPE_CHECKING, NamedTuple

import numpy as np
import numpy.typing as npt

from tritonwatch.schemas.samples import Labels, Sample, Snapshot, label_value, make_labels
from tritonwatch.schemas.triton import ModelConfigInfo

if TYPE_CHECKING:
    from tritonwatch.collector.shape import Shape, Values

logger = logging.getLogger(__name__)


class SliSpec(NamedTuple):
    unit: str
    labels: tuple[str, ...]
    description: str


_M = ("model", "version", "namespace?")
_G = ("gpu_uuid",)

#: Every SLI this module emits: name → unit, labels (``namespace?`` = only when Triton runs with
#: model namespacing) and meaning.  The README and the dashboard are generated from this table.
SLI_CATALOG: dict[str, SliSpec] = {
    # Request-level, from nv_inference_* (or the stats API when /metrics has none for the model).
    "sli:request_rate": SliSpec("req/s", _M, "Successful requests per second (cache hits in)"),
    "sli:inference_rate": SliSpec("inferences/s", _M, "Inferences (batch items) per second"),
    "sli:execution_rate": SliSpec("executions/s", _M, "Model executions (batches) per second"),
    "sli:failure_rate": SliSpec(
        "req/s",
        (*_M, "reason"),
        "Failed requests per second per reason; reason=ALL when the source has no reason "
        "label (Triton before 24.07, stats API)",
    ),
    "sli:success_ratio": SliSpec("ratio", _M, "Δsuccess / (Δsuccess + ΣΔfailure)"),
    "sli:avg_batch_size": SliSpec("inferences/execution", _M, "Δinference_count / Δexec_count"),
    "sli:batch_fill_rate": SliSpec(
        "ratio", _M, "avg_batch_size / max_batch_size; absent when max_batch_size is 0 or unknown"
    ),
    "sli:requests_per_execution": SliSpec(
        "requests/execution", _M, "Δsuccess / Δexec_count (dynamic-batching effectiveness)"
    ),
    "sli:queue_time_seconds": SliSpec("s", _M, "Average queue time per successful request"),
    "sli:compute_time_seconds": SliSpec(
        "s", _M, "Average compute input+infer+output per request (batch time charged per request)"
    ),
    "sli:request_time_seconds": SliSpec("s", _M, "Average server-side request time"),
    "sli:queue_compute_ratio": SliSpec("ratio", _M, "Δqueue time / Δcompute_infer time"),
    "sli:pending_requests": SliSpec("requests", _M, "Requests queued in Triton (gauge)"),
    "sli:cache_hit_ratio": SliSpec("ratio", _M, "Response cache Δhits / (Δhits + Δmisses)"),
    # TensorRT-LLM gauges (latest executor iteration).
    "sli:kv_cache_utilization": SliSpec("ratio", _M, "KV-cache used / max blocks (or fraction)"),
    "sli:kv_cache_free_blocks": SliSpec("blocks", _M, "Free KV-cache blocks"),
    "sli:kv_cache_reuse_ratio": SliSpec("ratio", _M, "KV-cache reused / used blocks"),
    "sli:inflight_batch_fill": SliSpec("ratio", _M, "In-flight batch scheduled / max requests"),
    "sli:llm_active_requests": SliSpec("requests", _M, "Requests in the TRT-LLM executor"),
    "sli:llm_waiting_requests": SliSpec(
        "requests", _M, "Requests waiting for a batch slot (waiting, else active - scheduled)"
    ),
    "sli:llm_paused_requests": SliSpec("requests", _M, "Paused (preempted) requests"),
    # LLM latency and token throughput.
    "sli:ttft_seconds": SliSpec(
        "s",
        _M,
        "Mean time to first token: Triton's nv_inference_first_response_histogram_ms when the "
        "model has it, else vllm:time_to_first_token_seconds",
    ),
    "sli:itl_seconds": SliSpec("s", _M, "Mean inter-token latency (vLLM)"),
    "sli:e2e_seconds": SliSpec("s", _M, "Mean end-to-end latency of finished requests (vLLM)"),
    "sli:generation_tokens_rate": SliSpec(
        "tokens/s", _M, "Generated tokens per second (vLLM, else TRT-LLM nv_llm_output_token_len)"
    ),
    "sli:prompt_tokens_rate": SliSpec(
        "tokens/s", _M, "Prompt tokens per second (vLLM, else TRT-LLM nv_llm_input_token_len)"
    ),
    # GPU (DCGM inside Triton); a GPU whose gauges all read 0 is a DCGM failure and is skipped.
    "sli:gpu_utilization": SliSpec("ratio", _G, "GPU utilization, 0-1"),
    "sli:gpu_memory_used_ratio": SliSpec("ratio", _G, "GPU memory used / total"),
    "sli:gpu_power_ratio": SliSpec("ratio", _G, "GPU power usage / limit"),
    "sli:gpu_power_watts": SliSpec("W", _G, "GPU power usage"),
    "sli:energy_per_inference_joules": SliSpec(
        "J/inference",
        (),
        "Server-wide ΔΣenergy / ΔΣnv_inference_count (ensembles excluded from the count)",
    ),
    # Statistics API only.
    "sli:preferred_batch_hit_ratio": SliSpec(
        "ratio", _M, "Share of executions whose batch size is a preferred_batch_size"
    ),
    "sli:stats_batch_fill_rate": SliSpec(
        "ratio", _M, "Exact fill rate from batch_stats: ΣΔ(bs·executions)/ΣΔexecutions/max_batch"
    ),
    "sli:gpu_busy_seconds_rate": SliSpec(
        "s/s", _M, "Model execution busy time per second, ΣΔbatch compute_infer (per instance sum)"
    ),
    "sli:server_ttft_seconds": SliSpec("s", _M, "response_stats[0] success time per response"),
    "sli:server_itl_seconds": SliSpec("s", _M, "response_stats[k≥1] success time per response"),
}

# --- the input table ------------------------------------------------------------------------

_METRICS = 0
_STATS = 1

# What a sample feeds.  Small ints keep the per-sample dispatch a cheap comparison chain.
_COUNTER = 0  # model-level counter → _Acc.d[field]
_FAILURE = 1  # model-level counter split by ``reason``
_BATCH_EXEC = 2  # stats counter split by ``batch_size``
_RESP_NS = 3  # stats counter split by response ``index``
_RESP_COUNT = 4
_MODEL_GAUGE = 5  # model-level gauge → _Acc.g[field] (summed)
_TRTLLM_GAUGE = 6  # model-level gauge with a category label → _Acc.g[field + category]
_GPU_GAUGE = 7  # per gpu_uuid gauge
_ENERGY = 8  # per gpu_uuid counter
# The kinds whose values may be below zero; every other kind is a counter.
_GAUGE_KINDS = frozenset({_MODEL_GAUGE, _TRTLLM_GAUGE, _GPU_GAUGE})


class _Role(NamedTuple):
    key: str  # canonical name, the state key (both counter spellings map to one)
    kind: int
    field: str  # accumulator field; for _TRTLLM_GAUGE the category label name
    scale: float  # to seconds (durations) or 1
    source: int


_US = 1e-6
_NS = 1e-9
_MS = 1e-3

# (family, kind, field, scale); counters are registered under both spellings, histograms through
# their ``_sum``/``_count`` samples only (the buckets are left to the store's quantile queries).
_COUNTERS = (
    ("nv_inference_request_success", _COUNTER, "success", 1.0),
    ("nv_inference_request_failure", _FAILURE, "fail", 1.0),
    ("nv_inference_count", _COUNTER, "count", 1.0),
    ("nv_inference_exec_count", _COUNTER, "exec", 1.0),
    ("nv_inference_request_duration_us", _COUNTER, "request_s", _US),
    ("nv_inference_queue_duration_us", _COUNTER, "queue_s", _US),
    ("nv_inference_compute_input_duration_us", _COUNTER, "cin_s", _US),
    ("nv_inference_compute_infer_duration_us", _COUNTER, "cinf_s", _US),
    ("nv_inference_compute_output_duration_us", _COUNTER, "cout_s", _US),
    ("nv_cache_num_hits_per_model", _COUNTER, "cache_hit", 1.0),
    ("nv_cache_num_misses_per_model", _COUNTER, "cache_miss", 1.0),
    ("vllm:prompt_tokens", _COUNTER, "vllm_prompt", 1.0),
    ("vllm:generation_tokens", _COUNTER, "vllm_gen", 1.0),
    ("nv_energy_consumption", _ENERGY, "energy", 1.0),
    ("triton_stats_inference_count", _COUNTER, "count", 1.0),
    ("triton_stats_execution_count", _COUNTER, "exec", 1.0),
    ("triton_stats_success_count", _COUNTER, "success", 1.0),
    ("triton_stats_success_ns", _COUNTER, "request_s", _NS),
    ("triton_stats_fail_count", _FAILURE, "fail", 1.0),
    ("triton_stats_queue_ns", _COUNTER, "queue_s", _NS),
    ("triton_stats_compute_input_ns", _COUNTER, "cin_s", _NS),
    ("triton_stats_compute_infer_ns", _COUNTER, "cinf_s", _NS),
    ("triton_stats_compute_output_ns", _COUNTER, "cout_s", _NS),
    ("triton_stats_cache_hit_count", _COUNTER, "cache_hit", 1.0),
    ("triton_stats_cache_miss_count", _COUNTER, "cache_miss", 1.0),
    ("triton_stats_batch_executions", _BATCH_EXEC, "batch_exec", 1.0),
    ("triton_stats_batch_compute_infer_ns", _COUNTER, "busy_s", _NS),
    ("triton_stats_response_success_count", _RESP_COUNT, "resp_count", 1.0),
    ("triton_stats_response_success_ns", _RESP_NS, "resp_s", _NS),
)
_HISTOGRAMS = (
    ("nv_inference_first_response_histogram_ms", "ttft", _MS),
    ("vllm:time_to_first_token_seconds", "vllm_ttft", 1.0),
    ("vllm:time_per_output_token_seconds", "vllm_itl", 1.0),
    ("vllm:e2e_request_latency_seconds", "vllm_e2e", 1.0),
    ("nv_llm_input_token_len", "trtllm_prompt", 1.0),
    ("nv_llm_output_token_len", "trtllm_gen", 1.0),
)
_GAUGES = (
    ("nv_inference_pending_request_count", _MODEL_GAUGE, "pending"),
    ("nv_trt_llm_kv_cache_block_metrics", _TRTLLM_GAUGE, "kv_cache_block_type"),
    ("nv_trt_llm_request_metrics", _TRTLLM_GAUGE, "request_type"),
    ("nv_trt_llm_inflight_batcher_metrics", _TRTLLM_GAUGE, "inflight_batcher_specific_metric"),
    ("nv_gpu_utilization", _GPU_GAUGE, "util"),
    ("nv_gpu_memory_used_bytes", _GPU_GAUGE, "mem_used"),
    ("nv_gpu_memory_total_bytes", _GPU_GAUGE, "mem_total"),
    ("nv_gpu_power_usage", _GPU_GAUGE, "power"),
    ("nv_gpu_power_limit", _GPU_GAUGE, "power_limit"),
)


def _build_roles() -> dict[str, _Role]:
    roles: dict[str, _Role] = {}
    for family, kind, fld, scale in _COUNTERS:
        src = _STATS if family.startswith("triton_stats_") else _METRICS
        role = _Role(family, kind, fld, scale, src)
        roles[family] = role
        roles[family + "_total"] = role
    for family, fld, scale in _HISTOGRAMS:
        roles[family + "_sum"] = _Role(family + "_sum", _COUNTER, fld + "_sum", scale, _METRICS)
        roles[family + "_count"] = _Role(family + "_count", _COUNTER, fld + "_count", 1.0, _METRICS)
    for family, kind, fld in _GAUGES:
        roles[family] = _Role(family, kind, fld, 1.0, _METRICS)
    return roles


_ROLES = _build_roles()

#: The families ``Deriver.derive`` reads samples of; it skips every other family whole (so a
#: caller may pass those without samples).  A family is named after its samples, or after them
#: less one of these suffixes (in both parsers).  Most of a Triton payload (the per-model
#: summaries, load durations, CPU and memory gauges) is not read at all.
DERIVED_FROM = frozenset(
    set(_ROLES)
    | {
        name.removesuffix(suffix)
        for name in _ROLES
        for suffix in ("_total", "_sum", "_count", "_bucket", "_created")
        if name.endswith(suffix)
    }
)

#: The raw family names this module reads (as collector/metric_map.py spells them).
INPUT_FAMILIES: frozenset[str] = frozenset(
    [f for f, *_ in _COUNTERS if not f.startswith("vllm:")]
    + [f + "_total" for f, *_ in _COUNTERS if f.startswith("vllm:")]
    + [f for f, *_ in _HISTOGRAMS]
    + [f for f, *_ in _GAUGES]
)

# KV-cache sanity: TRT-LLM computes used = max - free, so anything further off than this means
# the positional label values shifted (a missing JSON key, §3) and the numbers are garbage.
_KV_TOLERANCE = 0.05
# ``fraction`` is used/max as TRT-LLM computes it; allow for the gauges being written one by one.
_KV_FRACTION_TOLERANCE = 0.02

# The fields that make a source "have" a model's request-level counters (precedence above).
_CORE_FIELDS = frozenset(
    {"success", "fail", "count", "exec", "request_s", "queue_s", "cin_s", "cinf_s", "cout_s"}
)

ModelKey = tuple[str, str, str | None]  # model, version, namespace
_State = dict[tuple[str, Labels], tuple[float, float]]
_Emit = Callable[[str, float | None], None]


class _Acc:
    """What one pass gathered for one model from one source."""

    __slots__ = ("batch_exec", "d", "dt", "fail", "g", "resp_count", "resp_s", "seen")

    def __init__(self) -> None:
        self.d: dict[str, float] = {}  # summed counter deltas (only fields that had a baseline)
        self.dt = 0.0  # interval length (the longest among the contributing series)
        self.fail: dict[str, float] = {}
        self.batch_exec: dict[int, float] = {}
        self.resp_s: dict[int, float] = {}
        self.resp_count: dict[int, float] = {}
        self.g: dict[str, float] = {}  # gauges, summed over series
        self.seen: set[str] = set()  # fields present in the snapshot, baseline or not


def _model_labels(key: ModelKey) -> Labels:
    model, version, namespace = key
    if namespace is None:
        return (("model", model), ("version", version))
    return (("model", model), ("namespace", namespace), ("version", version))


def _ratio(num: float | None, den: float | None) -> float | None:
    if num is None or den is None or den <= 0:
        return None
    return num / den


_Floats = npt.NDArray[np.float64]
_Ints = npt.NDArray[np.intp]
_Bools = npt.NDArray[np.bool_]

# _Plan slot parts: where a counter slot's sum goes in its _Acc (the kind codes, as it happens).
_PART_OF_KIND = {_COUNTER: 0, _FAILURE: 1, _BATCH_EXEC: 2, _RESP_NS: 3, _RESP_COUNT: 4}


def _ints(items: list[int]) -> _Ints:
    return np.array(items, dtype=np.intp)


def _first_seen_order(ids: _Ints) -> list[int]:
    """The distinct ``ids`` in order of first occurrence."""
    distinct, first = np.unique(ids, return_index=True)
    return [int(i) for i in distinct[np.argsort(first)]]


class _Plan:
    """Everything :meth:`Deriver.derive` works out from a shape's names and labels, done once.

    The samples the deriver reads are split, in exposition order, into GPU gauges, energy
    counters and *model entries* (the samples with a ``model`` label: counters and gauges).
    Each model entry belongs to an accumulator (``acc``: one per source and model key, numbered
    in order of first appearance) and marks a field as seen; each counter entry has a state key
    (``u``: one per distinct ``(role.key, labels)``) and a slot, the accumulator dict entry its
    delta is added to (``-1`` where ``derive`` drops the delta: an unreadable ``batch_size`` or
    ``index`` label).  Slots and gauge keys are numbered in order of first appearance too, so
    when every entry counts, numbering order is ``derive``'s dict insertion order.
    """

    __slots__ = (
        "acc_keys",
        "c_acc",
        "c_pos",
        "c_scale",
        "c_slot",
        "c_u",
        "energy_idx",
        "energy_info",
        "g_pos",
        "g_slot",
        "gauge_keys",
        "gpu_idx",
        "gpu_info",
        "has_dups",
        "has_none_slots",
        "m_acc",
        "m_gauge",
        "m_idx",
        "m_seen",
        "present",
        "seen_keys",
        "seen_static",
        "shape",
        "slot_keys",
        "u_keys",
        "u_src",
    )

    def __init__(self, shape: Shape) -> None:
        self.shape = shape
        present = [False, False]
        gpu_idx: list[int] = []
        self.gpu_info: list[tuple[str, str]] = []  # (gpu_uuid, field)
        energy_idx: list[int] = []
        self.energy_info: list[tuple[str, tuple[str, Labels]]] = []  # (gpu_uuid, state key)
        m_idx: list[int] = []
        m_acc: list[int] = []
        m_seen: list[int] = []
        c_pos: list[int] = []
        c_u: list[int] = []
        c_scale: list[float] = []
        c_slot: list[int] = []
        g_pos: list[int] = []
        g_slot: list[int] = []
        accs: dict[tuple[int, ModelKey], int] = {}
        seen: dict[tuple[int, str], int] = {}
        states: dict[tuple[str, Labels], int] = {}
        self.u_src: list[int] = []
        slots: dict[tuple[int, int, str, int], int] = {}
        gauges: dict[tuple[int, str], int] = {}

        names, all_labels = shape.names, shape.labels
        roles = _ROLES
        for span in shape.spans:
            present[_STATS if span.name.startswith("triton_stats_") else _METRICS] = True
            if span.name not in DERIVED_FROM:
                continue
            for i in range(span.start, span.stop):
                role = roles.get(names[i])
                if role is None:
                    continue
                kind = role.kind
                labels = all_labels[i]
                if kind == _GPU_GAUGE:
                    gpu_idx.append(i)
                    self.gpu_info.append((label_value(labels, "gpu_uuid"), role.field))
                    continue
                if kind == _ENERGY:
                    energy_idx.append(i)
                    self.energy_info.append(
                        (label_value(labels, "gpu_uuid"), (role.key, labels))
                    )
                    continue
                lab = dict(labels)
                model = lab.get("model")
                if model is None:
                    continue
                src = role.source
                fld = role.field
                acc = accs.setdefault(
                    (src, (model, lab.get("version", ""), lab.get("namespace"))), len(accs)
                )
                m_acc.append(acc)
                m_seen.append(seen.setdefault((acc, fld), len(seen)))
                pos = len(m_idx)
                m_idx.append(i)
                if kind == _MODEL_GAUGE or kind == _TRTLLM_GAUGE:
                    key = fld if kind == _MODEL_GAUGE else fld + "=" + lab.get(fld, "")
                    g_pos.append(pos)
                    g_slot.append(gauges.setdefault((acc, key), len(gauges)))
                    continue
                skey = (role.key, labels)
                u = states.get(skey)
                if u is None:
                    u = states[skey] = len(states)
                    self.u_src.append(src)
                c_pos.append(pos)
                c_u.append(u)
                c_scale.append(role.scale)
                if kind == _COUNTER or kind == _FAILURE:
                    name = fld if kind == _COUNTER else lab.get("reason", "ALL")
                    slot_key = (acc, _PART_OF_KIND[kind], name, 0)
                else:
                    index = _int_label(lab, "batch_size" if kind == _BATCH_EXEC else "index")
                    if index is None:
                        c_slot.append(-1)
                        continue
                    slot_key = (acc, _PART_OF_KIND[kind], "", index)
                c_slot.append(slots.setdefault(slot_key, len(slots)))

        self.present = (present[_METRICS], present[_STATS])
        self.gpu_idx = _ints(gpu_idx)
        self.energy_idx = _ints(energy_idx)
        self.m_idx = _ints(m_idx)
        self.m_acc = _ints(m_acc)
        self.m_seen = _ints(m_seen)
        self.c_pos = _ints(c_pos)
        self.c_u = _ints(c_u)
        self.c_scale = np.array(c_scale, dtype=np.float64)
        self.c_slot = _ints(c_slot)
        self.c_acc = self.m_acc[self.c_pos]
        self.g_pos = _ints(g_pos)
        self.g_slot = _ints(g_slot)
        self.m_gauge = np.zeros(len(m_idx), dtype=np.bool_)
        self.m_gauge[self.g_pos] = True
        self.has_dups = len(states) < len(c_u)
        self.has_none_slots = -1 in c_slot
        self.acc_keys: list[tuple[int, ModelKey]] = list(accs)
        self.seen_keys: list[tuple[int, str]] = list(seen)
        self.slot_keys: list[tuple[int, int, str, int]] = list(slots)  # acc, part, key
        self.gauge_keys: list[tuple[int, str]] = list(gauges)
        self.u_keys: list[tuple[str, Labels]] = list(states)
        seen_static: list[set[str]] = [set() for _ in accs]
        for acc, fld in seen:
            seen_static[acc].add(fld)
        self.seen_static = [frozenset(fields) for fields in seen_static]


class _Columns:
    """The counter state of a plan's sources while :meth:`Deriver.derive_columns` owns it.

    ``has[u]``, ``ts[u]``, ``value[u]`` are what ``Deriver._state`` would hold for the plan's
    state key ``u`` (``has`` False: no entry); ``energy`` holds the energy counters' entries as
    they are (few, and kept by ``Deriver._energy_delta`` itself).
    """

    __slots__ = ("energy", "has", "plan", "ts", "value")

    def __init__(self, plan: _Plan, states: list[_State]) -> None:
        self.plan = plan
        n = len(plan.u_keys)
        has = np.zeros(n, dtype=np.bool_)
        ts = np.zeros(n, dtype=np.float64)
        value = np.zeros(n, dtype=np.float64)
        for u, (skey, src) in enumerate(zip(plan.u_keys, plan.u_src, strict=True)):
            prev = states[src].get(skey)
            if prev is not None:
                has[u] = True
                ts[u], value[u] = prev
        self.has: _Bools = has
        self.ts: _Floats = ts
        self.value: _Floats = value
        metrics = states[_METRICS]
        self.energy: _State = {
            skey: metrics[skey] for _, skey in plan.energy_info if skey in metrics
        }

    def tracked(self) -> int:
        return int(np.count_nonzero(self.has)) + len(self.energy)

    def states(self) -> list[_State]:
        """The state as ``Deriver._state`` holds it, for the plan's sources."""
        plan = self.plan
        out: list[_State] = [{}, {}]
        ts, value = self.ts.tolist(), self.value.tolist()
        keys, srcs = plan.u_keys, plan.u_src
        for u in np.flatnonzero(self.has).tolist():
            out[srcs[u]][keys[u]] = (ts[u], value[u])
        out[_METRICS].update(self.energy)
        return out


class Deriver:
    """Turns consecutive snapshots of one target into ``sli:*`` samples.

    Not thread-safe: feed one target's snapshots from one job, in time order.  A snapshot that
    is not newer than a series' last sample yields nothing for that series and keeps its state.
    """

    def __init__(self, target: str, *, max_gap_s: float = 300.0) -> None:
        if not max_gap_s > 0:
            raise ValueError(f"max_gap_s must be > 0, got {max_gap_s!r}")
        self.target = target
        self.max_gap_s = max_gap_s
        self._state: list[_State] = [{}, {}]  # per source: _METRICS, _STATS
        self._last_ts: list[float | None] = [None, None]
        self._kv_bad: set[ModelKey] = set()  # models whose KV gauges were inconsistent last time
        # Models whose request counters (and response-cache counters) /metrics has shown: from
        # then on their request-level SLIs come only from /metrics, never from the stats API.
        self._core_from_metrics: set[ModelKey] = set()
        self._cache_from_metrics: set[ModelKey] = set()
        # derive_columns: the plan of the last shape it saw, and while it owns the counter state
        # of that shape's sources, that state as arrays (self._state holds the rest).
        self._plan: _Plan | None = None
        self._cols: _Columns | None = None

    def tracked_series(self) -> int:
        """How many counter series the state holds (for tests and self-metrics)."""
        cols = self._cols
        if cols is None:
            return len(self._state[0]) + len(self._state[1])
        return cols.tracked() + sum(
            len(self._state[src]) for src in (_METRICS, _STATS) if not cols.plan.present[src]
        )

    def derive(self, snap: Snapshot, configs: Mapping[str, ModelConfigInfo]) -> list[Sample]:
        """The derived samples for the interval ending at ``snap.ts``."""
        ts = snap.ts
        max_gap = self.max_gap_s
        if self._cols is not None:
            self._release_for(snap)
        prev_states = self._state
        new_states: list[_State] = [{}, {}]
        present = [False, False]
        accs: list[dict[ModelKey, _Acc]] = [{}, {}]
        gpus: dict[str, dict[str, float]] = {}
        energy: list[tuple[str, tuple[str, Labels], float]] = []
        roles = _ROLES
        isfinite = math.isfinite

        role_families = DERIVED_FROM
        for family in snap.families:
            present[_STATS if family.name.startswith("triton_stats_") else _METRICS] = True
            if family.name not in role_families:
                continue
            for sample in family.samples:
                role = roles.get(sample.name)
                if role is None:
                    continue
                value = sample.value
                kind = role.kind
                if not isfinite(value) or (value < 0 and kind not in _GAUGE_KINDS):
                    continue  # a counter below zero is no counter value (see the docstring)
                labels = sample.labels
                if kind == _GPU_GAUGE:
                    gpus.setdefault(label_value(labels, "gpu_uuid"), {})[role.field] = value
                    continue
                if kind == _ENERGY:
                    # Deferred: whether this GPU's DCGM reads failed is known only after the pass.
                    gpu = label_value(labels, "gpu_uuid")
                    energy.append((gpu, (role.key, labels), value))
                    continue
                lab = dict(labels)
                model = lab.get("model")
                if model is None:
                    continue
                src = role.source
                mkey = (model, lab.get("version", ""), lab.get("namespace"))
                acc = accs[src].get(mkey)
                if acc is None:
                    acc = accs[src][mkey] = _Acc()
                fld = role.field
                acc.seen.add(fld)
                if kind == _MODEL_GAUGE:
                    acc.g[fld] = acc.g.get(fld, 0.0) + value
                    continue
                if kind == _TRTLLM_GAUGE:
                    cat = fld + "=" + lab.get(fld, "")
                    acc.g[cat] = acc.g.get(cat, 0.0) + value
                    continue

                # A counter: per-series reset-aware delta against the previous snapshot.
                skey = (role.key, labels)
                new = new_states[src]
                if skey in new:  # a duplicated series would otherwise be counted twice
                    continue
                prev = prev_states[src].get(skey)
                new[skey] = (ts, value)
                if prev is None:
                    continue
                dt = ts - prev[0]
                if dt <= 0:
                    new[skey] = prev  # stale or replayed snapshot: keep the newer baseline
                    continue
                if dt > max_gap:
                    continue
                last = prev[1]
                delta = (value - last if value >= last else value) * role.scale
                if dt > acc.dt:
                    acc.dt = dt
                if kind == _COUNTER:
                    acc.d[fld] = acc.d.get(fld, 0.0) + delta
                elif kind == _FAILURE:
                    reason = lab.get("reason", "ALL")
                    acc.fail[reason] = acc.fail.get(reason, 0.0) + delta
                else:
                    index = _int_label(lab, "batch_size" if kind == _BATCH_EXEC else "index")
                    if index is None:
                        continue
                    part = (
                        acc.batch_exec
                        if kind == _BATCH_EXEC
                        else acc.resp_s
                        if kind == _RESP_NS
                        else acc.resp_count
                    )
                    part[index] = part.get(index, 0.0) + delta

        out = self._outputs(
            accs, gpus, energy, prev_states[_METRICS], new_states[_METRICS], ts, configs
        )
        self._end_pass(present, accs[_METRICS].keys(), ts, new_states)
        return out

    def derive_columns(
        self,
        shape: Shape,
        values: Values,
        ts: float,
        configs: Mapping[str, ModelConfigInfo],
    ) -> list[Sample]:
        """Exactly ``derive(shape.snapshot(self.target, ts, values, keep=DERIVED_FROM), configs)``.

        Column-wise: what ``derive`` works out per sample from names and labels (role, model,
        state key, reason, batch size...) is worked out once per shape (:class:`_Plan`, rebuilt
        when another shape arrives), and the counter state of the shape's sources is kept as
        arrays aligned with the plan, so a scrape costs a few numpy operations plus one Python
        step per accumulator entry, not per sample.  Deltas are summed per accumulator entry
        in exposition order starting from 0.0 (``np.bincount`` adds in index order), so every
        value is bit-for-bit the one ``derive`` computes.  Both paths may be mixed freely: the
        arrays are written back to the dict state as soon as ``derive`` needs it.
        """
        plan = self._plan
        if plan is None or plan.shape is not shape:
            self._release()
            plan = self._plan = _Plan(shape)
        cols = self._cols
        if cols is None:
            cols = self._cols = _Columns(plan, self._state)
            for src in (_METRICS, _STATS):
                if plan.present[src]:
                    self._state[src] = {}  # held by cols until released

        accs: list[dict[ModelKey, _Acc]] = [{}, {}]
        m_values = values[plan.m_idx]
        # "finite" reads "usable" below: a finite value, and for a counter one >= 0, as derive()
        # takes them.
        with np.errstate(invalid="ignore"):
            finite = np.isfinite(m_values) & ((m_values >= 0) | plan.m_gauge)
        all_finite = bool(finite.all())

        # Accumulators, in order of their first finite sample, with the fields seen.  Only
        # finite samples write to one, so those without any stay out of ``accs``.
        acc_objs = [_Acc() for _ in plan.acc_keys]
        if all_finite:
            order: range | list[int] = range(len(acc_objs))
            for acc, fields in zip(acc_objs, plan.seen_static, strict=True):
                acc.seen = set(fields)
        else:
            order = _first_seen_order(plan.m_acc[finite])
            for sid in np.unique(plan.m_seen[finite]).tolist():
                a, fld = plan.seen_keys[sid]
                acc_objs[a].seen.add(fld)
        for a in order:
            src, mkey = plan.acc_keys[a]
            accs[src][mkey] = acc_objs[a]

        # Gauges: summed over series in exposition order (dict order is never read).
        if len(plan.g_pos):
            g_values = m_values[plan.g_pos]
            g_slot = plan.g_slot
            if not all_finite:
                g_finite = finite[plan.g_pos]
                g_values, g_slot = g_values[g_finite], g_slot[g_finite]
            n_gauges = len(plan.gauge_keys)
            g_sums = np.bincount(g_slot, weights=g_values, minlength=n_gauges).tolist()
            for gid in np.unique(g_slot).tolist():
                a, key = plan.gauge_keys[gid]
                acc_objs[a].g[key] = g_sums[gid]

        new_has, new_ts, new_value = self._column_counters(
            plan, cols, m_values, finite, all_finite, ts, acc_objs
        )

        gpus: dict[str, dict[str, float]] = {}
        isfinite = math.isfinite
        for (gpu, fld), value in zip(plan.gpu_info, values[plan.gpu_idx].tolist(), strict=True):
            if isfinite(value):
                gpus.setdefault(gpu, {})[fld] = value
        energy = [
            (gpu, skey, value)
            for (gpu, skey), value in zip(
                plan.energy_info, values[plan.energy_idx].tolist(), strict=True
            )
            if isfinite(value) and value >= 0
        ]
        new_energy: _State = {}
        out = self._outputs(accs, gpus, energy, cols.energy, new_energy, ts, configs)

        cols.has, cols.ts, cols.value, cols.energy = new_has, new_ts, new_value, new_energy
        self._end_pass(plan.present, accs[_METRICS].keys(), ts)
        return out

    def _column_counters(
        self,
        plan: _Plan,
        cols: _Columns,
        m_values: _Floats,
        finite: _Bools,
        all_finite: bool,
        ts: float,
        acc_objs: list[_Acc],
    ) -> tuple[_Bools, _Floats, _Floats]:
        """``derive``'s counter step for a whole plan: adds the deltas, returns the new state."""
        values = m_values[plan.c_pos]
        if all_finite and not plan.has_dups:
            # Every counter entry updates its own state key: without duplicates, c_u is
            # 0, 1, 2... (keys are numbered in order of first appearance).
            taken = None
            u, scale, acc, slot = plan.c_u, plan.c_scale, plan.c_acc, plan.c_slot
        else:
            taken = finite[plan.c_pos]
            if plan.has_dups:
                # derive() skips a series whose state key an earlier finite one already set.
                candidates = np.flatnonzero(taken)
                _, first = np.unique(plan.c_u[candidates], return_index=True)
                taken = np.zeros(len(values), dtype=np.bool_)
                taken[candidates[first]] = True
            values = values[taken]
            u, scale = plan.c_u[taken], plan.c_scale[taken]
            acc, slot = plan.c_acc[taken], plan.c_slot[taken]

        had = cols.has[u]
        prev_ts = cols.ts[u]
        prev_value = cols.value[u]
        with np.errstate(all="ignore"):  # Python floats overflow to inf silently too
            dt = ts - prev_ts
            not_newer = dt <= 0
            counts = had & ~not_newer & ~(dt > self.max_gap_s)
            delta = np.where(values >= prev_value, values - prev_value, values) * scale
        # Stale or replayed: keep the newer baseline.
        keep_old = had & not_newer
        kept_ts = np.where(keep_old, prev_ts, ts)
        kept_value = np.where(keep_old, prev_value, values)
        if taken is None:
            new_has = np.ones(len(u), dtype=np.bool_)
            new_ts, new_value = kept_ts, kept_value
        else:
            n = len(plan.u_keys)
            new_has = np.zeros(n, dtype=np.bool_)
            new_ts = np.zeros(n, dtype=np.float64)
            new_value = np.zeros(n, dtype=np.float64)
            new_has[u] = True
            new_ts[u] = kept_ts
            new_value[u] = kept_value

        everything_counts = taken is None and bool(counts.all())
        if not everything_counts:
            if not counts.any():
                return new_has, new_ts, new_value
            dt, acc, slot, delta = dt[counts], acc[counts], slot[counts], delta[counts]
        # acc.dt: the longest interval among the series that gave a delta (fmax: as derive's
        # `dt > acc.dt`, a NaN never wins).
        acc_dt = np.zeros(len(acc_objs), dtype=np.float64)
        np.fmax.at(acc_dt, acc, dt)
        for acc_obj, acc_obj_dt in zip(acc_objs, acc_dt.tolist(), strict=True):
            acc_obj.dt = acc_obj_dt  # 0.0, as derive leaves it, where no series gave a delta

        if plan.has_none_slots:
            summed = slot >= 0
            slot, delta = slot[summed], delta[summed]
        n_slots = len(plan.slot_keys)
        sums = np.bincount(slot, weights=delta, minlength=n_slots).tolist()
        # Dict insertion order is that of each entry's first delta (it orders failure reasons
        # in the output and the terms of sum(acc.fail.values())).
        order: range | list[int] = range(n_slots) if everything_counts else _first_seen_order(slot)
        slot_keys = plan.slot_keys
        for sid in order:
            a, part, name, index = slot_keys[sid]
            target = acc_objs[a]
            if part == 0:
                target.d[name] = sums[sid]
            elif part == 1:
                target.fail[name] = sums[sid]
            elif part == 2:
                target.batch_exec[index] = sums[sid]
            elif part == 3:
                target.resp_s[index] = sums[sid]
            else:
                target.resp_count[index] = sums[sid]
        return new_has, new_ts, new_value

    def _release_for(self, snap: Snapshot) -> None:
        """Hand the column state back to the dicts if ``derive(snap)`` would read or drop it."""
        cols = self._cols
        assert cols is not None
        present = [False, False]
        for family in snap.families:
            present[_STATS if family.name.startswith("triton_stats_") else _METRICS] = True
        for src in (_METRICS, _STATS):
            last_ts = self._last_ts[src]
            expires = last_ts is not None and snap.ts - last_ts > self.max_gap_s
            if cols.plan.present[src] and (present[src] or expires):
                self._release()
                return

    def _release(self) -> None:
        """Write the column state (if any) back to ``self._state``."""
        cols = self._cols
        if cols is None:
            return
        states = cols.states()
        for src in (_METRICS, _STATS):
            if cols.plan.present[src]:
                self._state[src] = states[src]
        self._cols = None

    def _end_pass(
        self,
        present: Sequence[bool],
        metrics_models: Collection[ModelKey],
        ts: float,
        new_states: list[_State] | None = None,
    ) -> None:
        """Source bookkeeping after a pass (either path): present sources take ``ts`` (and
        ``new_states``, where the pass built dict state), absent ones may expire."""
        if present[_METRICS]:
            self._kv_bad.intersection_update(metrics_models)  # forget models that went away
        for src in (_METRICS, _STATS):
            if present[src]:
                if new_states is not None:
                    self._state[src] = new_states[src]
                self._last_ts[src] = ts
            else:
                self._expire(src, ts)

    def _expire(self, src: int, ts: float) -> None:
        """Forget an absent source's state once it is older than ``max_gap_s``."""
        last_ts = self._last_ts[src]
        if last_ts is not None and ts - last_ts > self.max_gap_s:
            # Nothing left in it could ever give a rate again: free it.
            self._state[src] = {}
            self._last_ts[src] = None

    def _outputs(
        self,
        accs: list[dict[ModelKey, _Acc]],
        gpus: dict[str, dict[str, float]],
        energy: list[tuple[str, tuple[str, Labels], float]],
        energy_prev: _State,
        energy_new: _State,
        ts: float,
        configs: Mapping[str, ModelConfigInfo],
    ) -> list[Sample]:
        """The samples of one interval from what a pass gathered (both paths end here)."""
        out: list[Sample] = []
        failed_gpus = self._gpu_slis(gpus, out)
        energy_delta = self._energy_delta(energy, failed_gpus, energy_prev, energy_new, ts)

        metrics_accs, stats_accs = accs
        inference_delta: float | None = None
        # Exposition order, not set order: the same input always gives the same output list.
        model_keys = [*metrics_accs, *(k for k in stats_accs if k not in metrics_accs)]
        for mkey in model_keys:
            m_acc = metrics_accs.get(mkey)
            s_acc = stats_accs.get(mkey)
            config = configs.get(mkey[0])
            self._model_slis(mkey, m_acc, s_acc, config, out)
            if m_acc is not None and "count" in m_acc.d and not _is_ensemble(config):
                inference_delta = (inference_delta or 0.0) + m_acc.d["count"]

        energy_per = _ratio(energy_delta, inference_delta)
        if energy_per is not None and energy_delta:
            out.append(Sample("sli:energy_per_inference_joules", (), energy_per))
        return out

    # --- per-GPU -----------------------------------------------------------------------------

    @staticmethod
    def _gpu_slis(gpus: dict[str, dict[str, float]], out: list[Sample]) -> set[str]:
        failed: set[str] = set()
        for gpu, g in gpus.items():
            # A DCGM read failure sets every gauge to 0 instead of removing it (§0 fact 9):
            # "all zero" is unknown, not an idle GPU with no memory and no power draw.
            if not any(g.values()):
                failed.add(gpu)
                continue
            labels = (("gpu_uuid", gpu),)
            util = g.get("util")
            if util is not None:
                out.append(Sample("sli:gpu_utilization", labels, util))
            mem = _ratio(g.get("mem_used"), g.get("mem_total"))
            if mem is not None:
                out.append(Sample("sli:gpu_memory_used_ratio", labels, mem))
            power = g.get("power")
            if power is not None:
                out.append(Sample("sli:gpu_power_watts", labels, power))
                ratio = _ratio(power, g.get("power_limit"))
                if ratio is not None:
                    out.append(Sample("sli:gpu_power_ratio", labels, ratio))
        return failed

    def _energy_delta(
        self,
        energy: list[tuple[str, tuple[str, Labels], float]],
        failed_gpus: set[str],
        prev_state: _State,
        new: _State,
        ts: float,
    ) -> float | None:
        """ΣΔenergy over all GPUs, or None unless every GPU's counter gave a delta.

        A partial sum would understate joules per inference, so one GPU without a baseline (or
        with failed DCGM reads, whose energy reading is not trusted and not kept as a baseline)
        voids the interval.
        """
        if not energy:
            return None
        total: float | None = 0.0
        for gpu, skey, value in energy:
            if gpu in failed_gpus:
                total = None
                continue
            prev = prev_state.get(skey)
            new[skey] = (ts, value)
            if prev is None:
                total = None
                continue
            dt = ts - prev[0]
            if dt <= 0:
                new[skey] = prev
                total = None
                continue
            if dt > self.max_gap_s:
                total = None
                continue
            if total is not None:
                total += value - prev[1] if value >= prev[1] else value
        return total

    # --- per-model ---------------------------------------------------------------------------

    def _model_slis(
        self,
        mkey: ModelKey,
        m_acc: _Acc | None,
        s_acc: _Acc | None,
        config: ModelConfigInfo | None,
        out: list[Sample],
    ) -> None:
        labels = _model_labels(mkey)

        def emit(name: str, value: float | None) -> None:
            if value is not None:
                out.append(Sample(name, labels, value))

        # Request-level SLIs: /metrics wins when it has the model's counters.  The stats API
        # stands in only for a model /metrics has never shown with them: a target read through
        # both must not interleave two sources (and two intervals) in one series.
        from_metrics = m_acc is not None and not m_acc.seen.isdisjoint(_CORE_FIELDS)
        if from_metrics:
            self._core_from_metrics.add(mkey)
        stand_in = s_acc if mkey not in self._core_from_metrics else None
        core = m_acc if from_metrics else stand_in
        if core is not None:
            self._core_slis(core, config, labels, out)

        if m_acc is not None and "cache_hit" in m_acc.seen:
            self._cache_from_metrics.add(mkey)
        cache = (
            m_acc if mkey in self._cache_from_metrics and m_acc is not None
            else s_acc if mkey not in self._cache_from_metrics else None
        )
        if cache is not None:
            hits = cache.d.get("cache_hit")
            misses = cache.d.get("cache_miss")
            if hits is not None and misses is not None:
                emit("sli:cache_hit_ratio", _ratio(hits, hits + misses))

        if m_acc is not None:
            emit("sli:pending_requests", m_acc.g.get("pending"))
            self._llm_slis(mkey, m_acc, labels, out)

        if s_acc is not None:
            s = s_acc.d
            if s_acc.batch_exec:
                executions = sum(s_acc.batch_exec.values())
                if config is not None and config.preferred_batch_sizes:
                    preferred = set(config.preferred_batch_sizes)
                    hit = sum(n for bs, n in s_acc.batch_exec.items() if bs in preferred)
                    emit("sli:preferred_batch_hit_ratio", _ratio(hit, executions))
                if config is not None and config.max_batch_size > 0:
                    items = sum(bs * n for bs, n in s_acc.batch_exec.items())
                    avg = _ratio(items, executions)
                    if avg is not None:
                        emit("sli:stats_batch_fill_rate", avg / config.max_batch_size)
            if "busy_s" in s and s_acc.dt > 0:
                emit("sli:gpu_busy_seconds_rate", s["busy_s"] / s_acc.dt)
            if s_acc.resp_count:
                first = s_acc.resp_s.get(0)
                emit("sli:server_ttft_seconds", _ratio(first, s_acc.resp_count.get(0)))
                later_count = sum(n for k, n in s_acc.resp_count.items() if k >= 1)
                later_s = sum(n for k, n in s_acc.resp_s.items() if k >= 1)
                if later_count > 0:
                    emit("sli:server_itl_seconds", later_s / later_count)

    @staticmethod
    def _core_slis(
        acc: _Acc, config: ModelConfigInfo | None, labels: Labels, out: list[Sample]
    ) -> None:
        d = acc.d
        dt = acc.dt

        def emit(name: str, value: float | None) -> None:
            if value is not None:
                out.append(Sample(name, labels, value))

        success = d.get("success")
        count = d.get("count")
        execs = d.get("exec")
        if dt > 0:
            for name, fld in (
                ("sli:request_rate", "success"),
                ("sli:inference_rate", "count"),
                ("sli:execution_rate", "exec"),
            ):
                if fld in d:
                    emit(name, d[fld] / dt)
            for reason, failed in acc.fail.items():
                reason_labels = make_labels((*labels, ("reason", reason)))
                out.append(Sample("sli:failure_rate", reason_labels, failed / dt))
        if success is not None and acc.fail:
            emit("sli:success_ratio", _ratio(success, success + sum(acc.fail.values())))
        avg_batch = _ratio(count, execs)
        emit("sli:avg_batch_size", avg_batch)
        # max_batch_size 0 means no batch dimension: every request counts as batch 1 and a fill
        # rate would be meaningless (§0 fact 3); an unknown config gives no denominator either.
        if avg_batch is not None and config is not None and config.max_batch_size > 0:
            emit("sli:batch_fill_rate", avg_batch / config.max_batch_size)
        emit("sli:requests_per_execution", _ratio(success, execs))
        emit("sli:queue_time_seconds", _ratio(d.get("queue_s"), success))
        emit("sli:request_time_seconds", _ratio(d.get("request_s"), success))
        infer = d.get("cinf_s")
        if infer is not None:
            compute = infer + d.get("cin_s", 0.0) + d.get("cout_s", 0.0)
            emit("sli:compute_time_seconds", _ratio(compute, success))
        emit("sli:queue_compute_ratio", _ratio(d.get("queue_s"), infer))

    def _llm_slis(self, mkey: ModelKey, acc: _Acc, labels: Labels, out: list[Sample]) -> None:
        d = acc.d
        g = acc.g

        def emit(name: str, value: float | None) -> None:
            if value is not None:
                out.append(Sample(name, labels, value))

        # Prefer Triton's own TTFT histogram when the model exports it (26.01+ does for every
        # model, vLLM ones included): one source per model keeps the series comparable across
        # backends.  Presence, not movement, decides, so the source never flips between
        # intervals.
        if "ttft_count" in acc.seen:
            emit("sli:ttft_seconds", _ratio(d.get("ttft_sum"), d.get("ttft_count")))
        else:
            emit("sli:ttft_seconds", _ratio(d.get("vllm_ttft_sum"), d.get("vllm_ttft_count")))
        emit("sli:itl_seconds", _ratio(d.get("vllm_itl_sum"), d.get("vllm_itl_count")))
        emit("sli:e2e_seconds", _ratio(d.get("vllm_e2e_sum"), d.get("vllm_e2e_count")))
        if acc.dt > 0:
            for name, vllm, trtllm in (
                ("sli:generation_tokens_rate", "vllm_gen", "trtllm_gen_sum"),
                ("sli:prompt_tokens_rate", "vllm_prompt", "trtllm_prompt_sum"),
            ):
                tokens = d.get(vllm) if vllm in acc.seen else d.get(trtllm)
                if tokens is not None:
                    emit(name, tokens / acc.dt)

        if not g:
            return
        self._kv_slis(mkey, g, emit)

        active = g.get("request_type=active")
        scheduled = g.get("request_type=scheduled")
        max_requests = g.get("request_type=max")
        emit("sli:llm_active_requests", active)
        waiting = g.get("request_type=waiting")
        if waiting is None and active is not None and scheduled is not None:
            # Older TRT-LLM (< v0.18) has no `waiting`; it is defined as active - scheduled.
            waiting = max(active - scheduled, 0.0)
        emit("sli:llm_waiting_requests", waiting)
        if scheduled is not None and max_requests is not None and scheduled <= max_requests:
            # scheduled > max can only be shifted label values: no sample rather than > 100 %.
            emit("sli:inflight_batch_fill", _ratio(scheduled, max_requests))
        emit(
            "sli:llm_paused_requests",
            g.get("inflight_batcher_specific_metric=paused_requests"),
        )

    def _kv_slis(self, mkey: ModelKey, g: dict[str, float], emit: _Emit) -> None:
        used = g.get("kv_cache_block_type=used")
        free = g.get("kv_cache_block_type=free")
        max_blocks = g.get("kv_cache_block_type=max")
        fraction = g.get("kv_cache_block_type=fraction")
        reused = g.get("kv_cache_block_type=reused")
        if used is None and free is None and max_blocks is None and fraction is None:
            return
        utilization = _ratio(used, max_blocks)
        if utilization is None:
            utilization = fraction
        if not _kv_consistent(used, free, max_blocks, fraction, reused, utilization):
            # Label values are positional in the TRT-LLM backend: a missing JSON key shifts them
            # onto the wrong labels (§3).  Garbage that looks like a plausible KV percentage is
            # worse than a gap, so nothing KV-related is emitted for this model.
            if mkey not in self._kv_bad:
                logger.warning(
                    "target %s model %s: inconsistent TRT-LLM KV-cache gauges "
                    "(used=%s free=%s max=%s fraction=%s); KV SLIs skipped",
                    self.target,
                    mkey[0],
                    used,
                    free,
                    max_blocks,
                    fraction,
                )
                self._kv_bad.add(mkey)
            return
        self._kv_bad.discard(mkey)
        emit("sli:kv_cache_utilization", utilization)
        emit("sli:kv_cache_free_blocks", free)
        emit("sli:kv_cache_reuse_ratio", _ratio(reused, used))


def _kv_consistent(
    used: float | None,
    free: float | None,
    max_blocks: float | None,
    fraction: float | None,
    reused: float | None,
    utilization: float | None,
) -> bool:
    if any(v is not None and v < 0 for v in (used, free, max_blocks, fraction, reused)):
        return False
    if utilization is not None and utilization > 1.0 + _KV_FRACTION_TOLERANCE:
        return False
    if used is not None and free is not None and max_blocks is not None:
        tolerance = max(1.0, _KV_TOLERANCE * max_blocks)
        if abs(used + free - max_blocks) > tolerance:
            return False
    if fraction is not None and used is not None and max_blocks:
        if abs(fraction - used / max_blocks) > _KV_FRACTION_TOLERANCE:
            return False
    return True


def _int_label(labels: dict[str, str], name: str) -> int | None:
    try:
        return int(labels[name])
    except (KeyError, ValueError):
        return None


def _is_ensemble(config: ModelConfigInfo | None) -> bool:
    # An ensemble reports its own counters on top of its composing models' (§0 fact 8), so
    # summing it into a server-wide inference count would count every item twice.
    return config is not None and "ensemble" in (config.platform, config.backend)
