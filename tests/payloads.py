"""Synthetic but realistic Triton ``/metrics`` payloads, for tests and benchmarks.

``triton_payload()`` with its defaults (20 models, 8 GPUs, TRT-LLM on) writes 2,879 series
(``series_count``) in about 390 KB, shaped like a real multi-model LLM server:

* every model has the core per-model families (success, failure by reason, counts, the five
  cumulative duration counters, pending requests, load time);
* two models in three run KIND_GPU instances on 2-6 GPUs, so their request counters split by
  ``gpu_uuid`` (the model-level reporters, pending count and load time, do not);
* those same models have ``summary_latencies`` on (quantile series, NaN while idle), and the
  LLM models have the TTFT histogram ``nv_inference_first_response_histogram_ms``;
* per-GPU DCGM gauges and the energy counter, CPU and pinned-memory gauges;
* the TRT-LLM backend families for the ``tensorrt_llm*`` models.

Text is written the way prometheus-cpp does: HELP then TYPE then the series, labels in
alphabetical order with ``le``/``quantile`` last, series in an arbitrary (seeded) order inside a
family, integral values without a decimal point, ``+Inf``/``NaN`` spelled so.

Counters are ``base + rate * step`` with non-negative per-series rates, so payloads with
``step=0`` and ``step=1`` read as two consecutive scrapes of the same server.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable

__all__ = ["Template", "series_count", "triton_payload"]

_RngFactory = Callable[..., random.Random]

_FAILURE_REASONS = ("REJECTED", "CANCELED", "BACKEND", "OTHER")
_QUANTILES = ("0.5", "0.9", "0.95", "0.99", "0.999")
_TTFT_BUCKETS = ("100", "500", "2000", "5000")

# (family, HELP text) exactly as Triton prints them.
_PER_MODEL_COUNTERS = (
    ("nv_inference_request_success", "Number of successful inference requests, all batch sizes"),
    ("nv_inference_request_failure", "Number of failed inference requests, all batch sizes"),
    ("nv_inference_count", "Number of inferences performed (does not include cached requests)"),
    (
        "nv_inference_exec_count",
        "Number of model executions performed (does not include cached requests)",
    ),
    (
        "nv_inference_request_duration_us",
        "Cumulative inference request duration in microseconds (includes cached requests)",
    ),
    (
        "nv_inference_queue_duration_us",
        "Cumulative inference queuing duration in microseconds (includes cached requests)",
    ),
    (
        "nv_inference_compute_input_duration_us",
        "Cumulative compute input duration in microseconds (does not include cached requests)",
    ),
    (
        "nv_inference_compute_infer_duration_us",
        "Cumulative compute inference duration in microseconds (does not include cached requests)",
    ),
    (
        "nv_inference_compute_output_duration_us",
        "Cumulative inference compute output duration in microseconds "
        "(does not include cached requests)",
    ),
)
_SUMMARIES = (
    (
        "nv_inference_request_summary_us",
        "Summary of inference request duration in microseconds (includes cached requests)",
    ),
    (
        "nv_inference_queue_summary_us",
        "Summary of inference queuing duration in microseconds (includes cached requests)",
    ),
    (
        "nv_inference_compute_input_summary_us",
        "Summary of compute input duration in microseconds (does not include cached requests)",
    ),
    (
        "nv_inference_compute_infer_summary_us",
        "Summary of compute inference duration in microseconds (does not include cached requests)",
    ),
    (
        "nv_inference_compute_output_summary_us",
        "Summary of compute output duration in microseconds (does not include cached requests)",
    ),
)
_MODEL_NAMES = (
    "tensorrt_llm",
    "preprocessing",
    "postprocessing",
    "ensemble",
    "tensorrt_llm_bls",
    "resnet50_trt",
    "bert_onnx",
    "yolov8_trt",
    "whisper_encoder",
    "embedding_e5",
)


class _Model:
    def __init__(self, index: int, gpus: list[str], rng: random.Random) -> None:
        base = _MODEL_NAMES[index % len(_MODEL_NAMES)]
        self.index = index
        self.name = base if index < len(_MODEL_NAMES) else f"{base}_{index // len(_MODEL_NAMES)}"
        self.version = str(1 + index % 3)
        self.trtllm = base.startswith("tensorrt_llm") and not base.endswith("_bls")
        self.llm = base in {"tensorrt_llm", "ensemble", "tensorrt_llm_bls"}
        self.summaries = index % 3 != 2
        # KIND_GPU instances on several GPUs split the per-request counters by gpu_uuid.
        if index % 3 != 2 and gpus:
            width = 2 + index % max(1, len(gpus) - 3)
            start = index % len(gpus)
            self.gpu_uuids: list[str | None] = [
                gpus[(start + k) % len(gpus)] for k in range(min(width, len(gpus)))
            ]
        else:
            self.gpu_uuids = [None]
        self.rps = rng.choice((0.0, 0.5, 3.0, 40.0, 250.0))
        self.latency_us = rng.uniform(800, 90_000) if not self.llm else rng.uniform(2e5, 4e6)
        self.load_secs = round(rng.uniform(0.2, 95.0), 6)


class _Writer:
    """Collects lines family by family, shuffling series inside a family (hash order)."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.lines: list[str] = []
        self._series: list[str] = []

    def family(self, name: str, help_text: str, typ: str) -> None:
        self._flush()
        self.lines.append(f"# HELP {name} {help_text}")
        self.lines.append(f"# TYPE {name} {typ}")

    def series(self, name: str, labels: dict[str, str], value: float, last: str = "") -> None:
        # prometheus-cpp: ordinary labels sorted, then `le`/`quantile` last.
        parts = [f'{k}="{v}"' for k, v in sorted(labels.items()) if k != last]
        if last:
            parts.append(f'{last}="{labels[last]}"')
        self._series.append(f"{name}{{{','.join(parts)}}} {_fmt(value)}")

    def text(self) -> str:
        self._flush()
        return "\n".join(self.lines) + "\n"

    def _flush(self) -> None:
        self.rng.shuffle(self._series)
        self.lines.extend(self._series)
        self._series = []


def _fmt(value: float) -> str:
    """A double the way recent prometheus-cpp prints it."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value == int(value) and abs(value) < 1e15:
        return str(int(value))
    return repr(value)


def _labels(model: _Model, gpu: str | None = None, **extra: str) -> dict[str, str]:
    labels = {"model": model.name, "version": model.version, **extra}
    if gpu is not None:
        labels["gpu_uuid"] = gpu
    return labels


def _counter(seed_rng: random.Random, rate: float, step: int, integral: bool = True) -> float:
    """A cumulative value: random history plus `rate` per scrape for each step."""
    base = seed_rng.uniform(0, 5000) * rate
    jitter = seed_rng.uniform(0.7, 1.3)
    value = base + rate * jitter * step
    return float(math.floor(value)) if integral else value


def triton_payload(
    models: int = 20, gpus: int = 8, trtllm: bool = True, seed: int = 0, step: int = 0
) -> str:
    """One scrape of a synthetic Triton server; see the module docstring for its shape.

    ``seed`` fixes the server (names, rates, series order); ``step`` advances the counters by
    one scrape interval.
    """
    shape = random.Random(seed)
    gpu_uuids = [
        "GPU-" + "-".join(
            "".join(shape.choice("0123456789abcdef") for _ in range(n)) for n in (8, 4, 4, 4, 12)
        )
        for _ in range(gpus)
    ]
    model_list = [_Model(i, gpu_uuids, shape) for i in range(models)]
    if not trtllm:
        for m in model_list:
            m.trtllm = False
    w = _Writer(random.Random(seed * 7919 + step))

    def series_rng(*key: object) -> random.Random:
        # Per-series randomness that does not depend on `step`, so counters stay monotonic.
        return random.Random(f"{seed}:{':'.join(map(str, key))}")

    for family, help_text in _PER_MODEL_COUNTERS:
        w.family(family, help_text, "counter")
        for m in model_list:
            for gpu in m.gpu_uuids:
                share = m.rps / len(m.gpu_uuids)
                for reason in _FAILURE_REASONS if family.endswith("_failure") else ("",):
                    rng = series_rng(family, m.name, gpu, reason)
                    if reason:
                        rate = share * {"REJECTED": 0.01, "OTHER": 0.002}.get(reason, 0.0)
                        labels = _labels(m, gpu, reason=reason)
                    else:
                        rate = share * _rate_factor(family, m)
                        labels = _labels(m, gpu)
                    # Some duration counters carry fractions (4879631.328000044 style).
                    integral = not family.endswith("_us") or m.index % 4 != 1
                    w.series(family, labels, _counter(rng, rate, step, integral))

    w.family(
        "nv_inference_pending_request_count",
        "Instantaneous number of pending requests awaiting execution per-model.",
        "gauge",
    )
    for m in model_list:
        pending = series_rng("pending", m.name, step).choice((0, 0, 0, 1, 3, 17))
        w.series("nv_inference_pending_request_count", _labels(m), pending)
    w.family("nv_model_load_duration_secs", "Model load time in seconds", "gauge")
    for m in model_list:
        w.series("nv_model_load_duration_secs", _labels(m), m.load_secs)

    for family, help_text in _SUMMARIES:
        w.family(family, help_text, "summary")
        for m in model_list:
            if not m.summaries:
                continue
            for gpu in m.gpu_uuids:
                rng = series_rng(family, m.name, gpu)
                idle = m.rps == 0
                mean = m.latency_us * (0.1 if "queue" in family else 0.6)
                for i, q in enumerate(_QUANTILES):
                    spread = (1 + i * 0.4) * rng.uniform(0.9, 1.1)
                    value = math.nan if idle else round(mean * spread)
                    w.series(family, _labels(m, gpu, quantile=q), value, last="quantile")
                count = _counter(rng, m.rps / len(m.gpu_uuids), step)
                w.series(family + "_sum", _labels(m, gpu), count * mean)
                w.series(family + "_count", _labels(m, gpu), count)

    w.family(
        "nv_inference_first_response_histogram_ms",
        "Duration from request to first response in milliseconds",
        "histogram",
    )
    for m in model_list:
        if not m.llm:
            continue
        rng = series_rng("ttft", m.name)
        count = _counter(rng, m.rps, step)
        cumulative = 0.0
        for fraction, le in zip((0.35, 0.8, 0.97, 0.995), _TTFT_BUCKETS, strict=True):
            cumulative = max(cumulative, math.floor(count * fraction))
            w.series(
                "nv_inference_first_response_histogram_ms_bucket",
                _labels(m, le=le),
                cumulative,
                last="le",
            )
        w.series(
            "nv_inference_first_response_histogram_ms_bucket", _labels(m, le="+Inf"), count, "le"
        )
        w.series("nv_inference_first_response_histogram_ms_sum", _labels(m), count * 412.5)
        w.series("nv_inference_first_response_histogram_ms_count", _labels(m), count)

    _gpu_families(w, gpu_uuids, series_rng, step)
    _host_families(w, series_rng, step)
    if trtllm:
        _trtllm_families(w, [m for m in model_list if m.trtllm], series_rng, step)
    return w.text()


def _rate_factor(family: str, m: _Model) -> float:
    # Per request: items per request (batching), executions, and microseconds per request.
    return {
        "nv_inference_request_success": 1.0,
        "nv_inference_count": 4.0,
        "nv_inference_exec_count": 0.6,
        "nv_inference_request_duration_us": m.latency_us,
        "nv_inference_queue_duration_us": m.latency_us * 0.1,
        "nv_inference_compute_input_duration_us": m.latency_us * 0.05,
        "nv_inference_compute_infer_duration_us": m.latency_us * 0.7,
        "nv_inference_compute_output_duration_us": m.latency_us * 0.05,
    }[family]


def _gpu_families(w: _Writer, gpu_uuids: list[str], series_rng: _RngFactory, step: int) -> None:
    specs = (
        ("nv_gpu_utilization", "GPU utilization rate [0.0 - 1.0)", "gauge"),
        ("nv_gpu_memory_total_bytes", "GPU total memory, in bytes", "gauge"),
        ("nv_gpu_memory_used_bytes", "GPU used memory, in bytes", "gauge"),
        ("nv_gpu_power_usage", "GPU power usage in watts", "gauge"),
        ("nv_gpu_power_limit", "GPU power management limit in watts", "gauge"),
        (
            "nv_energy_consumption",
            "GPU energy consumption in joules since the Triton Server started",
            "counter",
        ),
    )
    for family, help_text, typ in specs:
        w.family(family, help_text, typ)
        for gpu in gpu_uuids:
            rng = series_rng(family, gpu, step)
            value: float
            if family == "nv_gpu_utilization":
                value = round(rng.uniform(0, 1), 2)
            elif family == "nv_gpu_memory_total_bytes":
                value = 150_754_820_096
            elif family == "nv_gpu_memory_used_bytes":
                value = rng.randrange(2_000, 140_000) * 1024 * 1024
            elif family == "nv_gpu_power_usage":
                value = round(rng.uniform(70, 690), 3)
            elif family == "nv_gpu_power_limit":
                value = 700
            else:
                value = _counter(series_rng(family, gpu), 3500.0, step, integral=False)
            w.series(family, {"gpu_uuid": gpu}, value)


def _host_families(w: _Writer, series_rng: _RngFactory, step: int) -> None:
    rng = series_rng("host", step)
    plain = (
        ("nv_cpu_utilization", "CPU utilization rate [0.0 - 1.0]", rng.uniform(0, 1)),
        ("nv_cpu_memory_total_bytes", "CPU total memory (RAM), in bytes", 2_163_473_334_272),
        (
            "nv_cpu_memory_used_bytes",
            "CPU used memory (RAM), in bytes",
            rng.randrange(10**10, 10**12),
        ),
        (
            "nv_pinned_memory_pool_total_bytes",
            "Pinned memory pool total memory size, in bytes",
            268_435_456,
        ),
        (
            "nv_pinned_memory_pool_used_bytes",
            "Pinned memory pool used memory size, in bytes",
            rng.randrange(0, 268_435_456, 256),
        ),
    )
    for family, help_text, value in plain:
        w.family(family, help_text, "gauge")
        w.lines.append(f"{family} {_fmt(value)}")


def _trtllm_families(
    w: _Writer, models: list[_Model], series_rng: _RngFactory, step: int
) -> None:
    if not models:
        return
    w.family("nv_trt_llm_request_metrics", "TRT LLM request metrics", "gauge")
    for m in models:
        rng = series_rng("req", m.name, step)
        active = rng.randrange(0, 256)
        scheduled = min(active, rng.randrange(0, 128))
        values = {
            "active": active,
            "max": 256,
            "scheduled": scheduled,
            "context": min(scheduled, rng.randrange(0, 8)),
            "waiting": active - scheduled,
        }
        for kind, v in values.items():
            w.series("nv_trt_llm_request_metrics", _labels(m, request_type=kind), v)

    w.family("nv_trt_llm_runtime_memory_metrics", "TRT LLM runtime memory metrics", "gauge")
    for m in models:
        for kind, v in (("cpu", 0), ("gpu", 1_610_236 + len(m.name)), ("pinned", 0)):
            w.series("nv_trt_llm_runtime_memory_metrics", _labels(m, memory_type=kind), v)

    w.family("nv_trt_llm_kv_cache_block_metrics", "TRT LLM KV cache block metrics", "gauge")
    for m in models:
        rng = series_rng("kv", m.name, step)
        max_blocks = 6239
        used = rng.randrange(0, max_blocks)
        kv: dict[str, float] = {
            "max": max_blocks,
            "free": max_blocks - used,
            "used": used,
            "tokens_per": 64,
            "reused": rng.randrange(0, used + 1),
            "fraction": used / max_blocks,
        }
        for kind, share in kv.items():
            w.series(
                "nv_trt_llm_kv_cache_block_metrics", _labels(m, kv_cache_block_type=kind), share
            )

    w.family(
        "nv_trt_llm_inflight_batcher_metrics", "TRT LLM inflight_batcher-specific metrics", "gauge"
    )
    for m in models:
        rng = series_rng("ifb", m.name, step)
        for kind in ("micro_batch_id", "generation_requests", "total_context_tokens",
                     "paused_requests"):
            v = 0 if kind == "micro_batch_id" else rng.randrange(0, 4096)
            w.series(
                "nv_trt_llm_inflight_batcher_metrics",
                _labels(m, inflight_batcher_specific_metric=kind),
                v,
            )

    w.family("nv_trt_llm_general_metrics", "General TRT LLM metrics", "gauge")
    for m in models:
        iteration = _counter(series_rng("iter", m.name), 150.0, step)
        w.series("nv_trt_llm_general_metrics", _labels(m, general_type="iteration_counter"),
                 iteration)
        # Microseconds since the epoch, as TRT-LLM reports it since mid-2024.
        timestamp = 1_764_480_000_000_000 + step * 15_000_000
        w.series("nv_trt_llm_general_metrics", _labels(m, general_type="timestamp"), timestamp)


class Template:
    """One simulated server: fixed series order, values ``v0 + step * (v1 - v0)``."""

    def __init__(self, seed: int, models: int, gpus: int) -> None:
        first = triton_payload(models=models, gpus=gpus, seed=seed, step=0).splitlines()
        second = triton_payload(models=models, gpus=gpus, seed=seed, step=1).splitlines()
        later = {}
        for line in second:
            if line and line[0] != "#":
                head, _, value = line.rpartition(" ")
                later[head] = value
        self.parts: list[tuple[str, float, float] | str] = []
        typ = ""
        for line in first:
            if not line or line[0] == "#":
                if line.startswith("# TYPE "):
                    typ = line.rsplit(" ", 1)[1]
                self.parts.append(line)
                continue
            head, _, value = line.rpartition(" ")
            v0, v1 = float(value), float(later.get(head, value))
            # Counters (and histogram/summary counts and sums) advance; gauges and quantiles
            # keep their first value, so related gauges (KV-cache used/free/max) stay coherent.
            grows = typ == "counter" or (
                typ in ("histogram", "summary") and "quantile=" not in head
            )
            dv = v1 - v0 if grows and v1 == v1 and v0 == v0 else 0.0
            self.parts.append((head + " ", v0, dv))
        self.series = sum(1 for p in self.parts if not isinstance(p, str))

    def render(self, step: int) -> bytes:
        out = []
        for p in self.parts:
            if isinstance(p, str):
                out.append(p)
            else:
                head, v0, dv = p
                v = v0 + step * dv
                out.append(head + ("NaN" if v != v else repr(v) if v != int(v) else str(int(v))))
        out.append("")
        return "\n".join(out).encode()



def series_count(text: str) -> int:
    """Number of sample lines (neither blank nor a comment) in a text payload."""
    count = 0
    for line in text.split("\n"):
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            count += 1
    return count

