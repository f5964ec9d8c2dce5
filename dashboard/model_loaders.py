"""Reads of the model and LLM pages: latency breakdown, batch sizes, deploy markers, "why".

Loaders as ``dashboard.loaders`` describes them (cached, plain arguments, plain values).
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import streamlit as st

from tritonwatch.alerts.moved import Moved, moved_with
from tritonwatch.dashboard.loaders import (
    SHORT_TTL,
    match_labels,
    store_for,
)
from tritonwatch.schemas.samples import Labels, label_value
from tritonwatch.store import Query, Store

_Arrays = list[np.ndarray[Any, Any]]


def _bucket_increase(store: Store, name: str, start: float, end: float, step: float,
                     target: str | None, match: dict[str, str] | None
                     ) -> tuple[list[Labels], _Arrays, _Arrays, _Arrays]:
    """Per series: bucket starts, reset-aware increase per bucket (from each bucket's last
    value against the previous bucket's), and whether a reset happened in the bucket (its
    minimum below the previous bucket's last value)."""
    last = store.read(Query(name, start=start, end=end, step=step, agg="last",
                            target=target, match=match))
    low = store.read(Query(name, start=start, end=end, step=step, agg="min",
                           target=target, match=match))
    lows = {k: low.values[low.bounds[i]:low.bounds[i + 1]] for i, k in enumerate(low.keys)}
    labels, stamps, incs, resets = [], [], [], []
    for i, key in enumerate(last.keys):
        lo, hi = last.bounds[i], last.bounds[i + 1]
        ts, v = last.ts[lo:hi], last.values[lo:hi]
        mins = lows.get(key, v)
        if len(v) < 2 or len(mins) != len(v):
            continue
        prev = v[:-1]
        reset = mins[1:] < prev
        inc = np.where(v[1:] >= prev, v[1:] - prev, v[1:])
        labels.append(key.labels)
        stamps.append(ts[1:])
        incs.append(inc)
        resets.append(reset)
    return labels, stamps, incs, resets


_LATENCY_PARTS = (
    ("queue", "nv_inference_queue_duration_us"),
    ("compute input", "nv_inference_compute_input_duration_us"),
    ("compute infer", "nv_inference_compute_infer_duration_us"),
    ("compute output", "nv_inference_compute_output_duration_us"),
)


@st.cache_data(ttl=SHORT_TTL, show_spinner=False)
def latency_breakdown(url: str, target: str, model: str, version: str | None,
                      start: float, end: float, step: float) -> pd.DataFrame:
    """Milliseconds per successful request spent in each part, per bucket (summed over
    versions unless one is chosen)."""
    store = store_for(url)
    match = match_labels(model, version)
    _, ts_s, inc_s, _ = _bucket_increase(store, "nv_inference_request_success", start, end,
                                         step, target, match)
    requests: dict[float, float] = defaultdict(float)
    for ts, inc in zip(ts_s, inc_s, strict=True):
        for t, n in zip(ts.tolist(), inc.tolist(), strict=True):
            requests[t] += n
    rows = []
    for part, name in _LATENCY_PARTS:
        spent: dict[float, float] = defaultdict(float)
        _, ts_p, inc_p, _ = _bucket_increase(store, name, start, end, step, target, match)
        for ts, inc in zip(ts_p, inc_p, strict=True):
            for t, us in zip(ts.tolist(), inc.tolist(), strict=True):
                spent[t] += us
        for t, us in spent.items():
            if requests.get(t, 0) > 0:
                rows.append({"ts": t, "part": part, "ms": us / requests[t] / 1000})
    df = pd.DataFrame(rows, columns=["ts", "part", "ms"])
    df.insert(0, "time", pd.to_datetime(df["ts"], unit="s", utc=True))
    return df.drop(columns="ts")


@st.cache_data(ttl=SHORT_TTL, show_spinner=False)
def batch_sizes(url: str, target: str, model: str, start: float, end: float,
                step: float) -> pd.DataFrame:
    """Executions per batch size in the window (statistics API's batch_stats)."""
    store = store_for(url)
    labels, _, incs, _ = _bucket_increase(store, "triton_stats_batch_executions", start, end,
                                          step, target, {"model": model})
    total: dict[int, float] = defaultdict(float)
    for lbl, inc in zip(labels, incs, strict=True):
        size = label_value(lbl, "batch_size")
        if size.isdigit():
            total[int(size)] += float(inc.sum())
    return pd.DataFrame(sorted(total.items()), columns=["batch_size", "executions"])


@dataclass(frozen=True)
class Marker:
    """A deploy marker: something about the model changed at ``ts``."""

    ts: float
    kind: str  # "version added", "version removed", "config written", "reload"
    detail: str


@st.cache_data(ttl=SHORT_TTL, show_spinner=False)
def deploy_markers(url: str, target: str, model: str, start: float, end: float,
                   step: float) -> tuple[Marker, ...]:
    """Versions appearing or disappearing, the model config written, counter resets."""
    store = store_for(url)
    out: list[Marker] = []
    cols = store.read(Query("nv_inference_request_success", start=start - step,
                            end=end, step=step, agg="last", target=target,
                            match={"model": model}))
    # The target's own scrapes bound what "appeared" and "disappeared" mean: a version first
    # seen when the store itself started was not deployed then.
    up = store.read(Query("up", start=start - step, end=end, step=step, agg="last",
                          target=target))
    scraped = up.ts[np.isfinite(up.values)] if up.keys else np.empty(0)
    first_up = float(scraped.min()) if len(scraped) else math.inf
    last_up = float(scraped.max()) if len(scraped) else -math.inf
    for i, key in enumerate(cols.keys):
        ts = cols.ts[cols.bounds[i]:cols.bounds[i + 1]]
        version = label_value(key.labels, "version") or "?"
        if ts[0] > first_up + step:
            out.append(Marker(float(ts[0]), "version added", f"version {version}"))
        if ts[-1] < last_up - step:
            out.append(Marker(float(ts[-1]) + step, "version removed", f"version {version}"))
    labels, stamps, _, resets = _bucket_increase(
        store, "nv_inference_request_success", start, end, step, target, {"model": model})
    for lbl, ts, reset in zip(labels, stamps, resets, strict=True):
        for t in ts[reset].tolist():
            out.append(Marker(t, "reload", f"counters reset (version "
                                           f"{label_value(lbl, 'version') or '?'})"))
    written = store.model_config_times(target).get((target, model))
    if written is not None and start <= written <= end:
        out.append(Marker(written, "config written", "model config changed or first read"))
    return tuple(sorted(out, key=lambda m: m.ts))


# --- why -------------------------------------------------------------------------------------

#: The server-side parts that could explain a slower first token, as the regression rules'
#: "what moved with it" names them (alerts/moved.py).
WHY_SERIES = (
    "sli:queue_time_seconds",
    "sli:compute_time_seconds",
    "sli:kv_cache_utilization",
    "sli:llm_waiting_requests",
    "sli:pending_requests",
    "sli:batch_fill_rate",
    "sli:gpu_utilization",
)


@dataclass(frozen=True)
class Why:
    """The probe latency of a model over the second half of the window against the first,
    and what moved with it (``alerts.moved.moved_with``)."""

    latency: Moved | None
    moved: tuple[Moved, ...]
    recent: tuple[float, float]
    baseline: tuple[float, float]
    throttled: float | None  # share of GPU throttle readings in the recent half


@st.cache_data(ttl=SHORT_TTL, show_spinner=False)
def why(url: str, target: str, model: str, start: float, end: float, step: float) -> Why:
    store = store_for(url)
    # Halves of the span the model's probe latency covers in the range (not of the range
    # itself, which may reach before the first probe).
    seen = store.read(Query("probe:ttft_seconds", start=start, end=end, step=step,
                            agg="avg", target=target, match={"model": model}))
    lo, hi = (float(seen.ts.min()), float(seen.ts.max()) + step) if seen.keys else (start, end)
    mid = (lo + hi) / 2
    recent, baseline = (mid, hi), (lo, mid)
    latency = None
    for name in ("probe:ttft_seconds", "probe:e2e_seconds"):
        found = moved_with(store, target, {"model": model}, recent=recent, baseline=baseline,
                           names=[name], step=step)
        if found and found[0].baseline is not None:
            latency = found[0]
            break
    moved = moved_with(store, target, {"model": model}, recent=recent, baseline=baseline,
                       names=WHY_SERIES, step=step)
    throttle = store.read(Query("sli:gpu_throttling", start=recent[0], end=recent[1],
                                step=step, agg="avg"))
    finite = throttle.values[np.isfinite(throttle.values)]
    return Why(latency, tuple(moved), recent, baseline,
               float(finite.mean()) if len(finite) else None)
