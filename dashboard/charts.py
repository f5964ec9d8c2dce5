"""Altair charts: every time chart has a unit on its axis, a legend, the browser's time zone on
the axis and UTC in the tooltip, and the model's deploy markers drawn as dashed rules.

Values from targets (model names, labels) reach the browser only as chart data, which Vega
renders as SVG text, never as HTML.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import altair as alt
import pandas as pd

from tritonwatch.dashboard.loaders import utc_text
from tritonwatch.dashboard.model_loaders import Marker

HEIGHT = 220


def _utc(df: pd.DataFrame) -> pd.DataFrame:
    out = df.copy()
    out["UTC"] = out["time"].dt.strftime("%Y-%m-%d %H:%M:%S")
    return out


def markers_layer(markers: Sequence[Marker]) -> Any:
    if not markers:
        return None
    df = pd.DataFrame({
        "time": pd.to_datetime([m.ts for m in markers], unit="s", utc=True),
        "marker": [m.kind for m in markers], "detail": [m.detail for m in markers],
    })
    df = _utc(df)
    return alt.Chart(df).mark_rule(strokeDash=[4, 3], color="#888", size=1.5).encode(
        x="time:T",
        tooltip=[alt.Tooltip("marker:N"), alt.Tooltip("detail:N"),
                 alt.Tooltip("UTC:N", title="UTC")],
    )


def time_chart(df: pd.DataFrame, *, unit: str, legend: str = "series",
               markers: Sequence[Marker] = (), mark: str = "line",
               threshold: float | None = None, threshold_label: str = "SLO",
               y_max: float | None = None,
               thresholds: Sequence[tuple[float, str]] = ()) -> Any:
    """A line (or stacked area) per ``legend`` value of a long frame (time, value, legend)."""
    data = _utc(df)
    value = "value" if "value" in data.columns else data.columns[-2]
    y = alt.Y(f"{value}:Q", title=unit, axis=alt.Axis(format="~s"),
              scale=alt.Scale(domain=[0, y_max]) if y_max is not None else alt.Undefined,
              stack="zero" if mark == "area" else None)
    base = alt.Chart(data)
    # Points as well where a line has few: a single bucket would otherwise draw nothing.
    few = len(data) < 20 * max(1, data[legend].nunique()) if len(data) else False
    drawn = (base.mark_area(opacity=0.8) if mark == "area"
             else base.mark_line(point=alt.OverlayMarkDef(size=30) if few else False))
    span = (data["time"].max() - data["time"].min()).total_seconds() if len(data) else 0
    # Hours and minutes within a day, the date beyond (vega formats in the browser's zone).
    fmt = "%H:%M:%S" if span <= 600 else "%H:%M" if span <= 86400 else "%b %d %H:%M"
    axis = alt.Axis(format=fmt, labelOverlap=True)
    chart: Any = drawn.encode(
        x=alt.X("time:T", title="time (your time zone)", axis=axis),
        y=y,
        color=alt.Color(f"{legend}:N", title=None if legend == "series" else legend,
                        legend=alt.Legend(orient="bottom", labelLimit=280)),
        tooltip=[alt.Tooltip("UTC:N", title="UTC"), alt.Tooltip(f"{legend}:N"),
                 alt.Tooltip(f"{value}:Q", title=unit, format=".4~g")],
    ).properties(height=HEIGHT)
    lines = list(thresholds) + ([] if threshold is None else [(threshold, threshold_label)])
    if lines:
        rules = pd.DataFrame({"y": [y for y, _ in lines], "what": [w for _, w in lines]})
        base_rules = alt.Chart(rules)
        chart = chart + base_rules.mark_rule(color="#d62728", strokeDash=[6, 3]).encode(
            y="y:Q", tooltip=[alt.Tooltip("what:N"), alt.Tooltip("y:Q", title=unit)])
        chart = chart + base_rules.mark_text(align="left", dx=4, dy=-6, color="#d62728",
                                             fontSize=11).encode(
            x=alt.value(0), y="y:Q", text="what:N")
    layer = markers_layer(markers)
    if layer is not None:
        chart = chart + layer
    return chart


def bar_chart(df: pd.DataFrame, x: str, y: str, *, x_title: str, y_title: str,
              highlight: str | None = None) -> Any:
    color: Any = alt.value("#4c78a8")
    if highlight is not None:
        color = alt.Color(f"{highlight}:N", title=highlight,
                          legend=alt.Legend(orient="bottom"))
    return alt.Chart(df).mark_bar().encode(
        x=alt.X(f"{x}:O", title=x_title, axis=alt.Axis(labelAngle=0)),
        y=alt.Y(f"{y}:Q", title=y_title), color=color,
        tooltip=[alt.Tooltip(f"{x}:O", title=x_title), alt.Tooltip(f"{y}:Q", title=y_title)],
    ).properties(height=HEIGHT)


def marker_rows(markers: Sequence[Marker]) -> list[dict[str, str]]:
    """Deploy markers as table rows (the model and LLM pages list them under their charts)."""
    return [{"time (UTC)": utc_text(m.ts), "what": m.kind, "detail": m.detail} for m in markers]
