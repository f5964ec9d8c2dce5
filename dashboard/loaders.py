"""Every read of the dashboard: cached functions over the store and the alert layer.

Pages never touch the store: they call these.  Each loader takes plain, hashable arguments
(the store URL, names, times rounded to ``TIME_QUANTUM_S``) so that ``st.cache_data`` serves
every viewer of the same window from one read, and returns plain values (pandas frames,
tuples, dataclasses) that pickle.  TTLs follow how fast the data changes: series and health
every scrape interval, configs and SLO budgets once a minute.

Nothing here writes: the store is opened ``read_only`` (the database refuses writes) and
``create_schema`` is never called.  No SQL: the store and alert layers own it.
"""

from __future__ import annotations

import math
import os
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import numpy as np
import pandas as pd
import streamlit as st

from tritonwatch.alerts import slo as slo_maths
from tritonwatch.alerts.moved import Moved, moved_with
from tritonwatch.schemas.alerts import AlertEvent, AlertState
from tritonwatch.schemas.config import ConfigError, load_config
from tritonwatch.schemas.probes import ProbeResult
from tritonwatch.schemas.rules import SloSpec, load_rules_file
from tritonwatch.schemas.samples import Labels, label_value
from tritonwatch.store import SeriesColumns, Store, StoreError, open_store
from tritonwatch.store.alerts import AlertStore
from tritonwatch.store.reports import ReportStore

#: Environment variable naming the config file (``tritonwatch dashboard --config``).
CONFIG_ENV = "TRITONWATCH_DASHBOARD_CONFIG"
#: "Now" is rounded up to this, so that reruns within it hit the cache (up: the newest
#: samples are always inside the window).
TIME_QUANTUM_S = 5.0
#: The most points one chart line gets: longer ranges use wider buckets (and rollups).
MAX_POINTS = 400
#: Probe result rows read for one chart or table at most (a probe every 30 s, 4 requests a
#: run, makes 11,520 a day).
PROBE_ROWS_LIMIT = 20_000
#: Alert history rows read at most.
EVENT_ROWS_LIMIT = 5_000
WEEK_S = 7 * 86400.0

SHORT_TTL = 10
LONG_TTL = 60


class DashboardError(RuntimeError):
    """The dashboard cannot start reading: a bad config, a store that cannot be reached."""


@dataclass(frozen=True)
class Settings:
    """What the dashboard reads, from the config file (or the embedded defaults)."""

    store_url: str
    store_redacted: str
    rules_file: str | None
    probes: tuple[str, ...]
    scrape_interval: float
    #: Per probe: (name, target, model, ttft_slo s, itl_slo s); thresholds may be None.
    probe_slos: tuple[tuple[str, str | None, str, float | None, float | None], ...] = ()

    def thresholds(self, model: str) -> tuple[float | None, float | None]:
        """The TTFT and ITL SLO thresholds (s) of the first probe of ``model`` with any."""
        for _, _, m, ttft, itl in self.probe_slos:
            if m == model and (ttft is not None or itl is not None):
                return ttft, itl
        return None, None


def config_path() -> str | None:
    return os.environ.get(CONFIG_ENV) or None


@st.cache_resource
def settings(path: str | None) -> Settings:
    try:
        config = load_config(path)
    except ConfigError as exc:
        raise DashboardError(f"{exc.source}: " + "; ".join(exc.errors)) from None
    store = _store(config.store.url)
    return Settings(
        config.store.url, store.url_redacted,
        None if config.alerting.rules_file is None else str(config.alerting.rules_file),
        tuple(p.name for p in config.probes), config.scrape.interval,
        tuple((p.name, p.target, p.model, p.ttft_slo, p.itl_slo) for p in config.probes),
    )


@st.cache_resource
def _store(url: str) -> Store:
    # One read-only store (a connection pool) per URL for the whole server process.
    return open_store(url, read_only=True, timeout_s=5.0)


def now_quantized(now: float | None = None) -> float:
    t = time.time() if now is None else now
    return math.ceil(t / TIME_QUANTUM_S) * TIME_QUANTUM_S


def step_for(span_s: float, scrape_interval: float = 15.0) -> float:
    """Bucket width for a chart over ``span_s``: at most ``MAX_POINTS`` buckets, at least
    the scrape interval; from 5 minutes up a multiple of 5 minutes (or of an hour), so that
    the store reads its rollups instead of raw samples."""
    step = max(scrape_interval, span_s / MAX_POINTS)
    if step >= 3600:
        return math.ceil(step / 3600) * 3600.0
    if step >= 300:
        return math.ceil(step / 300) * 300.0
    return float(math.ceil(step))


def utc_text(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def age_text(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s ago"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min ago"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.1f} h ago"
    return f"{seconds / 86400:.1f} d ago"


# --- health and inventory --------------------------------------------------------------------


@st.cache_data(ttl=SHORT_TTL, show_spinner=False)
def check(url: str) -> None:
    """Raise StoreError (its message names the URL, password masked) when unreadable."""
    _store(url).health()


@st.cache_data(ttl=SHORT_TTL, show_spinner=False)
def health(url: str, now: float) -> pd.DataFrame:
    rows = [{
        "target": h.target, "source": h.source, "up": h.up,
        "status": "up" if h.up else "DOWN", "last scrape": age_text(max(now - h.ts, 0)),
        "duration ms": round(h.duration_s * 1000, 1), "samples": h.samples,
        "last error": h.error or "",
        # The sidebar honours ?target=: each link opens a page filtered to this target.
        "models": f"/model?target={_q(h.target)}",
        "alerts": f"/alerts?target={_q(h.target)}",
    } for h in _store(url).health()]
    return pd.DataFrame(rows, columns=["target", "source", "up", "status", "last scrape",
                                       "duration ms", "samples", "last error", "models",
                                       "alerts"])


#: Series whose presence lists a model (server-side counters, derived rate, probe runs).
_INVENTORY = ("sli:request_rate", "nv_inference_request_success", "probe:ttft_seconds",
              "probe:requests")


@st.cache_data(ttl=LONG_TTL, show_spinner=False)
def inventory(url: str) -> pd.DataFrame:
    """Every (target, model, version) the store has series of, sorted."""
    store = _store(url)
    seen: set[tuple[str, str, str]] = set()
    for name in _INVENTORY:
        for key in store.series(name):
            model = label_value(key.labels, "model")
            if model:
                seen.add((key.target, model, label_value(key.labels, "version")))
    return pd.DataFrame(sorted(seen), columns=["target", "model", "version"])


@st.cache_data(ttl=LONG_TTL, show_spinner=False)
def model_config(url: str, target: str, model: str) -> dict[str, Any]:
    return _store(url).model_configs(target).get((target, model), {})


# --- series ----------------------------------------------------------------------------------


def _match(model: str | None, version: str | None,
           extra: Mapping[str, str] | None = None) -> dict[str, str] | None:
    match = dict(extra or {})
    if model:
        match["model"] = model
    if version:
        match["version"] = version
    return match or None


def _frame(cols: SeriesColumns, legend: Sequence[str], scale: float = 1.0) -> pd.DataFrame:
    """Long format: ``time`` (UTC datetime), ``value``, ``series`` (legend text from the
    labels named in ``legend``, else the target)."""
    parts = []
    for i, key in enumerate(cols.keys):
        lo, hi = cols.bounds[i], cols.bounds[i + 1]
        name = ", ".join(label_value(key.labels, k) or key.target if k != "target" else key.target
                         for k in legend) if legend else key.target
        parts.append(pd.DataFrame({"ts": cols.ts[lo:hi], "value": cols.values[lo:hi] * scale,
                                   "series": name}))
    if not parts:
        return pd.DataFrame({"time": pd.Series([], dtype="datetime64[ns, UTC]"),
                             "value": pd.Series([], dtype=float),
                             "series": pd.Series([], dtype=object)})
    df = pd.concat(parts, ignore_index=True)
    df = df[np.isfinite(df["value"])]
    df.insert(0, "time", pd.to_datetime(df["ts"], unit="s", utc=True))
    return df.drop(columns="ts").reset_index(drop=True)


@st.cache_data(ttl=SHORT_TTL, show_spinner=False)
def series(url: str, name: str, start: float, end: float, step: float, *,
           target: str | None = None, model: str | None = None, version: str | None = None,
           extra: tuple[tuple[str, str], ...] = (), legend: tuple[str, ...] = (),
           agg: str = "avg", scale: float = 1.0) -> pd.DataFrame:
    """Bucketed points of ``name`` (rollups where ``step`` allows), long format."""
    cols = _store(url).bucket_columns(name, start=start, end=end, step=step, agg=agg,  # type: ignore[arg-type]
                                      target=target, match=_match(model, version, dict(extra)))
    return _frame(cols, legend, scale)


_Arrays = list[np.ndarray[Any, Any]]


def _bucket_increase(store: Store, name: str, start: float, end: float, step: float,
                     target: str | None, match: dict[str, str] | None
                     ) -> tuple[list[Labels], _Arrays, _Arrays, _Arrays]:
    """Per series: bucket starts, reset-aware increase per bucket (from each bucket's last
    value against the previous bucket's), and whether a reset happened in the bucket (its
    minimum below the previous bucket's last value)."""
    last = store.bucket_columns(name, start=start, end=end, step=step, agg="last",
                                target=target, match=match)
    low = store.bucket_columns(name, start=start, end=end, step=step, agg="min",
                               target=target, match=match)
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
    store = _store(url)
    match = _match(model, version)
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
    store = _store(url)
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
    store = _store(url)
    out: list[Marker] = []
    cols = store.bucket_columns("nv_inference_request_success", start=start - step,
                                end=end, step=step, agg="last", target=target,
                                match={"model": model})
    # The target's own scrapes bound what "appeared" and "disappeared" mean: a version first
    # seen when the store itself started was not deployed then.
    up = store.bucket_columns("up", start=start - step, end=end, step=step, agg="last",
                              target=target)
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


# --- probes ----------------------------------------------------------------------------------


@st.cache_data(ttl=SHORT_TTL, show_spinner=False)
def probe_results(url: str, start: float, end: float, *, probe: str | None = None,
                  model: str | None = None, target: str | None = None,
                  limit: int = PROBE_ROWS_LIMIT) -> tuple[ProbeResult, ...]:
    """Probe requests in the window, newest ``limit`` kept (oldest first)."""
    rows = _store(url).probe_results(probe=probe, start=start, end=end, limit=limit)
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
    cols = store.bucket_columns(name, start=start, end=end, step=max(span, 1.0), agg="avg")
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
    store = _store(url)
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
        row["details"] = f"/model?target={_q(target)}&model={_q(model)}"
        rows.append(row)
    return pd.DataFrame(rows)


def _q(text: str) -> str:
    from urllib.parse import quote

    return quote(text, safe="")


# --- SLOs ------------------------------------------------------------------------------------


@st.cache_data(ttl=LONG_TTL, show_spinner=False)
def slo_specs(rules_file: str | None) -> tuple[SloSpec, ...]:
    if rules_file is None:
        return ()
    try:
        return load_rules_file(rules_file).slos
    except ConfigError as exc:
        raise DashboardError(f"{exc.source}: " + "; ".join(exc.errors)) from None


@st.cache_data(ttl=LONG_TTL, show_spinner=False)
def slo_status(url: str, rules_file: str | None, name: str,
               now: float) -> slo_maths.SloStatus | None:
    spec = next((s for s in slo_specs(rules_file) if s.name == name), None)
    if spec is None:
        return None
    return slo_maths.slo_status(_store(url), spec, now)


def slo_tiers(spec: SloSpec) -> tuple[slo_maths.Tier, ...]:
    """The burn-rate tiers of ``spec`` (alerts/windows.yaml), with their thresholds."""
    return slo_maths.Slo.from_spec(spec).tiers


#: Budget burn-down points per SLO period.
BURN_DOWN_POINTS = 112


@st.cache_data(ttl=LONG_TTL, show_spinner=False)
def slo_history(url: str, rules_file: str | None, name: str, now: float) -> pd.DataFrame:
    """Per slice of the SLO period (``BURN_DOWN_POINTS`` slices): good and total events,
    the slice's burn rate, the budget remaining at its end and the share of the budget it
    spent.  Events come from ``alerts.slo.events``, the same maths the SLO alerts use."""
    spec = next((s for s in slo_specs(rules_file) if s.name == name), None)
    if spec is None:
        return pd.DataFrame()
    model = slo_maths.Slo.from_spec(spec)
    store = _store(url)
    step = model.period_s / BURN_DOWN_POINTS
    start = now - model.period_s
    rows = []
    for i in range(BURN_DOWN_POINTS):
        lo = start + i * step
        found = slo_maths.events(store, model, lo, lo + step, by=())
        ev = found.get((), slo_maths.NO_EVENTS)
        rows.append({"ts": lo + step, "good": ev.good, "total": ev.total})
    df = pd.DataFrame(rows)
    total = df["total"].sum()
    allowed = model.budget * total
    df["bad"] = (df["total"] - df["good"]).clip(lower=0)
    df["burn rate"] = [
        (b / t) / model.budget if t > 0 else None
        for b, t in zip(df["bad"], df["total"], strict=True)]
    # Spent so far against the budget of the events seen over the whole period so far: the
    # same denominator as SloStatus.remaining at ``now``, so the last point equals it.
    df["budget remaining %"] = (
        (1 - df["bad"].cumsum() / allowed) * 100 if allowed > 0 else 100.0)
    df["budget spent %"] = df["bad"] / allowed * 100 if allowed > 0 else 0.0
    df.insert(0, "time", pd.to_datetime(df["ts"], unit="s", utc=True))
    return df.drop(columns="ts")


# --- alerts ----------------------------------------------------------------------------------


@st.cache_data(ttl=SHORT_TTL, show_spinner=False)
def alert_states(url: str) -> tuple[AlertState, ...]:
    return tuple(AlertStore(_store(url)).states())


@st.cache_data(ttl=SHORT_TTL, show_spinner=False)
def alert_events(url: str, start: float, end: float) -> tuple[AlertEvent, ...]:
    """History in the window, newest ``EVENT_ROWS_LIMIT`` (oldest first)."""
    return tuple(AlertStore(_store(url)).events(start=start, end=end)[-EVENT_ROWS_LIMIT:])


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
    store = _store(url)
    # Halves of the span the model's probe latency covers in the range (not of the range
    # itself, which may reach before the first probe).
    seen = store.bucket_columns("probe:ttft_seconds", start=start, end=end, step=step,
                                agg="avg", target=target, match={"model": model})
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
    throttle = store.bucket_columns("sli:gpu_throttling", start=recent[0], end=recent[1],
                                    step=step, agg="avg")
    finite = throttle.values[np.isfinite(throttle.values)]
    return Why(latency, tuple(moved), recent, baseline,
               float(finite.mean()) if len(finite) else None)


def is_unreachable(exc: BaseException) -> bool:
    return isinstance(exc, StoreError | DashboardError)


@st.cache_data(ttl=LONG_TTL, show_spinner=False)
def reports(url: str, limit: int = 200) -> pd.DataFrame:
    """The weekly SLO reports kept in the store, newest week first, with their summaries."""
    rows = ReportStore(_store(url)).list(limit=limit)
    return pd.DataFrame([{
        "id": r.id, "week": r.week, "time zone": r.timezone,
        "made (UTC)": utc_text(r.created_at),
        "held": r.summary.get("held"), "at risk": r.summary.get("at_risk"),
        "breached": r.summary.get("breached"), "incidents": r.summary.get("incidents"),
        "regressions": r.summary.get("regressions"), "tuning hints": r.summary.get("advice"),
        "budget health": r.summary.get("budget_health"),
    } for r in rows])


@st.cache_data(ttl=LONG_TTL, show_spinner=False)
def report_document(url: str, report_id: int, fmt: str) -> str | None:
    """One kept rendering (``html``, ``md`` or ``json``) of a report; None if it is gone."""
    if fmt not in ("html", "md", "json"):
        raise ValueError(f"unknown report format {fmt!r}")
    return ReportStore(_store(url)).document(report_id, fmt)  # type: ignore[arg-type]
