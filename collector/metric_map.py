"""What every Triton family means: the metric map, kept as data.

``METRIC_MAP`` classifies each raw family Triton (core, TensorRT-LLM backend, vLLM backend) can
expose on ``:8002/metrics``, plus the ``triton_stats_*`` pseudo-families that
``collector/triton.py`` builds from the statistics extension JSON.  Each entry gives the
canonical kind, the unit, a group (for dashboards and capability detection) and one line of
meaning.  Sources: reference/triton-metrics.md §2-§4 and §6.

The map only classifies.  The collector keeps unknown families as they are (backends and Python
models may register any name, see §2.5); :func:`unmapped` exists so that a new family in a
recorded payload is noticed by a test instead of silently ignored.

Keys are the names as Triton *exposes* them.  prometheus_client's parser renames counters
(``vllm:prompt_tokens_total`` becomes family ``vllm:prompt_tokens``; ``nv_inference_count``
keeps its family name but gets ``_total`` samples), so :func:`lookup` accepts both spellings.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal, NamedTuple

Kind = Literal["counter", "gauge", "histogram", "summary"]
Group = Literal["core", "gpu", "cpu", "trtllm", "vllm", "cache", "stats"]


class MetricSpec(NamedTuple):
    kind: Kind
    unit: str
    group: Group
    description: str


def _m(kind: Kind, unit: str, group: Group, description: str) -> MetricSpec:
    return MetricSpec(kind, unit, group, description)


METRIC_MAP: dict[str, MetricSpec] = {
    # --- core per-model request families (§2.1); labels model, version [+namespace, gpu_uuid,
    # _tag]; the latency counters are cumulative microseconds, charged per request.
    "nv_inference_request_success": _m(
        "counter", "requests", "core", "Successful requests (cache hits included)"
    ),
    "nv_inference_request_failure": _m(
        "counter", "requests", "core", "Failed requests, per reason since 24.07"
    ),
    "nv_inference_count": _m(
        "counter", "inferences", "core", "Inferences (batch items), cache hits excluded"
    ),
    "nv_inference_exec_count": _m(
        "counter", "executions", "core", "Batch executions, cache hits excluded"
    ),
    "nv_inference_request_duration_us": _m(
        "counter", "us", "core", "Cumulative end-to-end request time inside Triton"
    ),
    "nv_inference_queue_duration_us": _m(
        "counter", "us", "core", "Cumulative scheduler queue time"
    ),
    "nv_inference_compute_input_duration_us": _m(
        "counter", "us", "core", "Cumulative input preparation time (per-request attribution)"
    ),
    "nv_inference_compute_infer_duration_us": _m(
        "counter", "us", "core", "Cumulative model execution time (per-request attribution)"
    ),
    "nv_inference_compute_output_duration_us": _m(
        "counter", "us", "core", "Cumulative output extraction time (per-request attribution)"
    ),
    "nv_inference_pending_request_count": _m(
        "gauge", "requests", "core", "Requests queued in core, not yet executing"
    ),
    "nv_model_load_duration_secs": _m("gauge", "s", "core", "Duration of the last model load"),
    # Removed in 20.06 but still emitted by old servers and queried by old NVIDIA dashboards.
    "nv_inference_compute_duration_us": _m(
        "counter", "us", "core", "Legacy (18.11-20.05) cumulative compute time"
    ),
    "nv_inference_load_ratio": _m(
        "histogram", "ratio", "core", "Legacy (18.11-20.05) request/compute time ratio"
    ),
    # --- opt-in latency summaries and the TTFT histogram (§2.2).
    "nv_inference_request_summary_us": _m(
        "summary", "us", "core", "Request duration quantiles (summary_latencies=true)"
    ),
    "nv_inference_queue_summary_us": _m("summary", "us", "core", "Queue time quantiles"),
    "nv_inference_compute_input_summary_us": _m(
        "summary", "us", "core", "Compute input time quantiles"
    ),
    "nv_inference_compute_infer_summary_us": _m(
        "summary", "us", "core", "Compute infer time quantiles"
    ),
    "nv_inference_compute_output_summary_us": _m(
        "summary", "us", "core", "Compute output time quantiles"
    ),
    "nv_inference_first_response_histogram_ms": _m(
        "histogram", "ms", "core", "Request start to first response (TTFT for streaming)"
    ),
    # --- response cache (§2.3): per-model counters and summaries, server-wide gauges.
    "nv_cache_num_hits_per_model": _m("counter", "count", "cache", "Per-model cache hits"),
    "nv_cache_num_misses_per_model": _m("counter", "count", "cache", "Per-model cache misses"),
    "nv_cache_hit_duration_per_model": _m(
        "counter", "us", "cache", "Cumulative lookup+copy time on hits"
    ),
    "nv_cache_miss_duration_per_model": _m(
        "counter", "us", "cache", "Cumulative lookup+insert time on misses"
    ),
    # Pre-23.03 names of the two duration counters above.
    "nv_cache_hit_lookup_duration_per_model": _m(
        "counter", "us", "cache", "Legacy (22.02-23.02) hit lookup time"
    ),
    "nv_cache_miss_lookup_duration_per_model": _m(
        "counter", "us", "cache", "Legacy (22.03-23.02) miss lookup time"
    ),
    "nv_cache_miss_insertion_duration_per_model": _m(
        "counter", "us", "cache", "Legacy (22.03-23.02) miss insertion time"
    ),
    "nv_cache_hit_summary_per_model": _m("summary", "us", "cache", "Cache hit time quantiles"),
    "nv_cache_miss_summary_per_model": _m("summary", "us", "cache", "Cache miss time quantiles"),
    # The local cache reports even its counts as gauges (custom-metrics API, polled per interval).
    "nv_cache_util": _m("gauge", "ratio", "cache", "Local cache utilization"),
    "nv_cache_num_entries": _m("gauge", "count", "cache", "Local cache entries"),
    "nv_cache_num_hits": _m("gauge", "count", "cache", "Local cache hits (a gauge)"),
    "nv_cache_num_misses": _m("gauge", "count", "cache", "Local cache misses (a gauge)"),
    "nv_cache_num_lookups": _m("gauge", "count", "cache", "Local cache lookups (a gauge)"),
    "nv_cache_num_evictions": _m("gauge", "count", "cache", "Local cache evictions (a gauge)"),
    "nv_cache_lookup_duration": _m("gauge", "us", "cache", "Local cache total lookup time"),
    "nv_cache_insertion_duration": _m("gauge", "us", "cache", "Local cache total insertion time"),
    # --- GPU from DCGM (§2.4): label gpu_uuid only; a read failure reads 0, not absent.
    "nv_gpu_utilization": _m("gauge", "ratio", "gpu", "GPU utilization, 0.0-1.0"),
    "nv_gpu_memory_total_bytes": _m("gauge", "bytes", "gpu", "GPU framebuffer total"),
    "nv_gpu_memory_used_bytes": _m("gauge", "bytes", "gpu", "GPU framebuffer used"),
    "nv_gpu_power_usage": _m("gauge", "W", "gpu", "Instantaneous GPU power"),
    "nv_gpu_power_limit": _m("gauge", "W", "gpu", "GPU power management limit"),
    "nv_energy_consumption": _m("counter", "J", "gpu", "GPU energy since Triton started"),
    # --- host CPU and pinned memory (§2.4): no labels at all.
    "nv_cpu_utilization": _m("gauge", "ratio", "cpu", "Host CPU utilization, 0.0-1.0"),
    "nv_cpu_memory_total_bytes": _m("gauge", "bytes", "cpu", "Host memory total"),
    "nv_cpu_memory_used_bytes": _m("gauge", "bytes", "cpu", "Host memory used"),
    "nv_pinned_memory_pool_total_bytes": _m("gauge", "bytes", "cpu", "Pinned memory pool size"),
    "nv_pinned_memory_pool_used_bytes": _m("gauge", "bytes", "cpu", "Pinned memory pool used"),
    # --- TensorRT-LLM backend (§3): gauges of the latest executor iteration, one category label
    # each; values are positional, so a missing key shifts them onto the wrong labels.
    "nv_trt_llm_request_metrics": _m(
        "gauge", "requests", "trtllm", "Executor requests by request_type"
    ),
    "nv_trt_llm_runtime_memory_metrics": _m(
        "gauge", "bytes", "trtllm", "TRT-LLM runtime memory by memory_type"
    ),
    "nv_trt_llm_kv_cache_block_metrics": _m(
        "gauge", "blocks", "trtllm", "KV-cache blocks by kv_cache_block_type"
    ),
    "nv_trt_llm_inflight_batcher_metrics": _m(
        "gauge", "count", "trtllm", "In-flight batcher per-iteration figures"
    ),
    "nv_trt_llm_v1_metrics": _m("gauge", "count", "trtllm", "V1 (static) batcher figures"),
    "nv_trt_llm_general_metrics": _m(
        "gauge", "count", "trtllm", "Iteration counter and timestamp (s, later us)"
    ),
    "nv_trt_llm_disaggregated_serving_metrics": _m(
        "counter", "count", "trtllm", "KV transfer ms and request count (disaggregated)"
    ),
    "nv_llm_input_token_len": _m("histogram", "tokens", "trtllm", "Input tokens per request"),
    "nv_llm_output_token_len": _m("histogram", "tokens", "trtllm", "Output tokens per request"),
    # --- vLLM backend for Triton (§4): counters and histograms only, seconds.
    "vllm:prompt_tokens_total": _m("counter", "tokens", "vllm", "Prefill tokens processed"),
    "vllm:generation_tokens_total": _m("counter", "tokens", "vllm", "Generated tokens"),
    "vllm:time_to_first_token_seconds": _m("histogram", "s", "vllm", "Time to first token"),
    "vllm:time_per_output_token_seconds": _m(
        "histogram", "s", "vllm", "Per-token latency (ITL with the V1 engine)"
    ),
    "vllm:e2e_request_latency_seconds": _m(
        "histogram", "s", "vllm", "End-to-end latency per finished request"
    ),
    "vllm:request_prompt_tokens": _m("histogram", "tokens", "vllm", "Prompt tokens per request"),
    "vllm:request_generation_tokens": _m(
        "histogram", "tokens", "vllm", "Generated tokens per request"
    ),
    "vllm:request_params_n": _m("histogram", "count", "vllm", "The n request parameter"),
    "vllm:request_params_best_of": _m(
        "histogram", "count", "vllm", "The best_of request parameter (removed in 25.01)"
    ),
    # --- statistics-extension pseudo-families (§6), built by collector/triton.py; labels model,
    # version (+ batch_size or index); cumulative since load, durations in nanoseconds.
    "triton_stats_inference_count": _m("counter", "inferences", "stats", "inference_count"),
    "triton_stats_execution_count": _m("counter", "executions", "stats", "execution_count"),
    "triton_stats_success_count": _m("counter", "requests", "stats", "inference_stats.success"),
    "triton_stats_success_ns": _m("counter", "ns", "stats", "inference_stats.success.ns"),
    "triton_stats_fail_count": _m("counter", "requests", "stats", "inference_stats.fail"),
    "triton_stats_fail_ns": _m("counter", "ns", "stats", "inference_stats.fail.ns"),
    "triton_stats_queue_ns": _m("counter", "ns", "stats", "inference_stats.queue.ns"),
    "triton_stats_compute_input_ns": _m(
        "counter", "ns", "stats", "inference_stats.compute_input.ns"
    ),
    "triton_stats_compute_infer_ns": _m(
        "counter", "ns", "stats", "inference_stats.compute_infer.ns"
    ),
    "triton_stats_compute_output_ns": _m(
        "counter", "ns", "stats", "inference_stats.compute_output.ns"
    ),
    "triton_stats_cache_hit_count": _m("counter", "count", "stats", "inference_stats.cache_hit"),
    "triton_stats_cache_miss_count": _m("counter", "count", "stats", "inference_stats.cache_miss"),
    "triton_stats_batch_executions": _m(
        "counter", "executions", "stats", "batch_stats[batch_size].compute_infer.count"
    ),
    "triton_stats_batch_compute_infer_ns": _m(
        "counter", "ns", "stats", "batch_stats[batch_size].compute_infer.ns"
    ),
    "triton_stats_response_success_count": _m(
        "counter", "responses", "stats", "response_stats[index].success.count"
    ),
    "triton_stats_response_success_ns": _m(
        "counter", "ns", "stats", "response_stats[index].success.ns"
    ),
}


def lookup(family: str) -> MetricSpec | None:
    """The spec of a family under either spelling of a counter (with or without ``_total``)."""
    spec = METRIC_MAP.get(family)
    if spec is None:
        # prometheus_client strips ``_total`` from counter family names and adds it to their
        # sample names, so a family may arrive under either spelling.
        if family.endswith("_total"):
            spec = METRIC_MAP.get(family[:-6])
        else:
            spec = METRIC_MAP.get(family + "_total")
    return spec


def unmapped(families: Iterable[str]) -> set[str]:
    """The family names in ``families`` that the map does not classify."""
    return {name for name in families if lookup(name) is None}
