"""The dashboard's reads: cached functions over the store and the alert layer.

This module holds what every page shares (settings, the store, time and text helpers, health,
inventory, series); each page family's own reads are beside it: ``model_loaders`` (model and
LLM pages), ``fleet_loaders`` (fleet, probes), ``slo_loaders`` (SLOs, alerts, reports).

Pages never touch the store: they call these.  Each loader takes plain, hashable arguments
(the store URL, names, times rounded to ``TIME_QUANTUM_S``) so that ``st.cache_data`` serves
every viewer of the same window from one read, and returns plain values (pandas frames,
tuples, dataclasses) that pickle.  TTLs follow how fast the data changes: series and health
every scrape interval, configs and SLO budgets once a minute.

Nothing here writes: the store is opened ``read_only`` (the database refuses writes) and
``migrations.apply()`` is never called.  No SQL: the store and alert layers own it.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

import numpy as np
import pandas as pd
import streamlit as st

from tritonwatch.schemas.config import ConfigError, load_config
from tritonwatch.schemas.remote_write import TimeseriesConfig
from tritonwatch.schemas.samples import label_value
from tritonwatch.store import Query, SeriesColumns, Store, StoreError, open_store
from tritonwatch.store.tsdb import TsdbReader

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
    if config.store.timeseries is not None:
        _TIMESERIES[config.store.url] = config.store.timeseries
    store = store_for(config.store.url)
    return Settings(
        config.store.url, store.url_redacted,
        None if config.alerting.rules_file is None else str(config.alerting.rules_file),
        tuple(p.name for p in config.probes), config.scrape.interval,
        tuple((p.name, p.target, p.model, p.ttft_slo, p.itl_slo) for p in config.probes),
    )


#: ``store.timeseries`` by store URL: :func:`settings` notes it before the store is opened.
_TIMESERIES: dict[str, TimeseriesConfig] = {}


@st.cache_resource
def store_for(url: str) -> Store:
    # One read-only store (a connection pool) per URL for the whole server process; its time
    # series read from the TSDB when the configuration puts them there.
    ts = _TIMESERIES.get(url)
    return open_store(url, read_only=True, timeout_s=5.0,
                      timeseries=None if ts is None else TsdbReader.from_config(ts))


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
    store_for(url).health()


@st.cache_data(ttl=SHORT_TTL, show_spinner=False)
def health(url: str, now: float) -> pd.DataFrame:
    rows = [{
        "target": h.target, "source": h.source, "up": h.up,
        "status": "up" if h.up else "DOWN", "last scrape": age_text(max(now - h.ts, 0)),
        "duration ms": round(h.duration_s * 1000, 1), "samples": h.samples,
        "last error": h.error or "",
        # The sidebar honours ?target=: each link opens a page filtered to this target.
        "models": f"/model?target={url_part(h.target)}",
        "alerts": f"/alerts?target={url_part(h.target)}",
    } for h in store_for(url).health()]
    return pd.DataFrame(rows, columns=["target", "source", "up", "status", "last scrape",
                                       "duration ms", "samples", "last error", "models",
                                       "alerts"])


#: Series whose presence lists a model (server-side counters, derived rate, probe runs).
_INVENTORY = ("sli:request_rate", "nv_inference_request_success", "probe:ttft_seconds",
              "probe:requests")


@st.cache_data(ttl=LONG_TTL, show_spinner=False)
def inventory(url: str) -> pd.DataFrame:
    """Every (target, model, version) the store has series of, sorted."""
    store = store_for(url)
    seen: set[tuple[str, str, str]] = set()
    for name in _INVENTORY:
        for key in store.series(Query(name)):
            model = label_value(key.labels, "model")
            if model:
                seen.add((key.target, model, label_value(key.labels, "version")))
    return pd.DataFrame(sorted(seen), columns=["target", "model", "version"])


@st.cache_data(ttl=LONG_TTL, show_spinner=False)
def model_config(url: str, target: str, model: str) -> dict[str, Any]:
    return store_for(url).model_configs(target).get((target, model), {})


# --- series ----------------------------------------------------------------------------------


def match_labels(model: str | None, version: str | None,
           extra: Mapping[str, str] | None = None) -> dict[str, str] | None:
    match = dict(extra or {})
    if model:
        match["model"] = model
    if version:
        match["version"] = version
    return match or None


def frame(cols: SeriesColumns, legend: Sequence[str], scale: float = 1.0) -> pd.DataFrame:
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
    cols = store_for(url).read(Query(name, start=start, end=end, step=step, agg=agg,  # type: ignore[arg-type]
                                  target=target, match=match_labels(model, version, dict(extra))))
    return frame(cols, legend, scale)


def url_part(text: str) -> str:
    """``text`` quoted for one query parameter of a page link."""
    return quote(text, safe="")


def is_unreachable(exc: BaseException) -> bool:
    return isinstance(exc, StoreError | DashboardError)
