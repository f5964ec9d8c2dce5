"""GPUs: utilization, memory, power, temperature, clocks and throttle reasons per GPU, and the
models placed on each.  Triton's ``nv_gpu_*`` alone are enough; NVML adds the rest."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from tritonwatch.dashboard import charts, loaders
from tritonwatch.dashboard.state import current

sel = current()
st.header("GPUs")


def gpu_series(*names: str, scale: float = 1.0) -> pd.DataFrame:
    """The first of ``names`` the store has (NVML's, else Triton's), one line per GPU."""
    for name in names:
        df = loaders.series(sel.url, name, sel.start, sel.end, sel.step,
                            target=sel.target, legend=("target", "gpu_uuid"), scale=scale)
        if not df.empty:
            return df
    return df


util = gpu_series("nvml_gpu_utilization_ratio", "nv_gpu_utilization", scale=100.0)
if util.empty:
    st.info("No GPU metrics in this range: Triton exports `nv_gpu_*` only when it sees a "
            "GPU, and NVML telemetry needs `nvml.enabled` on a machine with a driver.")
    st.stop()

st.subheader("Now")
latest = []
for uuid_series, part in util.groupby("series"):
    row = {"GPU": uuid_series, "utilization %": part["value"].iloc[-1]}
    for column, names, scale in (
        ("memory used GiB", ("nvml_gpu_memory_used_bytes", "nv_gpu_memory_used_bytes"), 2**-30),
        ("power W", ("nvml_gpu_power_watts", "nv_gpu_power_usage"), 1.0),
        ("temperature °C", ("nvml_gpu_temperature_celsius",), 1.0),
    ):
        other = gpu_series(*names, scale=scale)
        mine = other[other["series"] == uuid_series]
        row[column] = mine["value"].iloc[-1] if len(mine) else None
    latest.append(row)
now_table = pd.DataFrame(latest).dropna(axis="columns", how="all")  # NVML-only columns
st.dataframe(now_table, hide_index=True, key="gpu_now",
             column_config={c: st.column_config.NumberColumn(c, format="%.1f")
                            for c in ("utilization %", "memory used GiB", "power W",
                                      "temperature °C")})

placement = loaders.series(sel.url, "sli:gpu_model_placement", sel.end - 3600, sel.end,
                           3600.0, legend=("gpu_uuid", "model"), agg="last")
st.subheader("Models placed on each GPU")
if placement.empty:
    st.caption("No placement known (it comes from the GPU join of NVML and Triton series).")
else:
    st.dataframe(placement["series"].str.split(", ", n=1, expand=True).rename(
        columns={0: "GPU", 1: "model"}).drop_duplicates(), hide_index=True, key="gpu_placement")

left, right = st.columns(2)
with left:
    st.subheader("Utilization")
    st.altair_chart(charts.time_chart(util, unit="utilization %", y_max=100), key="gpu_util")
with right:
    st.subheader("Memory used")
    mem = gpu_series("nvml_gpu_memory_used_bytes", "nv_gpu_memory_used_bytes", scale=2**-30)
    st.altair_chart(charts.time_chart(mem, unit="GiB"), key="gpu_mem")

left, right = st.columns(2)
with left:
    st.subheader("Power")
    power = gpu_series("nvml_gpu_power_watts", "nv_gpu_power_usage")
    st.altair_chart(charts.time_chart(power, unit="W"), key="gpu_power")
with right:
    st.subheader("Temperature")
    temp = gpu_series("nvml_gpu_temperature_celsius")
    if temp.empty:
        st.caption("Needs NVML (Triton does not export GPU temperature).")
    else:
        st.altair_chart(charts.time_chart(temp, unit="°C"), key="gpu_temp")

left, right = st.columns(2)
with left:
    st.subheader("SM clock")
    clock = gpu_series("nvml_gpu_sm_clock_hertz", scale=1e-6)
    if clock.empty:
        st.caption("Needs NVML (Triton does not export clocks).")
    else:
        st.altair_chart(charts.time_chart(clock, unit="MHz"), key="gpu_clock")
with right:
    st.subheader("Throttle reasons")
    throttle = loaders.series(sel.url, "nvml_gpu_clocks_event_active", sel.start, sel.end,
                              sel.step, target=sel.target, legend=("gpu_uuid", "reason"),
                              scale=100.0)
    if throttle.empty:
        st.caption("Needs NVML (Triton does not export throttle reasons).")
    elif not (throttle["value"] > 0).any():
        st.success("No throttling in this range.")
    else:
        st.altair_chart(charts.time_chart(throttle[throttle["value"] > 0],
                                          unit="% of readings active"), key="gpu_throttle")
