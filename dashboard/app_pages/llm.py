"""LLM serving: KV cache (with its forecast to exhaustion), blocks, in-flight batching,
waiting and paused requests, token throughput; with a model chosen in the sidebar, its deploy
markers on every chart and listed."""

from __future__ import annotations

import numpy as np
import pandas as pd
import streamlit as st

from tritonwatch.dashboard import charts, loaders, model_loaders
from tritonwatch.dashboard.state import current

sel = current()
st.header("LLM serving")


def series(name: str, legend: tuple[str, ...], scale: float = 1.0) -> pd.DataFrame:
    return loaders.series(sel.url, name, sel.start, sel.end, sel.step, target=sel.target,
                          model=sel.model, version=sel.version, legend=legend, scale=scale)


kv = series("sli:kv_cache_utilization", ("target", "model"), scale=100.0)
if kv.empty:
    st.info("No LLM serving metrics in this range: none of the selected models exports "
            "TensorRT-LLM (`nv_trt_llm_*`) or vLLM (`vllm:*`) families.")
    st.stop()

# Deploy markers of the model chosen in the sidebar, on every chart (as on the Model page);
# with several targets serving it, each target's, named.
markers: list[model_loaders.Marker] = []
if sel.model is not None:
    served = loaders.inventory(sel.url)
    targets = ([sel.target] if sel.target is not None else
               sorted(set(served[served["model"] == sel.model]["target"])))
    for t in targets:
        for m in model_loaders.deploy_markers(sel.url, t, sel.model, sel.start, sel.end, sel.step):
            markers.append(m if len(targets) == 1 else
                           model_loaders.Marker(m.ts, m.kind, f"{t}: {m.detail}"))
    markers.sort(key=lambda m: m.ts)

st.subheader("KV-cache utilization")
for name, part in kv.groupby("series"):
    recent = part[part["time"] >= part["time"].max() - np.timedelta64(30, "m")]
    forecast = "no upward trend"
    if len(recent) >= 3:
        # Seconds before the last point, so the fit is not swamped by epoch-sized numbers.
        x = recent["time"].astype("int64").to_numpy() / 1e9
        last = x[-1]
        slope, at_last = np.polyfit(x - last, recent["value"].to_numpy(), 1)
        if slope > 0:
            full_at = last + (100 - at_last) / slope
            forecast = ("full now" if full_at <= last else
                        f"full at {loaders.utc_text(full_at)} at the last 30 min's trend")
    st.text(f"{name}: {part['value'].iloc[-1]:.0f} % now; {forecast}")
st.altair_chart(charts.time_chart(kv, unit="KV cache used %", y_max=100, markers=markers),
                key="llm_kv")

left, right = st.columns(2)
with left:
    st.subheader("Free KV-cache blocks")
    free = series("sli:kv_cache_free_blocks", ("target", "model"))
    st.altair_chart(charts.time_chart(free, unit="blocks", markers=markers), key="llm_free")
with right:
    st.subheader("Reused blocks")
    reuse = series("sli:kv_cache_reuse_ratio", ("target", "model"), scale=100.0)
    st.altair_chart(charts.time_chart(reuse, unit="reused / used blocks %",
                                                   markers=markers), key="llm_reuse")

left, right = st.columns(2)
with left:
    st.subheader("In-flight batch fill")
    fill = series("sli:inflight_batch_fill", ("target", "model"), scale=100.0)
    st.altair_chart(charts.time_chart(fill, unit="scheduled / max requests %",
                                      markers=markers),
                    key="llm_inflight")
with right:
    st.subheader("Waiting and paused requests")
    frames = []
    for name, what in (("sli:llm_waiting_requests", "waiting"),
                       ("sli:llm_paused_requests", "paused"),
                       ("sli:llm_active_requests", "active")):
        part = series(name, ("model",))
        frames.append(part.assign(series=part["series"] + " " + what))

    st.altair_chart(charts.time_chart(pd.concat(frames, ignore_index=True), unit="requests",
                                      markers=markers),
                    key="llm_requests")

st.subheader("Token throughput")
tokens = []
for name, what in (("sli:generation_tokens_rate", "generated"),
                   ("sli:prompt_tokens_rate", "prompt")):
    part = series(name, ("model",))
    tokens.append(part.assign(series=part["series"] + " " + what))
tok = pd.concat(tokens, ignore_index=True)
if tok.empty:
    st.info("No token counts: the model exports neither vLLM token counters nor "
            "TRT-LLM `nv_llm_*_token_len`.")
else:
    st.altair_chart(charts.time_chart(tok, unit="tokens/s", markers=markers), key="llm_tokens")

if sel.model is not None:
    st.subheader("Deploy markers")
    if not markers:
        st.caption("No version change, config change or reload of this model in this range.")
    else:
        st.dataframe(charts.marker_rows(markers), hide_index=True, key="llm_markers")
