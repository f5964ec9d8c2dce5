"""SLOs: per SLO the budget burn-down over its period, the burn rate against each alert tier's
threshold, and the periods that spent the budget (``alerts.slo``: the maths the alerts use)."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from tritonwatch.dashboard import charts, loaders, slo_loaders
from tritonwatch.dashboard.state import current
from tritonwatch.dashboard.text import md
from tritonwatch.schemas.values import format_duration as fmt_duration

sel = current()
st.header("SLOs")
rules_file = sel.settings.rules_file
specs = slo_loaders.slo_specs(rules_file)
if not specs:
    st.info("No SLOs defined — add `slos:` to the rules file named by "
            "`alerting.rules_file` in the config.")
    st.stop()

for i, spec in enumerate(specs):
    status = slo_loaders.slo_status(sel.url, rules_file, spec.name, sel.end)
    with st.container(border=True, key=f"slo_{i}"):
        st.subheader(md(spec.name))
        st.caption(f"objective {spec.objective:g} % over {spec.window}; SLI {spec.sli.kind}")
        if status is None or status.compliance is None:
            st.info("No events in the SLO's period yet.")
            continue
        cols = st.columns(5)
        cols[0].metric("SLI", f"{status.compliance * 100:.3f} %")
        cols[1].metric("budget remaining", f"{status.remaining * 100:.1f} %")
        cols[2].metric("burn rate (1 h)", "—" if status.current_burn is None
                       else f"{status.current_burn:.2f}x")
        cols[3].metric("events", f"{status.total:,.0f}")
        cols[4].metric(
            "budget exhausted", "already" if status.exhaustion_in_s == 0 else
            ("never at this burn" if status.exhaustion_in_s is None
             else f"in {status.exhaustion_in_s / 86400:.1f} d"),
            help=None if status.exhausts_at is None else loaders.utc_text(status.exhausts_at))
        alerts = [w for w, on in (("page", status.page), ("ticket", status.ticket)) if on]
        if alerts:
            st.error(f"Burn-rate alert firing: {', '.join(alerts)}")

        history = slo_loaders.slo_history(sel.url, rules_file, spec.name, sel.end)
        left, right = st.columns(2)
        with left:
            st.markdown("**Budget burn-down**")
            down = history[["time", "budget remaining %"]].rename(
                columns={"budget remaining %": "value"}).assign(series="budget remaining")
            st.altair_chart(charts.time_chart(down, unit="budget remaining %",
                                              threshold=0.0, threshold_label="budget spent"),
                            key=f"slo_burndown_{i}")
        with right:
            st.markdown("**Burn rate per slice, and each tier's threshold**")
            burn = history[["time", "burn rate"]].rename(
                columns={"burn rate": "value"}).assign(series="burn rate per slice")
            st.altair_chart(charts.time_chart(
                burn, unit="burn rate (x)",
                thresholds=[(t.factor, f"{t.window.name} {t.factor:.3g}x")
                            for t in slo_loaders.slo_tiers(spec) if t.enabled]),
                key=f"slo_burn_{i}")
        tiers = pd.DataFrame([{
            "tier": t.name, "severity": t.severity,
            "windows": f"{fmt_duration(t.long_s)} / {fmt_duration(t.short_s)}",
            "threshold (x)": round(t.factor, 2),
            "long-window burn (x)": None if t.long_burn is None else round(t.long_burn, 2),
            "short-window burn (x)": None if t.short_burn is None else round(t.short_burn, 2),
            "firing": "FIRING" if t.firing else ("" if t.enabled else "disabled"),
        } for t in status.tiers])
        st.dataframe(tiers, hide_index=True, key=f"slo_tiers_{i}")
        spent = history[history["budget spent %"] > 0].nlargest(5, "budget spent %")
        st.markdown("**The periods that spent the budget**")
        if spent.empty:
            st.caption("No bad events in the period.")
        else:
            slice_h = status.period_s / slo_loaders.BURN_DOWN_POINTS / 3600
            st.dataframe(pd.DataFrame({
                "slice ending (UTC)": [loaders.utc_text(t.timestamp()) for t in spent["time"]],
                "length": f"{slice_h:.1f} h",
                "bad events": spent["bad"].round(1),
                "budget spent %": spent["budget spent %"].round(1),
                "burn rate (x)": spent["burn rate"].round(2),
            }), hide_index=True, key=f"slo_spent_{i}")
