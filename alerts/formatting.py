"""How the alert annotations (and the dashboard, quoting the same figures) write series names,
values and changes."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tritonwatch.schemas.samples import Labels

#: How series are named in annotations, and their unit ("ratio", "s", "req/s", "").
DISPLAY: dict[str, tuple[str, str]] = {
    "sli:batch_fill_rate": ("batch fill rate", "ratio"),
    "sli:stats_batch_fill_rate": ("batch fill rate (stats)", "ratio"),
    "sli:avg_batch_size": ("average batch size", ""),
    "sli:kv_cache_utilization": ("KV-cache utilization", "ratio"),
    "sli:kv_cache_free_blocks": ("free KV-cache blocks", ""),
    "sli:gpu_utilization": ("GPU utilization", "ratio"),
    "sli:gpu_utilization_ratio": ("GPU utilization", "ratio"),
    "sli:request_rate": ("request rate", "req/s"),
    "sli:queue_time_seconds": ("queue time", "s"),
    "sli:compute_time_seconds": ("compute time", "s"),
    "sli:pending_requests": ("pending requests", ""),
    "sli:llm_waiting_requests": ("waiting requests", ""),
    "sli:llm_paused_requests": ("paused requests", ""),
    "sli:llm_active_requests": ("requests in flight", ""),
    "sli:prompt_tokens_rate": ("prompt-token rate", "tokens/s"),
    "sli:success_ratio": ("success ratio", "ratio"),
    "sli:ttft_seconds": ("server TTFT", "s"),
    "sli:itl_seconds": ("server ITL", "s"),
    "probe:ttft_seconds": ("TTFT", "s"),
    "probe:itl_seconds": ("ITL", "s"),
    "probe:e2e_seconds": ("end-to-end latency", "s"),
}


def fmt_value(value: float, unit: str) -> str:
    if unit == "ratio":
        return f"{value * 100:.0f} %"
    if unit == "s":
        return f"{value * 1000:.0f} ms" if abs(value) < 1 else f"{value:.2f} s"
    if unit in ("req/s", "tokens/s"):
        return f"{value:.3g} {unit}"
    return f"{value:.3g}"


def fmt_change(current: float, baseline: float) -> str:
    """``+38 %`` / ``-25 %`` for moderate changes, a factor (times sign, ``3.0``) past 2."""
    if baseline == 0:
        return "new" if current != 0 else "±0 %"
    ratio = current / baseline
    if ratio >= 2 and baseline > 0:
        return f"\u00d7{ratio:.1f}"
    return f"{(ratio - 1) * 100:+.0f} %"


def display(series: str) -> tuple[str, str]:
    return DISPLAY.get(series, (series, ""))



def where(labels: Labels) -> str:
    """``model=llm, version=2``: an instance's labels in a sentence (``all`` without any)."""
    return ", ".join(f"{k}={v}" for k, v in labels) or "all"
