"""The SLIs: their catalog (:data:`SLI_CATALOG`, what is emitted, with unit, labels and
meaning) and their formulas, what one interval's accumulated deltas and gauges mean (stateless).
A new SLI is a catalog entry and its ``out.emit`` here; tests/collector/test_derive.py fails
while an emitted name has no entry.

Each function reads what :mod:`collector.derive.accumulate` gathered for one model (an
:class:`~collector.derive.accumulate.Acc`) or one GPU, and appends its SLIs to an output list
through a :class:`SeriesOut`, in a fixed order (the same input always gives the same output list).
Nothing here keeps state between intervals: which source a model's SLIs come from, and which
models' KV gauges were already reported as inconsistent, is the Deriver's business.
"""

from __future__ import annotations

from typing import NamedTuple

from tritonwatch.collector.derive.accumulate import Acc
from tritonwatch.collector.derive.catalog import ModelKey
from tritonwatch.schemas.samples import Labels, Sample, make_labels
from tritonwatch.schemas.triton import ModelConfigInfo


class SliSpec(NamedTuple):
    unit: str
    labels: tuple[str, ...]
    description: str



_M = ("model", "version", "namespace?")
_G = ("gpu_uuid",)

#: Every SLI the deriver emits: name → unit, labels (``namespace?`` = only when Triton runs with
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


# KV-cache sanity: TRT-LLM computes used = max - free, so anything further off than this means
# the positional label values shifted (a missing JSON key, §3) and the numbers are garbage.
_KV_TOLERANCE = 0.05
# ``fraction`` is used/max as TRT-LLM computes it; allow for the gauges being written one by one.
_KV_FRACTION_TOLERANCE = 0.02


class SeriesOut:
    """One label set's samples, appended to an output list; ``emit`` skips ``None``."""

    __slots__ = ("labels", "samples")

    def __init__(self, labels: Labels, samples: list[Sample]) -> None:
        self.labels = labels
        self.samples = samples

    # A method, not __call__: a call through __call__ costs twice as much, on every SLI.
    def emit(self, name: str, value: float | None) -> None:
        if value is not None:
            self.samples.append(Sample(name, self.labels, value))


def ratio(num: float | None, den: float | None) -> float | None:
    if num is None or den is None or den <= 0:
        return None
    return num / den


def model_labels(key: ModelKey) -> Labels:
    model, version, namespace = key
    # make_labels: one shared tuple per label set (bounded), not a new one per model per
    # scrape kept alive by the last scrape's derived samples (~40 per target).  The pairs are
    # given sorted already, so the canonical tuple is this one.
    if namespace is None:
        return make_labels((("model", model), ("version", version)))
    return make_labels((("model", model), ("namespace", namespace), ("version", version)))


def is_ensemble(config: ModelConfigInfo | None) -> bool:
    # An ensemble reports its own counters on top of its composing models' (§0 fact 8), so
    # summing it into a server-wide inference count would count every item twice.
    return config is not None and "ensemble" in (config.platform, config.backend)


# --- per GPU --------------------------------------------------------------------------------


def gpu_slis(gpus: dict[str, dict[str, float]], samples: list[Sample]) -> set[str]:
    """The per-GPU SLIs; returns the GPUs whose DCGM reads failed (every gauge 0)."""
    failed: set[str] = set()
    for gpu, g in gpus.items():
        # A DCGM read failure sets every gauge to 0 instead of removing it (§0 fact 9):
        # "all zero" is unknown, not an idle GPU with no memory and no power draw.
        if not any(g.values()):
            failed.add(gpu)
            continue
        out = SeriesOut(make_labels((("gpu_uuid", gpu),)), samples)
        out.emit("sli:gpu_utilization", g.get("util"))
        out.emit("sli:gpu_memory_used_ratio", ratio(g.get("mem_used"), g.get("mem_total")))
        power = g.get("power")
        if power is not None:
            out.emit("sli:gpu_power_watts", power)
            out.emit("sli:gpu_power_ratio", ratio(power, g.get("power_limit")))
    return failed


# --- per model ------------------------------------------------------------------------------


def core_slis(acc: Acc, config: ModelConfigInfo | None, out: SeriesOut) -> None:
    """Request-level SLIs from one source's request counters."""
    d = acc.d
    dt = acc.dt
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
                out.emit(name, d[fld] / dt)
        for reason, failed in acc.fail.items():
            reason_labels = make_labels((*out.labels, ("reason", reason)))
            out.samples.append(Sample("sli:failure_rate", reason_labels, failed / dt))
    if success is not None and acc.fail:
        out.emit("sli:success_ratio", ratio(success, success + sum(acc.fail.values())))
    avg_batch = ratio(count, execs)
    out.emit("sli:avg_batch_size", avg_batch)
    # max_batch_size 0 means no batch dimension: every request counts as batch 1 and a fill
    # rate would be meaningless (§0 fact 3); an unknown config gives no denominator either.
    if avg_batch is not None and config is not None and config.max_batch_size > 0:
        out.emit("sli:batch_fill_rate", avg_batch / config.max_batch_size)
    out.emit("sli:requests_per_execution", ratio(success, execs))
    out.emit("sli:queue_time_seconds", ratio(d.get("queue_s"), success))
    out.emit("sli:request_time_seconds", ratio(d.get("request_s"), success))
    infer = d.get("cinf_s")
    if infer is not None:
        compute = infer + d.get("cin_s", 0.0) + d.get("cout_s", 0.0)
        out.emit("sli:compute_time_seconds", ratio(compute, success))
    out.emit("sli:queue_compute_ratio", ratio(d.get("queue_s"), infer))


def cache_slis(acc: Acc, out: SeriesOut) -> None:
    hits = acc.d.get("cache_hit")
    misses = acc.d.get("cache_miss")
    if hits is not None and misses is not None:
        out.emit("sli:cache_hit_ratio", ratio(hits, hits + misses))


def stats_slis(acc: Acc, config: ModelConfigInfo | None, out: SeriesOut) -> None:
    """The SLIs only the statistics API gives: batch sizes, busy time, per-response times."""
    if acc.batch_exec:
        executions = sum(acc.batch_exec.values())
        if config is not None and config.preferred_batch_sizes:
            preferred = set(config.preferred_batch_sizes)
            hit = sum(n for bs, n in acc.batch_exec.items() if bs in preferred)
            out.emit("sli:preferred_batch_hit_ratio", ratio(hit, executions))
        if config is not None and config.max_batch_size > 0:
            items = sum(bs * n for bs, n in acc.batch_exec.items())
            avg = ratio(items, executions)
            if avg is not None:
                out.emit("sli:stats_batch_fill_rate", avg / config.max_batch_size)
    if "busy_s" in acc.d and acc.dt > 0:
        out.emit("sli:gpu_busy_seconds_rate", acc.d["busy_s"] / acc.dt)
    if acc.resp_count:
        first = acc.resp_s.get(0)
        out.emit("sli:server_ttft_seconds", ratio(first, acc.resp_count.get(0)))
        later_count = sum(n for k, n in acc.resp_count.items() if k >= 1)
        later_s = sum(n for k, n in acc.resp_s.items() if k >= 1)
        if later_count > 0:
            out.emit("sli:server_itl_seconds", later_s / later_count)


def llm_latency_slis(acc: Acc, out: SeriesOut) -> None:
    """TTFT, inter-token and end-to-end latency, token throughput (vLLM, TRT-LLM, Triton)."""
    d = acc.d
    # Prefer Triton's own TTFT histogram when the model exports it (26.01+ does for every
    # model, vLLM ones included): one source per model keeps the series comparable across
    # backends.  Presence, not movement, decides, so the source never flips between intervals.
    if "ttft_count" in acc.seen:
        out.emit("sli:ttft_seconds", ratio(d.get("ttft_sum"), d.get("ttft_count")))
    else:
        out.emit("sli:ttft_seconds", ratio(d.get("vllm_ttft_sum"), d.get("vllm_ttft_count")))
    out.emit("sli:itl_seconds", ratio(d.get("vllm_itl_sum"), d.get("vllm_itl_count")))
    out.emit("sli:e2e_seconds", ratio(d.get("vllm_e2e_sum"), d.get("vllm_e2e_count")))
    if acc.dt > 0:
        for name, vllm, trtllm in (
            ("sli:generation_tokens_rate", "vllm_gen", "trtllm_gen_sum"),
            ("sli:prompt_tokens_rate", "vllm_prompt", "trtllm_prompt_sum"),
        ):
            tokens = d.get(vllm) if vllm in acc.seen else d.get(trtllm)
            if tokens is not None:
                out.emit(name, tokens / acc.dt)


def llm_request_slis(g: dict[str, float], out: SeriesOut) -> None:
    """The TRT-LLM executor's request gauges (active, waiting, batch fill, paused)."""
    active = g.get("request_type=active")
    scheduled = g.get("request_type=scheduled")
    max_requests = g.get("request_type=max")
    out.emit("sli:llm_active_requests", active)
    waiting = g.get("request_type=waiting")
    if waiting is None and active is not None and scheduled is not None:
        # Older TRT-LLM (< v0.18) has no `waiting`; it is defined as active - scheduled.
        waiting = max(active - scheduled, 0.0)
    out.emit("sli:llm_waiting_requests", waiting)
    if scheduled is not None and max_requests is not None and scheduled <= max_requests:
        # scheduled > max can only be shifted label values: no sample rather than > 100 %.
        out.emit("sli:inflight_batch_fill", ratio(scheduled, max_requests))
    out.emit("sli:llm_paused_requests", g.get("inflight_batcher_specific_metric=paused_requests"))


class KvGauges:
    """A model's TRT-LLM KV-cache block gauges, as read (any may be missing)."""

    __slots__ = ("fraction", "free", "max_blocks", "reused", "used")

    def __init__(self, g: dict[str, float]) -> None:
        self.used = g.get("kv_cache_block_type=used")
        self.free = g.get("kv_cache_block_type=free")
        self.max_blocks = g.get("kv_cache_block_type=max")
        self.fraction = g.get("kv_cache_block_type=fraction")
        self.reused = g.get("kv_cache_block_type=reused")

    @property
    def present(self) -> bool:
        return not (
            self.used is None and self.free is None and self.max_blocks is None
            and self.fraction is None
        )

    @property
    def utilization(self) -> float | None:
        utilization = ratio(self.used, self.max_blocks)
        return self.fraction if utilization is None else utilization

    def consistent(self) -> bool:
        """Whether the gauges fit together (label values are positional in the TRT-LLM
        backend: a missing JSON key shifts them onto the wrong labels, §3)."""
        used, free, max_blocks, fraction = self.used, self.free, self.max_blocks, self.fraction
        if any(v is not None and v < 0 for v in (used, free, max_blocks, fraction, self.reused)):
            return False
        utilization = self.utilization
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

    def emit(self, out: SeriesOut) -> None:
        out.emit("sli:kv_cache_utilization", self.utilization)
        out.emit("sli:kv_cache_free_blocks", self.free)
        out.emit("sli:kv_cache_reuse_ratio", ratio(self.reused, self.used))
