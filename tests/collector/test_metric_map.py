"""collector/metric_map.py: the map covers what Triton emits and only names documented families.

Recorded fixtures will be added later; until then the payload's family names are written out
here, the way a Triton 25.x server with KIND_GPU models, a TRT-LLM model and a vLLM model plus
the opt-in summaries/histogram exposes them.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tritonwatch.collector.metric_map import METRIC_MAP, lookup, unmapped

_REPO = Path(__file__).resolve().parents[2]
# A copy of the shared reference kept in the repository, so the check runs in any clone.
_REFERENCE = _REPO / "docs" / "reference" / "triton-metrics.md"

CORE = [
    "nv_inference_request_success",
    "nv_inference_request_failure",
    "nv_inference_count",
    "nv_inference_exec_count",
    "nv_inference_request_duration_us",
    "nv_inference_queue_duration_us",
    "nv_inference_compute_input_duration_us",
    "nv_inference_compute_infer_duration_us",
    "nv_inference_compute_output_duration_us",
    "nv_inference_pending_request_count",
    "nv_model_load_duration_secs",
    "nv_inference_request_summary_us",
    "nv_inference_queue_summary_us",
    "nv_inference_compute_input_summary_us",
    "nv_inference_compute_infer_summary_us",
    "nv_inference_compute_output_summary_us",
    "nv_inference_first_response_histogram_ms",
    "nv_cache_num_hits_per_model",
    "nv_cache_num_misses_per_model",
    "nv_cache_hit_duration_per_model",
    "nv_cache_miss_duration_per_model",
    "nv_cache_util",
    "nv_cache_num_entries",
    "nv_cache_num_hits",
    "nv_cache_num_misses",
    "nv_cache_num_lookups",
    "nv_cache_num_evictions",
    "nv_cache_lookup_duration",
    "nv_cache_insertion_duration",
    "nv_cpu_utilization",
    "nv_cpu_memory_total_bytes",
    "nv_cpu_memory_used_bytes",
    "nv_pinned_memory_pool_total_bytes",
    "nv_pinned_memory_pool_used_bytes",
]
GPU = [
    "nv_gpu_utilization",
    "nv_gpu_memory_total_bytes",
    "nv_gpu_memory_used_bytes",
    "nv_gpu_power_usage",
    "nv_gpu_power_limit",
    "nv_energy_consumption",
]
TRTLLM = [
    "nv_trt_llm_request_metrics",
    "nv_trt_llm_runtime_memory_metrics",
    "nv_trt_llm_kv_cache_block_metrics",
    "nv_trt_llm_inflight_batcher_metrics",
    "nv_trt_llm_general_metrics",
    "nv_trt_llm_disaggregated_serving_metrics",
    "nv_llm_input_token_len",
    "nv_llm_output_token_len",
]
# prometheus_client reports counter families without ``_total``.
VLLM = [
    "vllm:prompt_tokens",
    "vllm:generation_tokens",
    "vllm:time_to_first_token_seconds",
    "vllm:time_per_output_token_seconds",
    "vllm:e2e_request_latency_seconds",
    "vllm:request_prompt_tokens",
    "vllm:request_generation_tokens",
    "vllm:request_params_n",
]
PAYLOAD_FAMILIES = CORE + GPU + TRTLLM + VLLM


def _documented_names(text: str) -> set[str]:
    """Every back-quoted name in the reference, with ``a_{x,y}_b`` shorthand expanded."""
    names: set[str] = set()
    for token in re.findall(r"`([^`\s]+)`", text):
        expanded = [token]
        while any("{" in t for t in expanded):
            nxt: list[str] = []
            for t in expanded:
                m = re.search(r"\{([^{}]*)\}", t)
                if m is None:
                    nxt.append(t)
                    continue
                nxt += [t[: m.start()] + alt + t[m.end() :] for alt in m.group(1).split(",")]
            expanded = nxt
        names.update(expanded)
    return names


def test_realistic_payload_has_no_unmapped_family() -> None:
    assert unmapped(PAYLOAD_FAMILIES) == set()


def test_unknown_custom_families_are_reported() -> None:
    # Python models may register anything (§2.5); the map must not pretend to know it.
    assert unmapped(["input_byte_size_counter", "nv_gpu_utilization"]) == {
        "input_byte_size_counter"
    }


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("vllm:prompt_tokens", "counter"),
        ("vllm:prompt_tokens_total", "counter"),
        ("nv_inference_count_total", "counter"),
        ("nv_inference_count", "counter"),
        ("nv_gpu_memory_total_bytes", "gauge"),
        ("nv_cache_num_hits", "gauge"),
        ("nv_energy_consumption", "counter"),
        ("nv_trt_llm_disaggregated_serving_metrics", "counter"),
        ("nv_inference_first_response_histogram_ms", "histogram"),
        ("nv_inference_queue_summary_us", "summary"),
    ],
)
def test_lookup_accepts_both_counter_spellings_and_knows_the_odd_kinds(
    name: str, kind: str
) -> None:
    spec = lookup(name)
    assert spec is not None
    assert spec.kind == kind


def test_every_entry_is_well_formed() -> None:
    for name, spec in METRIC_MAP.items():
        assert spec.kind in {"counter", "gauge", "histogram", "summary"}, name
        assert spec.group in {"core", "gpu", "cpu", "trtllm", "vllm", "cache", "stats"}, name
        assert spec.unit and spec.description, name
        assert (spec.group == "stats") == name.startswith("triton_stats_"), name


def test_every_mapped_triton_family_is_named_in_the_reference() -> None:
    documented = _documented_names(_REFERENCE.read_text(encoding="utf-8"))
    # The stats pseudo-families are ours (collector/triton.py), not Triton's.
    missing = {n for n, spec in METRIC_MAP.items() if spec.group != "stats"} - documented
    assert missing == set()
