"""Fleet: targets up or down, a row of key SLIs per model against a week ago, SLO tiles and
the active alerts.  Every row links to its detail page."""

from __future__ import annotations

import streamlit as st

from tritonwatch.dashboard import fleet_loaders, loaders, slo_loaders
from tritonwatch.dashboard.state import current
from tritonwatch.dashboard.text import md

sel = current()
now = sel.end
st.header("Fleet")

st.subheader("Targets")
health = loaders.health(sel.url, now)
if health.empty:
    st.info("No target has been scraped yet — add `targets:` to the config and run "
            "`tritonwatch serve`.")
else:
    down = health[~health["up"]]
    st.caption(f"{len(health) - len(down)} of {len(health)} sources up")
    # The links before the error text, which can be long: they stay in view.
    st.dataframe(health.drop(columns="up"), hide_index=True, width="stretch", key="fleet_health",
                 column_order=("target", "source", "status", "models", "alerts", "last scrape",
                               "duration ms", "samples", "last error"),
                 column_config={
                     "models": st.column_config.LinkColumn("models",
                                                           display_text="its models"),
                     "alerts": st.column_config.LinkColumn("alerts",
                                                           display_text="its alerts"),
                 })

window = min(sel.span, 900.0)
st.subheader(f"Models — last {window / 60:.0f} min, change against the same time a week ago")
models = fleet_loaders.fleet_models(sel.url, now, window)
if models.empty:
    st.info("No model series stored yet.")
else:
    if sel.target:
        models = models[models["target"] == sel.target]
    # Change columns only where some model has week-old data (empty ones say nothing).
    empty = [c for c in models.columns if c.endswith("vs week ago") and models[c].isna().all()]
    models = models.drop(columns=empty)
    change = {c: st.column_config.NumberColumn(c, format="%+.0f %%")
              for c in models.columns if c.endswith("vs week ago")}
    st.dataframe(
        models, hide_index=True, width="stretch", key="fleet_models",
        column_config={
            "details": st.column_config.LinkColumn("details", display_text="open model page"),
            "req/s": st.column_config.NumberColumn("req/s", format="%.2f"),
            "success %": st.column_config.NumberColumn("success %", format="%.2f"),
            "fill %": st.column_config.NumberColumn("fill %", format="%.0f"),
            "KV cache %": st.column_config.NumberColumn("KV cache %", format="%.0f"),
            "queue ms": st.column_config.NumberColumn("queue ms", format="%.2f"),
            "TTFT p95 ms": st.column_config.NumberColumn("TTFT p95 ms", format="%.1f"),
            **change,
        },
    )
    if empty:
        st.caption("Changes against a week ago appear once the store holds a week of "
                   "history of a model.")

st.subheader("SLOs")
specs = slo_loaders.slo_specs(sel.settings.rules_file)
if not specs:
    st.info("No SLOs defined — add `slos:` to the rules file (`alerting.rules_file`).")
else:
    cols = st.columns(min(len(specs), 4))
    for i, spec in enumerate(specs):
        status = slo_loaders.slo_status(sel.url, sel.settings.rules_file, spec.name, now)
        with cols[i % len(cols)].container(border=True, key=f"fleet_slo_{i}"):
            st.markdown(f"**{md(spec.name)}** — objective {spec.objective:g} % over "
                        f"{spec.window}")
            if status is None or status.compliance is None:
                st.caption("no events in the period yet")
                continue
            st.metric("SLI", f"{status.compliance * 100:.3f} %")
            st.metric("budget remaining", f"{status.remaining * 100:.1f} %")
            burn = "—" if status.current_burn is None else f"{status.current_burn:.2f}x"
            st.metric("burn rate (1 h)", burn)
            st.caption("exhausted" if status.exhaustion_in_s == 0 else
                       "budget exhausts " + (loaders.utc_text(status.exhausts_at)
                                             if status.exhausts_at else "never at this burn"))
            st.page_link("app_pages/slos.py", label="SLO details")

st.subheader("Active alerts")
active = [a for a in slo_loaders.alert_states(sel.url) if a.status in ("pending", "firing")]
if not active:
    st.success("No alert is pending or firing.")
else:
    st.dataframe([{
        "alert": dict(a.labels).get("alertname", a.rule), "status": a.status,
        "severity": dict(a.labels).get("severity", ""),
        "target": dict(a.labels).get("target", ""), "model": dict(a.labels).get("model", ""),
        "since": loaders.age_text(now - a.active_since),
        "summary": dict(a.annotations).get("summary", ""),
    } for a in sorted(active, key=lambda a: a.active_since)], hide_index=True,
        width="stretch", key="fleet_alerts")
    st.page_link("app_pages/alerts.py", label="All alerts")
