"""GenAI-Perf-style summaries of probe results (avg, min, max, p50, p90, p95, p99)."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

from tritonwatch.schemas.probes import ProbeResult

STAT_KEYS = ("avg", "min", "max", "p50", "p90", "p95", "p99")


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default, as GenAI-Perf uses)."""
    if not sorted_values:
        raise ValueError("percentile of no values")
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile {q!r} outside [0, 100]")
    pos = (len(sorted_values) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    frac = pos - lo
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * frac


def describe(values: Iterable[float], scale: float = 1.0) -> dict[str, float | None]:
    """avg/min/max/p50/p90/p95/p99 of ``values`` times ``scale``; all None when empty."""
    data = sorted(v * scale for v in values)
    if not data:
        return dict.fromkeys(STAT_KEYS)
    return {
        "avg": math.fsum(data) / len(data),
        "min": data[0],
        "max": data[-1],
        "p50": percentile(data, 50),
        "p90": percentile(data, 90),
        "p95": percentile(data, 95),
        "p99": percentile(data, 99),
    }


def summarize(results: Sequence[ProbeResult], duration_s: float | None = None) -> dict[str, Any]:
    """One JSON-able object: counts, errors by class, and the latency distributions in ms.

    ``itl_ms`` describes the per-request mean gaps (GenAI-Perf's ITL); ``itl_pooled_ms``
    every single gap between consecutive tokens of every request.
    """
    ok = [r for r in results if r.ok]
    failed = [r for r in results if not r.ok]
    by_kind = Counter(r.error_kind or "unknown" for r in failed)
    tokens = sum(r.tokens for r in ok)
    out: dict[str, Any] = {
        "requests": len(results),
        "ok": len(ok),
        "errors": len(failed),
        "errors_by_kind": dict(sorted(by_kind.items())),
        "ttft_ms": describe((r.ttft_s for r in ok if r.ttft_s is not None), 1e3),
        "itl_ms": describe((r.itl_s for r in ok if r.itl_s is not None), 1e3),
        "itl_pooled_ms": describe((g for r in ok for g in r.gaps_s), 1e3),
        "tpot_ms": describe((r.tpot_s for r in ok if r.tpot_s is not None), 1e3),
        "e2e_ms": describe((r.e2e_s for r in ok if r.e2e_s is not None), 1e3),
        "output_tokens": describe(float(r.tokens) for r in ok),
        "output_tokens_total": tokens,
    }
    if failed:
        last = failed[-1]
        out["last_error"] = {
            "kind": last.error_kind, "code": last.error_code, "message": last.error_message,
        }
    if duration_s is not None and duration_s > 0:
        out["duration_s"] = duration_s
        out["request_throughput_per_s"] = len(ok) / duration_s
        out["output_token_throughput_per_s"] = tokens / duration_s
    return out
