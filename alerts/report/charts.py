"""The report's charts as PNG ``data:`` URIs, so the HTML needs no other file.

matplotlib's Agg backend (no display), one figure at a time, closed after use.  PNG rather than
SVG: mail clients that strip inline SVG still show an image, and it prints the same.
"""

from __future__ import annotations

import base64
import io
import math
from collections.abc import Sequence

import matplotlib

matplotlib.use("Agg")  # before pyplot: no display, thread-safe enough for one figure at a time

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from tritonwatch.alerts.report.model import ModelEfficiency, SloSection, TargetCompleteness

_DPI = 110
#: Most targets the completeness chart draws (the lowest; the table lists them all).
COMPLETENESS_CHART_MAX = 40
_OK, _WARN, _BAD, _GREY, _PREV = "#2e7d32", "#f9a825", "#c62828", "#9e9e9e", "#90a4ae"


def _uri(fig: Figure) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=_DPI, bbox_inches="tight")
    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def burn_chart(section: SloSection, hours: float) -> str:
    """The SLO's 1-hour burn rate through the week, against 1x (budget spent exactly)."""
    fig, ax = plt.subplots(figsize=(8.2, 1.9))
    burns = [b if b is not None else math.nan for b in section.hourly_burn]
    xs = range(len(burns))
    colors = [_BAD if b > 14.4 else _WARN if b > 1 else _OK for b in
              (0.0 if math.isnan(b) else b for b in burns)]
    ax.bar(xs, [0.0 if math.isnan(b) else b for b in burns], width=1.0, color=colors)
    ax.axhline(1.0, color="#424242", lw=0.8, ls="--")
    ax.set_xlim(0, max(1, len(burns)))
    ax.set_xticks([d * 24 for d in range(8) if d * 24 <= hours])
    ax.set_xticklabels(["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun", ""][
        : len([d for d in range(8) if d * 24 <= hours])], fontsize=8)
    ax.set_ylabel("burn (1 h)", fontsize=8)
    ax.tick_params(axis="y", labelsize=8)
    top = max([b for b in burns if not math.isnan(b)] + [1.5])
    ax.set_ylim(0, top * 1.15)
    ax.set_title(f"{section.name}: hourly error-budget burn (dashed: 1x)", fontsize=9,
                 loc="left")
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    return _uri(fig)


def completeness_chart(rows: Sequence[TargetCompleteness], threshold: float) -> str:
    """Share of expected scrapes stored per target, against the warning line; of a larger
    fleet, the :data:`COMPLETENESS_CHART_MAX` targets with the least (the report's table lists
    every target)."""
    total = len(rows)
    if total > COMPLETENESS_CHART_MAX:
        # One bar per target made a 1,000-target chart 33,000 pixels tall: 120 MB of image
        # buffer for `serve` to draw, and a picture nobody reads.
        lowest = sorted(range(total), key=lambda i: rows[i].ratio)[:COMPLETENESS_CHART_MAX]
        rows = [rows[i] for i in sorted(lowest)]
    fig, ax = plt.subplots(figsize=(8.2, 0.45 + 0.3 * max(1, len(rows))))
    names = [r.target for r in rows]
    ratios = [r.ratio * 100 for r in rows]
    ax.barh(names, ratios, color=[_OK if r.ratio >= threshold else _BAD for r in rows])
    ax.axvline(threshold * 100, color="#424242", lw=0.8, ls="--")
    ax.set_xlim(0, 100)
    ax.invert_yaxis()
    ax.set_xlabel("% of expected scrapes stored"
                  + (f" (the {len(rows)} lowest of {total} targets)" if total > len(rows) else ""),
                  fontsize=8)
    ax.tick_params(labelsize=8)
    for y, v in enumerate(ratios):
        ax.text(min(v, 97), y, f" {v:.1f} %", va="center", ha="right" if v > 90 else "left",
                fontsize=7, color="white" if v > 90 else "black")
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    return _uri(fig)


def efficiency_chart(rows: Sequence[ModelEfficiency]) -> str | None:
    """Fill rate, KV-cache headroom and GPU utilization per model, this week against last."""
    metrics = (("fill_rate", "fill rate"), ("kv_cache_headroom", "KV headroom"),
               ("gpu_utilization", "GPU util."))
    bars = []
    for row in rows:
        for attr, label in metrics:
            change = getattr(row, attr)
            if change.current is not None:
                bars.append((f"{row.model}\n{label}", change.current, change.previous))
    if not bars:
        return None
    fig, ax = plt.subplots(figsize=(8.2, 2.2))
    xs = range(len(bars))
    ax.bar([x - 0.2 for x in xs], [(b[2] or 0.0) * 100 for b in bars], width=0.4,
           color=_PREV, label="previous week")
    ax.bar([x + 0.2 for x in xs], [b[1] * 100 for b in bars], width=0.4, color="#1565c0",
           label="this week")
    ax.set_xticks(list(xs))
    ax.set_xticklabels([b[0] for b in bars], fontsize=7)
    ax.set_ylim(0, 105)
    ax.set_ylabel("%", fontsize=8)
    ax.tick_params(axis="y", labelsize=8)
    ax.legend(fontsize=7, frameon=False, loc="upper right", ncol=2)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    return _uri(fig)
