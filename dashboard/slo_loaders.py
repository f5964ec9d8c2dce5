"""Reads of the SLO, alert and report pages: budgets and burn-down, alert history, reports.

Loaders as ``dashboard.loaders`` describes them (cached, plain arguments, plain values).
"""

from __future__ import annotations

import pandas as pd
import streamlit as st

from tritonwatch.alerts import slo as slo_maths
from tritonwatch.dashboard.loaders import (
    EVENT_ROWS_LIMIT,
    LONG_TTL,
    SHORT_TTL,
    DashboardError,
    store_for,
    utc_text,
)
from tritonwatch.schemas.alerts import AlertEvent, AlertState
from tritonwatch.schemas.config import ConfigError
from tritonwatch.schemas.rules import SloSpec, load_rules_file
from tritonwatch.store.alerts import AlertStore
from tritonwatch.store.reports import ReportStore

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
    return slo_maths.slo_status(store_for(url), spec, now)


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
    store = store_for(url)
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
    return tuple(AlertStore(store_for(url)).states())


@st.cache_data(ttl=SHORT_TTL, show_spinner=False)
def alert_events(url: str, start: float, end: float) -> tuple[AlertEvent, ...]:
    """History in the window, newest ``EVENT_ROWS_LIMIT`` (oldest first)."""
    return tuple(AlertStore(store_for(url)).events(start=start, end=end)[-EVENT_ROWS_LIMIT:])


@st.cache_data(ttl=LONG_TTL, show_spinner=False)
def reports(url: str, limit: int = 200) -> pd.DataFrame:
    """The weekly SLO reports kept in the store, newest week first, with their summaries."""
    rows = ReportStore(store_for(url)).list(limit=limit)
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
    return ReportStore(store_for(url)).document(report_id, fmt)  # type: ignore[arg-type]
