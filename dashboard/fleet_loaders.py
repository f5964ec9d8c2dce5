"""Reads of the fleet and probe pages: each model's key SLIs against a week ago, probe rows.

Loaders as ``dashboard.loaders`` describes them (cached, plain arguments, plain values).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
import streamlit as st

from tritonwatch.dashboard.loaders import (
    PROBE_ROWS_LIMIT,
    SHORT_TTL,
    WEEK_S,
    inventory,
    store_for,
    url_part,
)
from tritonwatch.schemas.probes import ProbeResult
from tritonwatch.schemas.samples import label_value
from tritonwatch.store import Query, Store

# --- probes ----------------------------------------------------------------------------------


@st.cache_data(ttl=SHORT_TTL, show_spinner=False)
def probe_results(url: str, start: float, end: float, *, probe: str | None = None,
                  model: str | None = None, target: str | None = None,
                  limit: int = PROBE_ROWS_LIMIT) -> tuple[ProbeResult, ...]:
    """Probe requests in the window, newest ``limit`` kept (oldest first)."""
    rows = store_for(url).probe_results(probe=probe, start=start, end=end, limit=limit)
    return tuple(r for r in rows if (model is None or r.model == model)
                 and (target is None or r.target == target))


def probe_frame(rows: Sequence[ProbeResult]) -> pd.DataFrame:
    df = pd.DataFrame([{
        "ts": r.ts, "probe": r.probe, "target": r.target, "model": r.model,
        "protocol": r.protocol, "ok": r.ok, "tokens": r.tokens,
        "TTFT ms": None if r.ttft_s is None else r.ttft_s * 1000,
        "ITL ms": None if r.itl_s is None else r.itl_s * 1000,
        "e2e ms": None if r.e2e_s is None else r.e2e_s * 1000,
        "error kind": r.error_kind or "", "error": r.error_message or "",
    } for r in rows], columns=["ts", "probe", "target", "model", "protocol", "ok", "tokens",
                               "TTFT ms", "ITL ms", "e2e ms", "error kind", "error"])
    df.insert(0, "time", pd.to_datetime(df["ts"], unit="s", utc=True))
    return df.drop(columns="ts")


@st.cache_data(ttl=SHORT_TTL, show_spinner=False)
def probe_percentiles(url: str, model: str, target: str | None, start: float, end: float,
                      step: float) -> pd.DataFrame:
    """p50/p95/p99 of TTFT, ITL and e2e (ms) of successful probe requests per bucket."""
    df = probe_frame(probe_results(url, start, end, model=model, target=target))
    df = df[df["ok"]]
    if df.empty:
        return pd.DataFrame(columns=["time", "metric", "percentile", "ms"])
    df = df.assign(bucket=df["time"].dt.floor(f"{int(step)}s"))
    out = []
    for metric in ("TTFT ms", "ITL ms", "e2e ms"):
        grouped = df.dropna(subset=[metric]).groupby("bucket")[metric]
        for q in (50, 95, 99):
            part = grouped.quantile(q / 100).reset_index()
            part.columns = ["time", "ms"]
            part["metric"] = metric.removesuffix(" ms")
            part["percentile"] = f"p{q}"
            out.append(part)
    return pd.concat(out, ignore_index=True)[["time", "metric", "percentile", "ms"]]


# --- fleet -----------------------------------------------------------------------------------

#: Fleet columns: (column, series, how versions combine, display scale, unit text).
FLEET_SLIS = (
    ("req/s", "sli:request_rate", "sum", 1.0),
    ("success %", "sli:success_ratio", "mean", 100.0),
    ("fill %", "sli:batch_fill_rate", "mean", 100.0),
    ("KV cache %", "sli:kv_cache_utilization", "mean", 100.0),
    ("queue ms", "sli:queue_time_seconds", "mean", 1000.0),
)


def _window_means(store: Store, name: str, start: float, end: float,
                  how: str) -> dict[tuple[str, str], float]:
    """Per (target, model): the mean of each series' points in the window, versions summed
    or averaged."""
    span = end - start
    cols = store.read(Query(name, start=start, end=end, step=max(span, 1.0), agg="avg"))
    sums, counts = cols.finite_sums()
    acc: dict[tuple[str, str], list[float]] = defaultdict(list)
    for key, s, n in zip(cols.keys, sums.tolist(), counts.tolist(), strict=True):
        model = label_value(key.labels, "model")
        if model and n:
            acc[(key.target, model)].append(s / n)
    return {k: (sum(v) if how == "sum" else sum(v) / len(v)) for k, v in acc.items()}


def _p95_ttft(url: str, start: float, end: float) -> dict[tuple[str, str], float]:
    rows = probe_results(url, start, end)
    acc: dict[tuple[str, str], list[float]] = defaultdict(list)
    for r in rows:
        if r.ok and r.ttft_s is not None:
            acc[(r.target, r.model)].append(r.ttft_s * 1000)
    return {k: float(np.percentile(v, 95)) for k, v in acc.items()}


@st.cache_data(ttl=SHORT_TTL, show_spinner=False)
def fleet_models(url: str, now: float, window: float) -> pd.DataFrame:
    """A row per (target, model): each key SLI over the last ``window`` and its change
    against the same window a week earlier (percent; empty without week-old data)."""
    store = store_for(url)
    current: dict[str, dict[tuple[str, str], float]] = {}
    before: dict[str, dict[tuple[str, str], float]] = {}
    for column, name, how, scale in FLEET_SLIS:
        cur = _window_means(store, name, now - window, now, how)
        old = _window_means(store, name, now - WEEK_S - window, now - WEEK_S, how)
        current[column] = {k: v * scale for k, v in cur.items()}
        before[column] = {k: v * scale for k, v in old.items()}
    current["TTFT p95 ms"] = _p95_ttft(url, now - window, now)
    before["TTFT p95 ms"] = _p95_ttft(url, now - WEEK_S - window, now - WEEK_S)
    models = {(t, m) for t, m, _ in inventory(url).itertuples(index=False)}
    rows = []
    for target, model in sorted(models):
        row: dict[str, Any] = {"target": target, "model": model}
        for column in current:
            v = current[column].get((target, model))
            b = before[column].get((target, model))
            row[column] = v
            row[f"{column} vs week ago"] = (
                None if v is None or b is None or b == 0 else (v - b) / abs(b) * 100)
        row["details"] = f"/model?target={url_part(target)}&model={url_part(model)}"
        rows.append(row)
    return pd.DataFrame(rows)
