"""Probes: recent synthetic probe runs and their errors by kind."""

from __future__ import annotations

import streamlit as st

from tritonwatch.dashboard import fleet_loaders, loaders
from tritonwatch.dashboard.state import current

sel = current()
st.header("Probes")
rows = fleet_loaders.probe_results(sel.url, sel.start, sel.end, model=sel.model, target=sel.target)
if not rows:
    if not sel.settings.probes:
        st.info("No probes configured — add `probes:` to the config.")
    else:
        st.info(f"No probe results in this range (configured: {', '.join(sel.settings.probes)}).")
    st.stop()
df = fleet_loaders.probe_frame(rows)
if len(rows) >= loaders.PROBE_ROWS_LIMIT:
    st.caption(f"Showing the first {loaders.PROBE_ROWS_LIMIT:,} requests of the range.")

summary = df.groupby(["probe", "model", "protocol"]).agg(
    requests=("ok", "size"), errors=("ok", lambda ok: int((~ok).sum())),
    ttft_p50=("TTFT ms", "median"), ttft_p95=("TTFT ms", lambda v: v.quantile(0.95)),
    itl_p50=("ITL ms", "median"), e2e_p95=("e2e ms", lambda v: v.quantile(0.95)),
).reset_index().rename(columns={"ttft_p50": "TTFT p50 ms", "ttft_p95": "TTFT p95 ms",
                                "itl_p50": "ITL p50 ms", "e2e_p95": "e2e p95 ms"})
st.subheader("Per probe")
st.dataframe(summary, hide_index=True, width="stretch", key="probes_summary",
             column_config={c: st.column_config.NumberColumn(c, format="%.1f")
                            for c in summary.columns if c.endswith("ms")})

st.subheader("Errors by kind")
errors = df[~df["ok"]]
if errors.empty:
    st.success("No probe request failed in this range.")
else:
    st.dataframe(errors.groupby(["probe", "error kind"]).size().reset_index(name="requests"),
                 hide_index=True, key="probes_errors")

st.subheader("Recent requests")
st.dataframe(df.sort_values("time", ascending=False).head(200), hide_index=True,
             width="stretch", key="probes_recent",
             column_config={c: st.column_config.NumberColumn(c, format="%.1f")
                            for c in ("TTFT ms", "ITL ms", "e2e ms")})
