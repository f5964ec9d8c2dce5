"""What the deriver reads: the input role tables (data only).

A new input metric family is a row in ``_COUNTERS``, ``_HISTOGRAMS`` or ``_GAUGES`` below (the
accumulation picks it up from :data:`ROLES`).  What it emits, the SLI catalog, stands beside the
formulas (:mod:`collector.derive.formulas`), so that a new SLI is one change in one file.
Formulas and traps: reference/triton-metrics.md §0, §3, §4, §6, §7.
"""

from __future__ import annotations

from typing import NamedTuple

from tritonwatch.schemas.samples import Labels

# --- the input table ------------------------------------------------------------------------

# The two sources a snapshot's families may come from: Triton's /metrics text and the
# statistics API (families named ``triton_stats_*``).  Each has its own counter state.
METRICS = 0
STATS = 1
SOURCES = (METRICS, STATS)
STATS_PREFIX = "triton_stats_"


def source_of(family: str) -> int:
    return STATS if family.startswith(STATS_PREFIX) else METRICS


# What a sample feeds.  Small ints keep the per-sample dispatch a cheap comparison chain.
COUNTER = 0  # model-level counter → Acc.d[field]
FAILURE = 1  # model-level counter split by ``reason``
BATCH_EXEC = 2  # stats counter split by ``batch_size``
RESP_NS = 3  # stats counter split by response ``index``
RESP_COUNT = 4
MODEL_GAUGE = 5  # model-level gauge → Acc.g[field] (summed)
TRTLLM_GAUGE = 6  # model-level gauge with a category label → Acc.g[field + category]
GPU_GAUGE = 7  # per gpu_uuid gauge
ENERGY = 8  # per gpu_uuid counter
# The kinds whose values may be below zero; every other kind is a counter.
GAUGE_KINDS = frozenset({MODEL_GAUGE, TRTLLM_GAUGE, GPU_GAUGE})


class Role(NamedTuple):
    key: str  # canonical name, the state key (both counter spellings map to one)
    kind: int
    field: str  # accumulator field; for TRTLLM_GAUGE the category label name
    scale: float  # to seconds (durations) or 1
    source: int


# Durations are read in seconds: Triton names its counters after their unit.
_SCALE_OF_UNIT = {"_us": 1e-6, "_ns": 1e-9, "_ms": 1e-3}


def _scale(family: str) -> float:
    return _SCALE_OF_UNIT.get(family[-3:], 1.0)


# (field, kind, /metrics family, statistics-API family): one row per quantity, both sources'
# names side by side ("" where a source has none); data, so its rows look alike by nature.
# Counters are registered under both spellings; histograms (below) through their
# ``_sum``/``_count`` samples only (the buckets are left to the store's quantile queries).
_COUNTERS = (
    ("success", COUNTER, "nv_inference_request_success", "triton_stats_success_count"),
    ("fail", FAILURE, "nv_inference_request_failure", "triton_stats_fail_count"),
    ("count", COUNTER, "nv_inference_count", "triton_stats_inference_count"),
    ("exec", COUNTER, "nv_inference_exec_count", "triton_stats_execution_count"),
    ("request_s", COUNTER, "nv_inference_request_duration_us", "triton_stats_success_ns"),
    ("queue_s", COUNTER, "nv_inference_queue_duration_us", "triton_stats_queue_ns"),
    ("cin_s", COUNTER, "nv_inference_compute_input_duration_us", "triton_stats_compute_input_ns"),
    ("cinf_s", COUNTER, "nv_inference_compute_infer_duration_us", "triton_stats_compute_infer_ns"),
    ("cout_s", COUNTER, "nv_inference_compute_output_duration_us",
     "triton_stats_compute_output_ns"),
    ("cache_hit", COUNTER, "nv_cache_num_hits_per_model", "triton_stats_cache_hit_count"),
    ("cache_miss", COUNTER, "nv_cache_num_misses_per_model", "triton_stats_cache_miss_count"),
    ("vllm_prompt", COUNTER, "vllm:prompt_tokens", ""),
    ("vllm_gen", COUNTER, "vllm:generation_tokens", ""),
    ("energy", ENERGY, "nv_energy_consumption", ""),
    ("batch_exec", BATCH_EXEC, "", "triton_stats_batch_executions"),
    ("busy_s", COUNTER, "", "triton_stats_batch_compute_infer_ns"),
    ("resp_count", RESP_COUNT, "", "triton_stats_response_success_count"),
    ("resp_s", RESP_NS, "", "triton_stats_response_success_ns"),
)
# (family, field): the histograms' _sum is scaled to seconds, their _count is a count.
_HISTOGRAMS = (
    ("nv_inference_first_response_histogram_ms", "ttft"),
    ("vllm:time_to_first_token_seconds", "vllm_ttft"),
    ("vllm:time_per_output_token_seconds", "vllm_itl"),
    ("vllm:e2e_request_latency_seconds", "vllm_e2e"),
    ("nv_llm_input_token_len", "trtllm_prompt"),
    ("nv_llm_output_token_len", "trtllm_gen"),
)
_GAUGES = (
    ("nv_inference_pending_request_count", MODEL_GAUGE, "pending"),
    ("nv_trt_llm_kv_cache_block_metrics", TRTLLM_GAUGE, "kv_cache_block_type"),
    ("nv_trt_llm_request_metrics", TRTLLM_GAUGE, "request_type"),
    ("nv_trt_llm_inflight_batcher_metrics", TRTLLM_GAUGE, "inflight_batcher_specific_metric"),
    ("nv_gpu_utilization", GPU_GAUGE, "util"),
    ("nv_gpu_memory_used_bytes", GPU_GAUGE, "mem_used"),
    ("nv_gpu_memory_total_bytes", GPU_GAUGE, "mem_total"),
    ("nv_gpu_power_usage", GPU_GAUGE, "power"),
    ("nv_gpu_power_limit", GPU_GAUGE, "power_limit"),
)


def _build_roles() -> dict[str, Role]:
    roles: dict[str, Role] = {}
    for fld, kind, *families in _COUNTERS:
        for family in families:
            if family:
                role = Role(family, kind, fld, _scale(family), source_of(family))
                roles[family] = role
                roles[family + "_total"] = role
    for family, fld in _HISTOGRAMS:
        roles[family + "_sum"] = Role(family + "_sum", COUNTER, fld + "_sum", _scale(family),
                                      METRICS)
        roles[family + "_count"] = Role(family + "_count", COUNTER, fld + "_count", 1.0, METRICS)
    for family, kind, fld in _GAUGES:
        roles[family] = Role(family, kind, fld, 1.0, METRICS)
    return roles


ROLES = _build_roles()

#: The families the deriver reads samples of; it skips every other family whole (so a caller
#: may pass those without samples).  A family is named after its samples, or after them less
#: one of these suffixes (in both parsers).  Most of a Triton payload (the per-model summaries,
#: load durations, CPU and memory gauges) is not read at all.
DERIVED_FROM = frozenset(
    set(ROLES)
    | {
        name.removesuffix(suffix)
        for name in ROLES
        for suffix in ("_total", "_sum", "_count", "_bucket", "_created")
        if name.endswith(suffix)
    }
)

#: The raw family names this module reads (as collector/metric_map.py spells them).
INPUT_FAMILIES: frozenset[str] = frozenset(
    [f for _, _, *fs in _COUNTERS for f in fs if f and not f.startswith("vllm:")]
    + [f + "_total" for _, _, f, _ in _COUNTERS if f.startswith("vllm:")]
    + [f for f, _ in _HISTOGRAMS]
    + [f for f, *_ in _GAUGES]
)

# The fields that make a source "have" a model's request-level counters: from then on /metrics
# wins for that model's request-level SLIs (see Deriver).
CORE_FIELDS = frozenset(
    {"success", "fail", "count", "exec", "request_s", "queue_s", "cin_s", "cinf_s", "cout_s"}
)

ModelKey = tuple[str, str, str | None]  # model, version, namespace
StateKey = tuple[str, Labels]  # (role.key, labels): one counter series
