"""collector/derive: every SLI against hand-computed values, and the reset/gap/churn traps.

Snapshots are built from ``Sample``/``MetricFamily`` directly (no parser), in the two spellings a
parser may produce for counters (``nv_inference_count`` or prometheus_client's
``nv_inference_count_total``).
"""

from __future__ import annotations

import itertools
import logging
import math
from collections import defaultdict
from collections.abc import Mapping
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tritonwatch.collector.derive import INPUT_FAMILIES, SLI_CATALOG, Deriver
from tritonwatch.collector.metric_map import METRIC_MAP
from tritonwatch.schemas.samples import Labels, MetricFamily, Sample, Snapshot, make_labels
from tritonwatch.schemas.triton import ModelConfigInfo

M1 = {"model": "resnet", "version": "1"}
CONFIGS = {
    "resnet": ModelConfigInfo(name="resnet", max_batch_size=8, preferred_batch_sizes=(4, 8)),
    "nobatch": ModelConfigInfo(name="nobatch", max_batch_size=0),
    "llm": ModelConfigInfo(name="llm", max_batch_size=64, decoupled=True),
    "ens": ModelConfigInfo(name="ens", max_batch_size=8, platform="ensemble"),
}


def s(name: str, value: float, labels: Mapping[str, str] | None = None, **more: str) -> Sample:
    return Sample(name, make_labels({**(labels or {}), **more}), float(value))


def snap(ts: float, samples: list[Sample], target: str = "t1") -> Snapshot:
    """One family per sample name, as a parser would group them (histogram parts aside)."""
    by_name: dict[str, list[Sample]] = defaultdict(list)
    for sample in samples:
        by_name[sample.name].append(sample)
    families = tuple(
        MetricFamily(name, "untyped", "", tuple(group)) for name, group in by_name.items()
    )
    return Snapshot(target, ts, families)


def index(out: list[Sample]) -> dict[tuple[str, Labels], float]:
    result: dict[tuple[str, Labels], float] = {}
    for sample in out:
        key = (sample.name, sample.labels)
        assert key not in result, f"duplicate output series {key}"
        result[key] = sample.value
    return result


def get(out: list[Sample], name: str, **labels: str) -> float | None:
    return index(out).get((name, make_labels(labels)))


def names(out: list[Sample]) -> set[str]:
    return {sample.name for sample in out}


def core(
    *,
    success: float,
    count: float,
    execs: float,
    queue_us: float = 0,
    cin_us: float = 0,
    cinf_us: float = 0,
    cout_us: float = 0,
    request_us: float = 0,
    failures: Mapping[str, float] | None = None,
    pending: float | None = None,
    labels: Mapping[str, str] = M1,
    total_suffix: bool = False,
) -> list[Sample]:
    """The core nv_inference_* families of one model series."""
    t = "_total" if total_suffix else ""
    out = [
        s("nv_inference_request_success" + t, success, labels),
        s("nv_inference_count" + t, count, labels),
        s("nv_inference_exec_count" + t, execs, labels),
        s("nv_inference_queue_duration_us" + t, queue_us, labels),
        s("nv_inference_compute_input_duration_us" + t, cin_us, labels),
        s("nv_inference_compute_infer_duration_us" + t, cinf_us, labels),
        s("nv_inference_compute_output_duration_us" + t, cout_us, labels),
        s("nv_inference_request_duration_us" + t, request_us, labels),
    ]
    for reason, value in (failures or {}).items():
        extra = {"reason": reason} if reason else {}
        out.append(s("nv_inference_request_failure" + t, value, {**labels, **extra}))
    if pending is not None:
        out.append(s("nv_inference_pending_request_count", pending, labels))
    return out


def cores(*series: tuple[Mapping[str, str], float, float, float]) -> list[Sample]:
    """core() of several model series, each as (labels, success, count, execs)."""
    return [
        x
        for labels, ok, n, ex in series
        for x in core(success=ok, count=n, execs=ex, labels=labels)
    ]


KW0: dict[str, Any] = {
    "success": 100,
    "count": 300,
    "execs": 50,
    "queue_us": 10_000,
    "cin_us": 1_000,
    "cinf_us": 20_000,
    "cout_us": 500,
    "request_us": 40_000,
    "failures": {"REJECTED": 2, "CANCELED": 0, "BACKEND": 1, "OTHER": 0},
    "pending": 3,
}
KW1: dict[str, Any] = {
    "success": 140,
    "count": 420,
    "execs": 70,
    "queue_us": 30_000,
    "cin_us": 1_400,
    "cinf_us": 28_000,
    "cout_us": 600,
    "request_us": 80_000,
    "failures": {"REJECTED": 6, "CANCELED": 0, "BACKEND": 1, "OTHER": 0},
    "pending": 5,
}


# --- core counters ------------------------------------------------------------------------------


def test_first_snapshot_gives_gauges_only_no_rates() -> None:
    out = Deriver("t1").derive(snap(1000.0, core(**KW0)), CONFIGS)
    assert index(out) == {("sli:pending_requests", make_labels(M1)): 3.0}


@pytest.mark.parametrize("total_suffix", [False, True], ids=["triton spelling", "_total spelling"])
def test_core_slis_match_hand_computed_values(total_suffix: bool) -> None:
    d = Deriver("t1")
    d.derive(snap(1000.0, core(**KW0, total_suffix=total_suffix)), CONFIGS)
    out = d.derive(snap(1010.0, core(**KW1, total_suffix=total_suffix)), CONFIGS)
    # Δt 10 s: Δsuccess 40, Δcount 120, Δexec 20, ΔREJECTED 4, Δqueue 20 000 µs,
    # Δcompute 400 + 8 000 + 100 µs, Δrequest 40 000 µs.
    assert get(out, "sli:request_rate", **M1) == pytest.approx(4.0)
    assert get(out, "sli:inference_rate", **M1) == pytest.approx(12.0)
    assert get(out, "sli:execution_rate", **M1) == pytest.approx(2.0)
    assert get(out, "sli:failure_rate", **M1, reason="REJECTED") == pytest.approx(0.4)
    for reason in ("CANCELED", "BACKEND", "OTHER"):
        assert get(out, "sli:failure_rate", **M1, reason=reason) == 0.0
    assert get(out, "sli:success_ratio", **M1) == pytest.approx(40 / 44)
    assert get(out, "sli:avg_batch_size", **M1) == pytest.approx(6.0)
    assert get(out, "sli:batch_fill_rate", **M1) == pytest.approx(0.75)
    assert get(out, "sli:requests_per_execution", **M1) == pytest.approx(2.0)
    assert get(out, "sli:queue_time_seconds", **M1) == pytest.approx(0.0005)
    assert get(out, "sli:compute_time_seconds", **M1) == pytest.approx(8500e-6 / 40)
    assert get(out, "sli:request_time_seconds", **M1) == pytest.approx(0.001)
    assert get(out, "sli:queue_compute_ratio", **M1) == pytest.approx(2.5)
    assert get(out, "sli:pending_requests", **M1) == 5.0


def test_counter_spelling_may_change_between_snapshots() -> None:
    d = Deriver("t1")
    d.derive(snap(1000.0, core(**KW0)), CONFIGS)
    out = d.derive(snap(1010.0, core(**KW1, total_suffix=True)), CONFIGS)
    assert get(out, "sli:request_rate", **M1) == pytest.approx(4.0)


def test_ratios_are_skipped_when_the_denominator_did_not_move() -> None:
    d = Deriver("t1")
    idle = core(success=10, count=10, execs=10, failures={"REJECTED": 0})
    d.derive(snap(1000.0, idle), CONFIGS)
    out = d.derive(snap(1015.0, idle), CONFIGS)
    assert get(out, "sli:request_rate", **M1) == 0.0
    assert get(out, "sli:failure_rate", **M1, reason="REJECTED") == 0.0
    for absent in (
        "sli:success_ratio",
        "sli:avg_batch_size",
        "sli:batch_fill_rate",
        "sli:requests_per_execution",
        "sli:queue_time_seconds",
        "sli:compute_time_seconds",
        "sli:request_time_seconds",
        "sli:queue_compute_ratio",
    ):
        assert absent not in names(out)


def test_failures_without_reason_label_are_reported_as_reason_all() -> None:
    d = Deriver("t1")
    d.derive(snap(0.0, core(success=10, count=10, execs=10, failures={"": 1})), CONFIGS)
    out = d.derive(snap(10.0, core(success=13, count=13, execs=13, failures={"": 2})), CONFIGS)
    assert get(out, "sli:failure_rate", **M1, reason="ALL") == pytest.approx(0.1)
    assert get(out, "sli:success_ratio", **M1) == pytest.approx(3 / 4)


def test_max_batch_size_zero_or_unknown_config_gives_no_fill_rate() -> None:
    nobatch = {"model": "nobatch", "version": "1"}
    unknown = {"model": "mystery", "version": "2"}
    d = Deriver("t1")
    d.derive(snap(0.0, cores((nobatch, 0, 0, 0), (unknown, 0, 0, 0))), CONFIGS)
    out = d.derive(snap(10.0, cores((nobatch, 5, 5, 5), (unknown, 8, 16, 4))), CONFIGS)
    assert get(out, "sli:avg_batch_size", **nobatch) == pytest.approx(1.0)
    assert get(out, "sli:avg_batch_size", **unknown) == pytest.approx(4.0)
    assert "sli:batch_fill_rate" not in names(out)


def test_namespace_is_kept_and_tag_labels_are_summed_away() -> None:
    a = {"model": "resnet", "version": "1", "namespace": "prod", "_team": "a"}
    b = {"model": "resnet", "version": "1", "namespace": "prod", "_team": "b"}
    other_ns = {"model": "resnet", "version": "1", "namespace": "dev"}
    d = Deriver("t1")
    d.derive(snap(0.0, cores((a, 0, 0, 0), (b, 0, 0, 0), (other_ns, 0, 0, 0))), CONFIGS)
    after = cores((a, 10, 10, 5), (b, 30, 30, 5), (other_ns, 50, 50, 50))
    out = d.derive(snap(10.0, after), CONFIGS)
    prod = {"model": "resnet", "version": "1", "namespace": "prod"}
    assert get(out, "sli:request_rate", **prod) == pytest.approx(4.0)
    assert get(out, "sli:avg_batch_size", **prod) == pytest.approx(4.0)
    assert get(out, "sli:request_rate", **other_ns) == pytest.approx(5.0)


# --- gpu_uuid splitting and resets -------------------------------------------------------------


def _split(gpu_a: tuple[float, float, float], gpu_b: tuple[float, float, float]) -> list[Sample]:
    """One model split over two KIND_GPU instances: (success, count, exec) per gpu_uuid."""
    out: list[Sample] = []
    for gpu, (success, count, execs) in (("GPU-a", gpu_a), ("GPU-b", gpu_b)):
        out += core(success=success, count=count, execs=execs, labels={**M1, "gpu_uuid": gpu})
    return out


def test_model_counters_are_summed_over_gpu_uuid_before_ratios() -> None:
    d = Deriver("t1")
    d.derive(snap(0.0, _split((100, 400, 100), (200, 200, 200))), CONFIGS)
    out = d.derive(snap(10.0, _split((110, 480, 110), (230, 230, 230))), CONFIGS)
    # Δsuccess 10+30, Δcount 80+30, Δexec 10+30: the ratio of sums, not a mean of ratios.
    assert get(out, "sli:request_rate", **M1) == pytest.approx(4.0)
    assert get(out, "sli:avg_batch_size", **M1) == pytest.approx(110 / 40)
    assert not any("gpu_uuid" in dict(x.labels) for x in out)


def test_reset_on_one_gpu_uuid_series_does_not_corrupt_the_sum() -> None:
    d = Deriver("t1")
    d.derive(snap(0.0, _split((100, 400, 100), (1000, 1000, 1000))), CONFIGS)
    # GPU-b's instance reloaded: its counters restart and read 20; GPU-a moved by 50.
    out = d.derive(snap(10.0, _split((150, 600, 150), (20, 20, 20))), CONFIGS)
    assert get(out, "sli:request_rate", **M1) == pytest.approx((50 + 20) / 10)
    assert get(out, "sli:avg_batch_size", **M1) == pytest.approx((200 + 20) / (50 + 20))


def test_server_restart_gives_no_negative_or_spiking_rate() -> None:
    d = Deriver("t1")
    d.derive(snap(0.0, core(**KW0)), CONFIGS)
    d.derive(snap(10.0, core(**KW1)), CONFIGS)
    after_restart = core(
        success=4, count=12, execs=2, queue_us=800, cinf_us=400, request_us=2000, pending=0
    )
    out = d.derive(snap(20.0, after_restart), CONFIGS)
    assert all(x.value >= 0 for x in out)
    assert get(out, "sli:request_rate", **M1) == pytest.approx(0.4)
    assert get(out, "sli:avg_batch_size", **M1) == pytest.approx(6.0)
    assert get(out, "sli:queue_time_seconds", **M1) == pytest.approx(800e-6 / 4)
    # The failure series vanished with the restart (not yet re-created): no rate, not negative.
    assert "sli:failure_rate" not in names(out)
    out = d.derive(snap(30.0, core(success=14, count=42, execs=7)), CONFIGS)
    assert get(out, "sli:request_rate", **M1) == pytest.approx(1.0)


# --- churn, gaps, ordering ----------------------------------------------------------------------


def test_model_that_appears_later_and_one_that_disappears() -> None:
    m2 = {"model": "bert", "version": "3"}
    d = Deriver("t1")
    d.derive(snap(0.0, core(success=10, count=10, execs=10)), CONFIGS)
    out = d.derive(snap(10.0, cores((M1, 20, 20, 10), (m2, 500, 5, 5))), CONFIGS)
    assert get(out, "sli:request_rate", **M1) == pytest.approx(1.0)
    assert get(out, "sli:request_rate", **m2) is None  # new series: no baseline yet
    tracked_both = d.tracked_series()
    out = d.derive(snap(20.0, core(success=520, count=7, execs=7, labels=m2)), CONFIGS)
    assert get(out, "sli:request_rate", **m2) == pytest.approx(2.0)
    assert get(out, "sli:request_rate", **M1) is None
    assert d.tracked_series() == tracked_both // 2  # resnet's series were dropped
    # resnet comes back (reloaded): a new series again, so no rate across its absence.
    out = d.derive(snap(30.0, cores((M1, 3, 3, 3), (m2, 530, 9, 9))), CONFIGS)
    assert get(out, "sli:request_rate", **M1) is None
    assert get(out, "sli:request_rate", **m2) == pytest.approx(1.0)


def test_gap_longer_than_max_gap_gives_no_rates_then_resumes() -> None:
    d = Deriver("t1", max_gap_s=60.0)
    d.derive(snap(0.0, core(**KW0)), CONFIGS)
    out = d.derive(snap(61.0, core(**KW1)), CONFIGS)
    assert names(out) == {"sli:pending_requests"}
    later = core(**{**KW1, "success": 200, "count": 600, "execs": 100})
    out = d.derive(snap(91.0, later), CONFIGS)
    assert get(out, "sli:request_rate", **M1) == pytest.approx(2.0)


def test_stale_or_replayed_snapshot_yields_nothing_and_keeps_state() -> None:
    d = Deriver("t1")
    d.derive(snap(100.0, core(success=100, count=100, execs=100)), CONFIGS)
    assert "sli:request_rate" not in names(
        d.derive(snap(100.0, core(success=50, count=50, execs=50)), CONFIGS)
    )
    out = d.derive(snap(110.0, core(success=120, count=120, execs=120)), CONFIGS)
    assert get(out, "sli:request_rate", **M1) == pytest.approx(2.0)


def test_non_finite_samples_are_ignored() -> None:
    d = Deriver("t1")
    d.derive(snap(0.0, core(success=10, count=10, execs=10)), CONFIGS)
    samples = core(success=20, count=20, execs=20)
    samples[0] = samples[0]._replace(value=math.nan)
    out = d.derive(snap(10.0, samples), CONFIGS)
    assert "sli:request_rate" not in names(out)
    assert get(out, "sli:inference_rate", **M1) == pytest.approx(1.0)


def test_max_gap_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_gap_s"):
        Deriver("t1", max_gap_s=0)


# --- LLM backends -------------------------------------------------------------------------------

LLM = {"model": "llm", "version": "1"}


def _vllm(
    ttft: tuple[float, float],
    itl: tuple[float, float],
    e2e: tuple[float, float],
    p: float,
    g: float,
) -> list[Sample]:
    out = [s("vllm:prompt_tokens_total", p, LLM), s("vllm:generation_tokens_total", g, LLM)]
    for family, (total, count) in (
        ("vllm:time_to_first_token_seconds", ttft),
        ("vllm:time_per_output_token_seconds", itl),
        ("vllm:e2e_request_latency_seconds", e2e),
    ):
        out += [
            s(family + "_bucket", count, LLM, le="+Inf"),
            s(family + "_sum", total, LLM),
            s(family + "_count", count, LLM),
        ]
    return out


def test_vllm_histograms_and_token_rates() -> None:
    d = Deriver("t1")
    d.derive(snap(0.0, _vllm((1.0, 10), (5.0, 500), (30.0, 10), 1000, 600)), CONFIGS)
    out = d.derive(snap(20.0, _vllm((1.8, 14), (7.0, 600), (46.0, 14), 3000, 1600)), CONFIGS)
    assert get(out, "sli:ttft_seconds", **LLM) == pytest.approx(0.8 / 4)
    assert get(out, "sli:itl_seconds", **LLM) == pytest.approx(2.0 / 100)
    assert get(out, "sli:e2e_seconds", **LLM) == pytest.approx(16.0 / 4)
    assert get(out, "sli:prompt_tokens_rate", **LLM) == pytest.approx(100.0)
    assert get(out, "sli:generation_tokens_rate", **LLM) == pytest.approx(50.0)


def test_vllm_counters_under_the_parser_family_spelling() -> None:
    # A hand parser may keep the exposition name; prometheus_client keeps ``..._total`` samples.
    d = Deriver("t1")
    d.derive(snap(0.0, [s("vllm:generation_tokens", 100, LLM)]), CONFIGS)
    out = d.derive(snap(10.0, [s("vllm:generation_tokens_total", 150, LLM)]), CONFIGS)
    assert get(out, "sli:generation_tokens_rate", **LLM) == pytest.approx(5.0)


def test_triton_ttft_histogram_wins_over_vllm_and_is_converted_from_ms() -> None:
    def both(ms_sum: float, count: float, vllm_sum: float) -> list[Sample]:
        return [
            *_vllm((vllm_sum, count), (0, 0), (0, 0), 0, 0),
            s("nv_inference_first_response_histogram_ms_bucket", count, LLM, le="100"),
            s("nv_inference_first_response_histogram_ms_sum", ms_sum, LLM),
            s("nv_inference_first_response_histogram_ms_count", count, LLM),
        ]

    d = Deriver("t1")
    d.derive(snap(0.0, both(1000, 10, 0.9)), CONFIGS)
    out = d.derive(snap(10.0, both(1600, 14, 1.3)), CONFIGS)
    assert get(out, "sli:ttft_seconds", **LLM) == pytest.approx(0.6 / 4)


def test_trtllm_output_token_histogram_gives_token_rate() -> None:
    def tok(total: float) -> list[Sample]:
        lab = {**LLM, "response_metric_type": "total_output_tokens"}
        return [
            s("nv_llm_output_token_len_sum", total, lab),
            s("nv_llm_output_token_len_count", 1, lab),
        ]

    d = Deriver("t1")
    d.derive(snap(0.0, tok(1000)), CONFIGS)
    out = d.derive(snap(10.0, tok(3000)), CONFIGS)
    assert get(out, "sli:generation_tokens_rate", **LLM) == pytest.approx(200.0)
    assert "sli:prompt_tokens_rate" not in names(out)


def _trtllm(
    kv: Mapping[str, float], req: Mapping[str, float], paused: float | None = None
) -> list[Sample]:
    out = [
        s("nv_trt_llm_kv_cache_block_metrics", v, LLM, kv_cache_block_type=k) for k, v in kv.items()
    ]
    out += [s("nv_trt_llm_request_metrics", v, LLM, request_type=k) for k, v in req.items()]
    if paused is not None:
        out.append(
            s(
                "nv_trt_llm_inflight_batcher_metrics",
                paused,
                LLM,
                inflight_batcher_specific_metric="paused_requests",
            )
        )
    return out


KV_OK = {"max": 4000, "free": 1000, "used": 3000, "tokens_per": 64, "reused": 600, "fraction": 0.75}
REQ_OK = {"active": 40, "max": 64, "scheduled": 32, "context": 4, "waiting": 8}


def test_trtllm_gauges_are_current_values_from_the_first_snapshot() -> None:
    out = Deriver("t1").derive(snap(0.0, _trtllm(KV_OK, REQ_OK, paused=2)), CONFIGS)
    assert get(out, "sli:kv_cache_utilization", **LLM) == pytest.approx(0.75)
    assert get(out, "sli:kv_cache_free_blocks", **LLM) == 1000.0
    assert get(out, "sli:kv_cache_reuse_ratio", **LLM) == pytest.approx(0.2)
    assert get(out, "sli:inflight_batch_fill", **LLM) == pytest.approx(0.5)
    assert get(out, "sli:llm_active_requests", **LLM) == 40.0
    assert get(out, "sli:llm_waiting_requests", **LLM) == 8.0
    assert get(out, "sli:llm_paused_requests", **LLM) == 2.0


def test_trtllm_older_versions_fall_back_to_fraction_and_active_minus_scheduled() -> None:
    # Python-backend model: fraction but no max/used; TRT-LLM < v0.18: no ``waiting``.
    req = {"active": 40, "max": 64, "scheduled": 32}
    out = Deriver("t1").derive(snap(0.0, _trtllm({"fraction": 0.4, "free": 10}, req)), CONFIGS)
    assert get(out, "sli:kv_cache_utilization", **LLM) == pytest.approx(0.4)
    assert get(out, "sli:llm_waiting_requests", **LLM) == 8.0
    assert "sli:kv_cache_reuse_ratio" not in names(out)
    assert "sli:llm_paused_requests" not in names(out)


@pytest.mark.parametrize(
    "kv",
    [
        # ``reused`` missing in the JSON: tokens_per's value lands on ``used``, and so on.
        {"max": 4000, "free": 1000, "used": 64, "tokens_per": 0.75, "fraction": 0},
        {"max": 4000, "free": 1000, "used": 3000, "fraction": 64},
        {"max": 64, "free": 1000, "used": 3000},
        {"max": 4000, "free": -1, "used": 3000},
    ],
    ids=["used+free far from max", "fraction disagrees", "used above max", "negative"],
)
def test_inconsistent_kv_labels_skip_kv_slis_but_not_request_slis(
    kv: Mapping[str, float], caplog: pytest.LogCaptureFixture
) -> None:
    d = Deriver("t1")
    with caplog.at_level(logging.WARNING, logger="tritonwatch.collector.derive"):
        out = d.derive(snap(0.0, _trtllm(kv, REQ_OK)), CONFIGS)
        d.derive(snap(10.0, _trtllm(kv, REQ_OK)), CONFIGS)
    assert not {
        "sli:kv_cache_utilization",
        "sli:kv_cache_free_blocks",
        "sli:kv_cache_reuse_ratio",
    } & names(out)
    assert get(out, "sli:llm_active_requests", **LLM) == 40.0
    assert len([r for r in caplog.records if "KV-cache" in r.message]) == 1  # once, not per scrape


def test_scheduled_above_max_gives_no_inflight_fill() -> None:
    out = Deriver("t1").derive(snap(0.0, _trtllm({}, {"max": 8, "scheduled": 64})), CONFIGS)
    assert "sli:inflight_batch_fill" not in names(out)


# --- GPU --------------------------------------------------------------------------------------


def _gpu(
    uuid: str, util: float, used: float, total: float, power: float, limit: float, energy: float
) -> list[Sample]:
    return [
        s("nv_gpu_utilization", util, gpu_uuid=uuid),
        s("nv_gpu_memory_used_bytes", used, gpu_uuid=uuid),
        s("nv_gpu_memory_total_bytes", total, gpu_uuid=uuid),
        s("nv_gpu_power_usage", power, gpu_uuid=uuid),
        s("nv_gpu_power_limit", limit, gpu_uuid=uuid),
        s("nv_energy_consumption", energy, gpu_uuid=uuid),
    ]


GIB = 1024.0**3


def _idle_models(
    count: float, *gpus: list[Sample], models: tuple[Mapping[str, str], ...] = (M1,)
) -> list[Sample]:
    """The GPUs' samples plus models that have counted `count` inferences and no successes."""
    return [x for gpu in gpus for x in gpu] + cores(*((m, 0, count, 0) for m in models))


def test_gpu_gauges_and_energy_per_inference() -> None:
    ens = {"model": "ens", "version": "1"}
    d = Deriver("t1")
    a0 = _gpu("GPU-a", 0.5, 20 * GIB, 80 * GIB, 300, 700, 10_000)
    b0 = _gpu("GPU-b", 0.1, 8 * GIB, 80 * GIB, 100, 700, 5_000)
    d.derive(snap(0.0, _idle_models(1000, a0, b0, models=(M1, ens))), CONFIGS)
    a1 = _gpu("GPU-a", 0.75, 40 * GIB, 80 * GIB, 350, 700, 13_000)
    b1 = _gpu("GPU-b", 0.25, 8 * GIB, 80 * GIB, 140, 700, 6_000)
    out = d.derive(snap(10.0, _idle_models(1500, a1, b1, models=(M1, ens))), CONFIGS)
    assert get(out, "sli:gpu_utilization", gpu_uuid="GPU-a") == 0.75
    assert get(out, "sli:gpu_memory_used_ratio", gpu_uuid="GPU-a") == pytest.approx(0.5)
    assert get(out, "sli:gpu_power_watts", gpu_uuid="GPU-b") == 140.0
    assert get(out, "sli:gpu_power_ratio", gpu_uuid="GPU-b") == pytest.approx(0.2)
    # (3000 + 1000) J over 500 inferences; the ensemble's own count is excluded (double count).
    assert get(out, "sli:energy_per_inference_joules") == pytest.approx(8.0)


def test_dcgm_all_zero_gpu_is_skipped_and_voids_energy() -> None:
    def gpu(uuid: str, util: float, power: float, energy: float) -> list[Sample]:
        return _gpu(uuid, util, 1, 2, power, 700, energy)

    d = Deriver("t1")
    d.derive(
        snap(0.0, _idle_models(0, gpu("GPU-a", 0.5, 300, 10_000), gpu("GPU-b", 0.5, 300, 10_000))),
        CONFIGS,
    )
    failed = _gpu("GPU-b", 0, 0, 0, 0, 0, 0)
    out = d.derive(snap(10.0, _idle_models(100, gpu("GPU-a", 0.0, 60, 11_000), failed)), CONFIGS)
    assert not [x for x in out if dict(x.labels).get("gpu_uuid") == "GPU-b"]
    assert get(out, "sli:gpu_utilization", gpu_uuid="GPU-a") == 0.0  # idle, not failed
    assert "sli:energy_per_inference_joules" not in names(out)
    # GPU-b recovers with its full cumulative energy: a fresh baseline, not a 10 kJ spike.
    recovered = _idle_models(200, gpu("GPU-a", 0.5, 300, 12_000), gpu("GPU-b", 0.5, 300, 12_000))
    out = d.derive(snap(20.0, recovered), CONFIGS)
    assert "sli:energy_per_inference_joules" not in names(out)
    later = _idle_models(300, gpu("GPU-a", 0.5, 300, 13_000), gpu("GPU-b", 0.5, 300, 12_500))
    out = d.derive(snap(30.0, later), CONFIGS)
    assert get(out, "sli:energy_per_inference_joules") == pytest.approx(15.0)


# --- statistics API -----------------------------------------------------------------------------


def _stats(
    *,
    success: float,
    success_ns: float,
    fail: float,
    queue_ns: float,
    infer_ns: float,
    inference: float,
    executions: float,
    cache: tuple[float, float],
    batches: dict[int, tuple[float, float]],
    responses: dict[int, tuple[float, float]],
    labels: Mapping[str, str] = M1,
) -> list[Sample]:
    out = [
        s("triton_stats_success_count", success, labels),
        s("triton_stats_success_ns", success_ns, labels),
        s("triton_stats_fail_count", fail, labels),
        s("triton_stats_fail_ns", fail * 1000, labels),
        s("triton_stats_queue_ns", queue_ns, labels),
        s("triton_stats_compute_input_ns", 0, labels),
        s("triton_stats_compute_infer_ns", infer_ns, labels),
        s("triton_stats_compute_output_ns", 0, labels),
        s("triton_stats_inference_count", inference, labels),
        s("triton_stats_execution_count", executions, labels),
        s("triton_stats_cache_hit_count", cache[0], labels),
        s("triton_stats_cache_miss_count", cache[1], labels),
    ]
    for bs, (n, ns) in batches.items():
        out.append(s("triton_stats_batch_executions", n, labels, batch_size=str(bs)))
        out.append(s("triton_stats_batch_compute_infer_ns", ns, labels, batch_size=str(bs)))
    for k, (n, ns) in responses.items():
        out.append(s("triton_stats_response_success_count", n, labels, index=str(k)))
        out.append(s("triton_stats_response_success_ns", ns, labels, index=str(k)))
    return out


STATS0: dict[str, Any] = {
    "success": 100,
    "success_ns": 1e9,
    "fail": 1,
    "queue_ns": 2e8,
    "infer_ns": 5e8,
    "inference": 400,
    "executions": 100,
    "cache": (10.0, 90.0),
    "batches": {1: (10.0, 1e8), 4: (40.0, 8e8), 8: (50.0, 2e9)},
    "responses": {0: (100.0, 5e9), 1: (100.0, 2e9), 2: (90.0, 1.8e9)},
}
STATS1: dict[str, Any] = {
    "success": 140,
    "success_ns": 1.8e9,
    "fail": 1,
    "queue_ns": 3e8,
    "infer_ns": 9e8,
    "inference": 560,
    "executions": 120,
    "cache": (40.0, 100.0),
    "batches": {1: (14.0, 1.4e8), 4: (44.0, 8.8e8), 8: (62.0, 2.5e9)},
    "responses": {0: (140.0, 7e9), 1: (140.0, 2.8e9), 2: (130.0, 2.6e9)},
}


def test_stats_api_slis_match_hand_computed_values() -> None:
    d = Deriver("t1")
    d.derive(snap(0.0, _stats(**STATS0)), CONFIGS)
    out = d.derive(snap(20.0, _stats(**STATS1)), CONFIGS)
    # batch_stats deltas: bs1 4 execs, bs4 4 execs, bs8 12 execs (preferred: 4 and 8).
    assert get(out, "sli:preferred_batch_hit_ratio", **M1) == pytest.approx(16 / 20)
    assert get(out, "sli:stats_batch_fill_rate", **M1) == pytest.approx((4 + 16 + 96) / 20 / 8)
    assert get(out, "sli:gpu_busy_seconds_rate", **M1) == pytest.approx(
        (0.4e8 + 0.8e8 + 5e8) / 1e9 / 20
    )
    assert get(out, "sli:server_ttft_seconds", **M1) == pytest.approx(2e9 / 40 / 1e9)
    assert get(out, "sli:server_itl_seconds", **M1) == pytest.approx((0.8e9 + 0.8e9) / 80 / 1e9)
    assert get(out, "sli:cache_hit_ratio", **M1) == pytest.approx(30 / 40)
    # The request-level SLIs come from the stats counters when /metrics is not in the snapshot.
    assert get(out, "sli:request_rate", **M1) == pytest.approx(2.0)
    assert get(out, "sli:failure_rate", **M1, reason="ALL") == 0.0
    assert get(out, "sli:success_ratio", **M1) == 1.0
    assert get(out, "sli:avg_batch_size", **M1) == pytest.approx(8.0)
    assert get(out, "sli:queue_time_seconds", **M1) == pytest.approx(1e8 / 40 / 1e9)
    assert get(out, "sli:request_time_seconds", **M1) == pytest.approx(0.8e9 / 40 / 1e9)
    assert get(out, "sli:compute_time_seconds", **M1) == pytest.approx(4e8 / 40 / 1e9)


def test_metrics_cache_counters_give_cache_hit_ratio() -> None:
    def cache(h: float, m: float) -> list[Sample]:
        return [s("nv_cache_num_hits_per_model", h, M1), s("nv_cache_num_misses_per_model", m, M1)]

    d = Deriver("t1")
    d.derive(snap(0.0, cache(5, 5)), CONFIGS)
    assert get(
        d.derive(snap(10.0, cache(8, 6)), CONFIGS), "sli:cache_hit_ratio", **M1
    ) == pytest.approx(0.75)


def test_no_preferred_sizes_gives_no_preferred_hit_ratio() -> None:
    cfg = {"resnet": ModelConfigInfo(name="resnet", max_batch_size=8)}
    d = Deriver("t1")
    d.derive(snap(0.0, _stats(**STATS0)), cfg)
    out = d.derive(snap(20.0, _stats(**STATS1)), cfg)
    assert "sli:preferred_batch_hit_ratio" not in names(out)
    assert "sli:stats_batch_fill_rate" in names(out)


def test_alternating_metrics_and_stats_snapshots_keep_both_baselines() -> None:
    d = Deriver("t1", max_gap_s=60.0)
    assert "sli:request_rate" not in names(d.derive(snap(0.0, core(**KW0)), CONFIGS))
    assert "sli:request_rate" not in names(d.derive(snap(5.0, _stats(**STATS0)), CONFIGS))
    out = d.derive(snap(10.0, core(**KW1)), CONFIGS)
    assert get(out, "sli:request_rate", **M1) == pytest.approx(4.0)  # metrics: Δ40 over 10 s
    out = d.derive(snap(25.0, _stats(**STATS1)), CONFIGS)
    # /metrics owns the model's request SLIs now: the stats read adds only its own SLIs, so a
    # series never interleaves two sources (and two intervals).
    assert get(out, "sli:request_rate", **M1) is None
    assert get(out, "sli:preferred_batch_hit_ratio", **M1) == pytest.approx(0.8)


def test_stats_api_stands_in_for_request_slis_when_metrics_never_had_them() -> None:
    d = Deriver("t1", max_gap_s=60.0)
    assert "sli:request_rate" not in names(d.derive(snap(5.0, _stats(**STATS0)), CONFIGS))
    out = d.derive(snap(25.0, _stats(**STATS1)), CONFIGS)
    assert get(out, "sli:request_rate", **M1) == pytest.approx(2.0)  # stats: Δ40 over 20 s


def test_combined_snapshot_prefers_metrics_for_request_slis() -> None:
    d = Deriver("t1")
    d.derive(snap(0.0, core(**KW0) + _stats(**STATS0)), CONFIGS)
    out = d.derive(snap(10.0, core(**KW1) + _stats(**STATS1)), CONFIGS)
    index(out)  # asserts there are no duplicate (name, labels) pairs
    assert get(out, "sli:request_rate", **M1) == pytest.approx(4.0)
    assert get(out, "sli:failure_rate", **M1, reason="REJECTED") == pytest.approx(0.4)
    assert get(out, "sli:failure_rate", **M1, reason="ALL") is None
    assert get(out, "sli:stats_batch_fill_rate", **M1) is not None


def test_absent_source_state_is_forgotten_after_max_gap() -> None:
    metrics_series = len(core(**KW0)) - 1  # the pending gauge needs no state
    stats_series = len(_stats(**STATS0)) - 1  # triton_stats_fail_ns feeds no SLI
    d = Deriver("t1", max_gap_s=30.0)
    d.derive(snap(0.0, _stats(**STATS0)), CONFIGS)
    for ts in (10.0, 20.0, 30.0):  # metrics-only snapshots keep the stats baselines...
        d.derive(snap(ts, core(**KW0)), CONFIGS)
    assert d.tracked_series() == metrics_series + stats_series
    d.derive(snap(40.0, core(**KW0)), CONFIGS)  # ...until they are too old to give a rate
    assert d.tracked_series() == metrics_series


# --- catalog and cross-module consistency -----------------------------------------------------


def test_every_emitted_name_is_in_the_catalog() -> None:
    d = Deriver("t1")
    first = (
        core(**KW0)
        + _stats(**STATS0)
        + _vllm((1.0, 10), (5.0, 500), (30.0, 10), 1000, 600)
        + _trtllm(KV_OK, REQ_OK, paused=1)
        + _gpu("GPU-a", 0.5, 1, 2, 300, 700, 10_000)
        + [s("nv_cache_num_hits_per_model", 1, M1), s("nv_cache_num_misses_per_model", 1, M1)]
    )
    second = (
        core(**KW1)
        + _stats(**STATS1)
        + _vllm((1.8, 14), (7.0, 600), (46.0, 14), 3000, 1600)
        + _trtllm(KV_OK, REQ_OK, paused=1)
        + _gpu("GPU-a", 0.5, 1, 2, 300, 700, 11_000)
        + [s("nv_cache_num_hits_per_model", 3, M1), s("nv_cache_num_misses_per_model", 2, M1)]
    )
    d.derive(snap(0.0, first), CONFIGS)
    out = d.derive(snap(10.0, second), CONFIGS)
    assert names(out) <= set(SLI_CATALOG)
    assert set(SLI_CATALOG) == names(out)  # this pair exercises every SLI


def test_catalog_entries_are_documented() -> None:
    for name, spec in SLI_CATALOG.items():
        assert name.startswith("sli:")
        assert spec.unit and spec.description


def test_every_input_family_is_classified_by_the_metric_map() -> None:
    assert INPUT_FAMILIES <= set(METRIC_MAP)


# --- property: reset-aware increase -----------------------------------------------------------


def _prometheus_increase(values: list[float]) -> float:
    return sum(v - p if v >= p else v for p, v in itertools.pairwise(values))


_steps = st.lists(
    st.one_of(
        st.tuples(st.just("inc"), st.integers(min_value=0, max_value=10_000)),
        st.tuples(st.just("reset"), st.integers(min_value=0, max_value=50)),
    ),
    min_size=1,
    max_size=40,
)


def _series(start: int, steps: list[tuple[str, int]]) -> list[float]:
    values = [float(start)]
    for op, amount in steps:
        values.append(values[-1] + amount if op == "inc" else float(amount))
    return values


@settings(max_examples=200, deadline=None)
@given(
    start_a=st.integers(min_value=0, max_value=10**6),
    steps_a=_steps,
    start_b=st.integers(min_value=0, max_value=10**6),
    steps_b=_steps,
)
def test_summed_increases_equal_prometheus_reset_aware_increase(
    start_a: int, steps_a: list[tuple[str, int]], start_b: int, steps_b: list[tuple[str, int]]
) -> None:
    n = min(len(steps_a), len(steps_b)) + 1
    a = _series(start_a, steps_a)[:n]
    b = _series(start_b, steps_b)[:n]
    d = Deriver("t1")
    total = 0.0
    for i, (va, vb) in enumerate(zip(a, b, strict=True)):
        samples = [
            s("nv_inference_request_success", va, {**M1, "gpu_uuid": "GPU-a"}),
            s("nv_inference_request_success", vb, {**M1, "gpu_uuid": "GPU-b"}),
        ]
        out = d.derive(snap(15.0 * i, samples), CONFIGS)
        for sample in out:
            assert sample.value >= 0
        rate = get(out, "sli:request_rate", **M1)
        if i == 0:
            assert rate is None
        else:
            assert rate is not None
            total += rate * 15.0
    assert total == pytest.approx(_prometheus_increase(a) + _prometheus_increase(b))


# --------------------------------------------------------------------------------------------
# DERIVED_FROM: the families the deriver reads (the collector passes the others without samples)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_families_outside_derived_from_do_not_change_the_result(seed):
    from tests.payloads import triton_payload
    from tritonwatch.collector.derive.catalog import DERIVED_FROM, ROLES
    from tritonwatch.collector.parse import parse, parse_reference

    full, trimmed = Deriver("t"), Deriver("t")
    configs = {f"model_{i}": ModelConfigInfo(name=f"model_{i}", max_batch_size=8)
               for i in range(20)}
    outputs = []
    for step in range(4):
        text = triton_payload(seed=seed, step=step)
        families = parse(text)
        assert any(f.name not in DERIVED_FROM and f.samples for f in families)
        # Every family holding a sample the deriver has a role for is one it reads, under
        # either parser's naming (the reference names counter samples *_total).
        for f in [*families, *parse_reference(text)]:
            if any(smp.name in ROLES for smp in f.samples):
                assert f.name in DERIVED_FROM, f.name
        emptied = tuple(f if f.name in DERIVED_FROM else f._replace(samples=())
                        for f in families)
        a = full.derive(Snapshot("t", 1000.0 + 15 * step, tuple(families)), configs)
        b = trimmed.derive(Snapshot("t", 1000.0 + 15 * step, emptied), configs)
        assert [(s.name, s.labels, repr(s.value)) for s in a] == [
            (s.name, s.labels, repr(s.value)) for s in b
        ]
        outputs.append(len(a))
    assert outputs[-1] > 0  # rates once there is a baseline: the comparison compared something
