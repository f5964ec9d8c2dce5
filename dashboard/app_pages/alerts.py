"""Alerts: active and history, ours and those received from Alertmanager, with their
annotations; filters by severity, model and rule (and the sidebar's target and model)."""

from __future__ import annotations

from collections.abc import Callable

import pandas as pd
import streamlit as st

from tritonwatch.dashboard import loaders, slo_loaders
from tritonwatch.dashboard.state import current

sel = current()
st.header("Alerts")
states = slo_loaders.alert_states(sel.url)
events = slo_loaders.alert_events(sel.url, sel.start, sel.end)


def _row(labels: dict[str, str], annotations: dict[str, str]) -> dict[str, str]:
    return {
        "alert": labels.get("alertname", ""), "severity": labels.get("severity", ""),
        "rule": labels.get("rule", labels.get("alertname", "")),
        "target": labels.get("target", ""), "model": labels.get("model", ""),
        "summary": annotations.get("summary", ""),
        "description": annotations.get("description", ""),
        "labels": ", ".join(f"{k}={v}" for k, v in sorted(labels.items())),
    }


now = loaders.now_quantized()
# Received from Alertmanager: active while its latest event is a firing one not yet ended.
received = {}
for e in events:
    if e.source != "engine":
        received[e.fingerprint] = e
active_rows = [(a.fired_at or a.active_since, {
    **_row(dict(a.labels), dict(a.annotations)), "status": a.status, "source": "engine",
    "since (UTC)": loaders.utc_text(a.fired_at or a.active_since),
}) for a in states if a.status != "resolved"]
active_rows += [(e.starts_at, {
    **_row(dict(e.labels), dict(e.annotations)), "status": "firing", "source": e.source,
    "since (UTC)": loaders.utc_text(e.starts_at),
}) for e in received.values() if e.status == "firing" and (e.ends_at is None or e.ends_at > now)]
# Newest first: what just started is what the on-call engineer is looking for.
active = pd.DataFrame([row for _, row in sorted(active_rows, key=lambda r: -r[0])])
history = pd.DataFrame([{
    **_row(dict(e.labels), dict(e.annotations)), "status": e.status, "source": e.source,
    "time (UTC)": loaders.utc_text(e.ts),
} for e in reversed(events)])
both = pd.concat([active, history], ignore_index=True)
if both.empty:
    st.success("No alert is active, and none fired in this range.")
    st.stop()

c1, c2, c3 = st.columns(3)
severity = c1.multiselect("Severity", sorted(set(both["severity"]) - {""}), key="alerts_sev")
models = c2.multiselect("Model", sorted(set(both["model"]) - {""}), key="alerts_model")
rules = c3.multiselect("Rule", sorted(set(both["rule"]) - {""}), key="alerts_rule")


def _filter(df: pd.DataFrame) -> pd.DataFrame:
    if df.empty:
        return df
    keep = pd.Series(True, index=df.index)
    if severity:
        keep &= df["severity"].isin(severity)
    if models:
        keep &= df["model"].isin(models)
    if sel.model and not models:
        keep &= df["model"].isin([sel.model, ""])
    if sel.target:
        # The sidebar's target (a Fleet row's link); alerts about no target stay in view.
        keep &= df["target"].isin([sel.target, ""])
    if rules:
        keep &= df["rule"].isin(rules)
    return df[keep]


def _table(df: pd.DataFrame, key: str, say_empty: Callable[[], object]) -> None:
    shown = _filter(df)
    if shown.empty:
        say_empty()
    else:
        st.dataframe(shown, hide_index=True, width="stretch", key=key)


st.subheader("Active (pending and firing)")
_table(active, "alerts_active", lambda: st.success("No alert is pending or firing."))
st.subheader("History")
st.caption("Our engine's transitions (source `engine`) and alerts received from "
           "Alertmanager (source `alertmanager:<receiver>`), newest first.")
_table(history, "alerts_history", lambda: st.info("No alert fired or resolved in this range."))

st.subheader("One alert in full")
when = [h if isinstance(h, str) else s for h, s in zip(
    both.get("time (UTC)", pd.Series([None] * len(both))),
    both.get("since (UTC)", pd.Series([None] * len(both))), strict=True)]
pick = st.selectbox("Alert", range(len(both)), key="alerts_pick", format_func=lambda i: (
    f"{both.iloc[i]['status']} {both.iloc[i]['alert']} ({when[i]})"))
if pick is not None:
    row = both.iloc[pick]
    st.text("\n".join(f"{k}: {row[k]}" for k in ("alert", "status", "source", "labels",
                                                  "summary", "description") if row[k]))
