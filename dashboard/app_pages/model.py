"""Model: traffic and failures, the latency of a request part by part, batching against the
model's configuration, probe latency against its SLO, deploy markers and the "why" panel."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from tritonwatch.alerts.formatting import fmt_change
from tritonwatch.dashboard import charts, fleet_loaders, loaders, model_loaders
from tritonwatch.dashboard.state import current
from tritonwatch.dashboard.text import md

#: A part whose median changed this much between the halves "moved with it".
MOVED_PERCENT = 10.0



def fmt_value(value: float, unit: str) -> str:
    """Like the annotations' numbers, with sub-millisecond times kept readable."""
    if unit == "ratio":
        return f"{value * 100:.0f} %"
    if unit == "s":
        return f"{value * 1000:.3g} ms"
    return f"{value:.3g}" + (f" {unit}" if unit else "")


sel = current()
st.header("Model")
inventory = loaders.inventory(sel.url)
if sel.model is None:
    st.info("Choose a model in the sidebar (or open one from the Fleet page).")
    if sel.target is not None:
        st.caption(f"Models served by {sel.target}:")
    listed = inventory if sel.target is None else inventory[inventory["target"] == sel.target]
    st.dataframe(listed, hide_index=True, key="model_inventory")
    st.stop()
model = sel.model
targets = sorted(set(inventory[inventory["model"] == model]["target"]))
target = sel.target or (targets[0] if targets else None)
if target is None:
    st.warning("This model has no stored series.")
    st.stop()
st.text(f"model: {model}    target: {target}    version: {sel.version or 'all'}")
if len(targets) > 1 and sel.target is None:
    st.caption(f"Served by {len(targets)} targets; showing the first. Pick one in the sidebar.")



def series(name: str, legend: tuple[str, ...], scale: float = 1.0) -> pd.DataFrame:
    assert target is not None
    return loaders.series(sel.url, name, sel.start, sel.end, sel.step, target=target,
                          model=model, version=sel.version, legend=legend, scale=scale)


markers = model_loaders.deploy_markers(sel.url, target, model, sel.start, sel.end, sel.step)

left, right = st.columns(2)
with left:
    st.subheader("Request rate")
    rate = series("sli:request_rate", ("version",))
    if rate.empty:
        st.info("No request rate in this range (the model served no request).")
    else:
        rate = rate.rename(columns={"series": "version"})
        st.altair_chart(charts.time_chart(rate, unit="requests/s", legend="version",
                                          markers=markers), key="model_rate")
with right:
    st.subheader("Failures by reason")
    fails = series("sli:failure_rate", ("reason",))
    if fails.empty or not (fails["value"] > 0).any():
        st.success("No failed request in this range.")
    else:
        fails = fails.rename(columns={"series": "reason"})
        st.altair_chart(charts.time_chart(fails, unit="failed requests/s", legend="reason",
                                          markers=markers), key="model_failures")

st.subheader("Latency per request, part by part")
parts = model_loaders.latency_breakdown(sel.url, target, model, sel.version, sel.start, sel.end,
                                  sel.step)
if parts.empty:
    st.info("Not enough scrapes in this range to compute per-request latency.")
else:
    st.altair_chart(charts.time_chart(parts.rename(columns={"ms": "value"}),
                                      unit="ms per request", legend="part", mark="area",
                                      markers=markers),
                    key="model_latency")
    totals = parts.groupby("part")["ms"].mean()
    st.caption("Mean over the range: " + ", ".join(
        f"{part} {totals[part]:.2f} ms" for part in ("queue", "compute input", "compute infer",
                                                     "compute output") if part in totals))

config = loaders.model_config(sel.url, target, model)
max_batch = int(config.get("max_batch_size", 0) or 0)
preferred = [int(x) for x in (config.get("dynamic_batching") or {}).get(
    "preferred_batch_size", [])]
st.subheader("Batching")
left, right = st.columns(2)
with left:
    fill = series("sli:batch_fill_rate", ("version",), scale=100.0)
    if max_batch == 0:
        st.info("This model does not batch (max_batch_size 0, or its config is unknown).")
    elif fill.empty:
        st.info("No batch fill rate in this range.")
    else:
        st.caption(f"Average batch size as % of max_batch_size = {max_batch}")
        fill = fill.rename(columns={"series": "version"})
        st.altair_chart(charts.time_chart(fill, unit="batch fill %", legend="version",
                                          markers=markers, y_max=100), key="model_fill")
with right:
    sizes = model_loaders.batch_sizes(sel.url, target, model, sel.start, sel.end, sel.step)
    if sizes.empty or not sizes["executions"].sum():
        st.info("No batch statistics in this range (the statistics API needs `http_url` or "
                "`grpc_url` on the target).")
    else:
        sizes["preferred"] = ["preferred size" if s in preferred else "other size"
                              for s in sizes["batch_size"]]
        st.caption("Executions per batch size" + (
            f"; preferred sizes {', '.join(map(str, preferred))}" if preferred else ""))
        st.altair_chart(charts.bar_chart(sizes, "batch_size", "executions",
                                         x_title="batch size", y_title="executions",
                                         highlight="preferred"), key="model_batch_sizes")

st.subheader("Probe latency")
ttft_slo, itl_slo = sel.settings.thresholds(model)
pct = fleet_loaders.probe_percentiles(sel.url, model, target, sel.start, sel.end, sel.step)
if pct.empty:
    st.info("No probe results for this model — add `probes:` to the config.")
else:
    cols = st.columns(3)
    for col, metric, slo in zip(cols, ("TTFT", "ITL", "e2e"), (ttft_slo, itl_slo, None),
                                strict=True):
        with col:
            part = pct[pct["metric"] == metric].rename(columns={"ms": "value"})
            st.markdown(f"**{metric}**" + (f" (SLO {slo * 1000:g} ms)" if slo else ""))
            if part.empty:
                st.caption("no values")
                continue
            st.altair_chart(charts.time_chart(
                part, unit="ms", legend="percentile", markers=markers,
                threshold=None if slo is None else slo * 1000,
                threshold_label=f"{metric} SLO"), key=f"model_probe_{metric}")

st.subheader("Why: what moved with the probe latency")
why = model_loaders.why(sel.url, target, model, sel.start, sel.end, sel.step)
if why.latency is None:
    st.info("No probe latency of this model in both halves of the range to compare.")
else:
    lat = why.latency
    name = lat.label[:1].upper() + lat.label[1:]
    before = "" if lat.baseline is None else fmt_value(lat.baseline, lat.unit)
    st.markdown(
        f"{md(name)}: median **{md(fmt_value(lat.current, lat.unit))}** over the second half "
        f"of the range against {md(before)} over the first "
        f"(**{md(fmt_change(lat.current, lat.baseline or 0.0))}**). The server-side parts "
        "over the same halves:")
    rows = [{"part": m.label, "first half": "" if m.baseline is None
             else fmt_value(m.baseline, m.unit), "second half": fmt_value(m.current, m.unit),
             "change": None if m.change is None else m.change * 100} for m in why.moved]
    if why.throttled is not None:
        rows.append({"part": "GPU throttling", "first half": "",
                     "second half": f"{why.throttled * 100:.0f} % of readings", "change": None})
    if rows:
        table = pd.DataFrame(rows)
        table["moved with it"] = ["yes" if c is not None and abs(c) >= MOVED_PERCENT else ""
                                  for c in table["change"]]
        st.dataframe(table, hide_index=True, key="model_why", column_config={
            "change": st.column_config.NumberColumn("change", format="%+.0f %%")})
    else:
        st.caption("No server-side series of this model in the range.")

st.subheader("Deploy markers")
if not markers:
    st.caption("No version change, config change or reload in this range.")
else:
    st.dataframe(charts.marker_rows(markers), hide_index=True, key="model_markers")
