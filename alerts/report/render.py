"""Renderers of a :class:`model.Report`: one self-contained HTML file, Markdown and JSON.

They lay out the numbers of the report and compute none: the same values reach all three
(the JSON is :func:`model.to_json`).  The HTML embeds its charts as ``data:`` URIs and its CSS
inline, so it reads the same mailed, opened from disk or printed; Jinja2 escapes every value.
"""

from __future__ import annotations

import gc
import json
import math
import multiprocessing
from collections.abc import Callable, Mapping
from concurrent.futures import ProcessPoolExecutor
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo

from tritonwatch.alerts.report.model import Report, to_json

if TYPE_CHECKING:
    import jinja2

TEMPLATE = Path(__file__).with_name("report.html.j2")
DASH = "\u2013"  # an en dash: "no data"


def render_json(report: Report) -> str:
    return json.dumps(to_json(report), indent=2, ensure_ascii=False, allow_nan=False) + "\n"


def _dashed(show: Callable[[float], str]) -> Callable[[float | None], str]:
    """``show``, with an en dash for no data."""
    return lambda x: DASH if x is None else show(x)


class _Fmt:
    """Number formatting shared by the HTML and Markdown renderers (an en dash for no data)."""

    def __init__(self, tz: str) -> None:
        self.zone = ZoneInfo(tz)

    @staticmethod
    def pct(x: float | None, digits: int = 1) -> str:
        return DASH if x is None else f"{x * 100:.{digits}f} %"

    points = staticmethod(_dashed(lambda v: f"{v * 100:+.3f} pt"))
    change = staticmethod(_dashed(lambda v: "new" if math.isinf(v) else f"{v * 100:+.1f} %"))
    burn = staticmethod(_dashed(lambda v: f"{v:.3g}x"))
    num = staticmethod(_dashed(lambda v: f"{v:.3g}"))
    ms = staticmethod(_dashed(lambda v: f"{v * 1000:.3g} ms"))

    @staticmethod
    def dur(s: float) -> str:
        minutes = round(s / 60)
        if minutes < 60:
            return f"{minutes} min"
        hours, minutes = divmod(minutes, 60)
        return f"{hours} h {minutes:02d} min" if hours < 48 else f"{s / 86400:.1f} d"

    @staticmethod
    def labels(lbl: Mapping[str, str]) -> str:
        return ", ".join(f"{k}={v}" for k, v in sorted(lbl.items()) if k != "alertname")

    def when(self, ts: float | None) -> str:
        if ts is None:
            return DASH
        return datetime.fromtimestamp(ts, self.zone).strftime("%a %Y-%m-%d %H:%M %Z")

    def day(self, ts: float | None) -> str:
        if ts is None:
            return DASH
        return datetime.fromtimestamp(ts, self.zone).strftime("%Y-%m-%d")

    def val(self, x: float, series: str) -> str:
        if series.endswith("_seconds"):
            return self.ms(x)
        return self.pct(x, 1)

    @staticmethod
    def barw(remaining: float) -> float:
        return round(max(0.0, min(1.0, remaining)) * 100, 1)

    @staticmethod
    def barc(remaining: float) -> str:
        return "#2e7d32" if remaining >= 0.5 else "#f9a825" if remaining > 0 else "#c62828"

    def functions(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in (
            "pct", "points", "change", "burn", "num", "ms", "dur", "labels", "when", "day",
            "val", "barw", "barc")}


@lru_cache(maxsize=1)
def _template() -> jinja2.Template:
    # Imported here: ``serve`` loads this module for its weekly report job, and Jinja2
    # (about 2 MB resident) is needed only once a week, when the report is rendered.
    import jinja2

    env = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined,
                             trim_blocks=True, lstrip_blocks=True)
    return env.from_string(TEMPLATE.read_text(encoding="utf-8"))


#: How long a child process drawing the charts may take (``isolate_charts``).
CHARTS_TIMEOUT_S = 600.0


def render_html(report: Report, *, completeness_warning: float = 0.95,
                isolate_charts: bool = False) -> str:
    """The self-contained HTML document (charts inline, no external asset).

    With ``isolate_charts`` the charts are drawn in a child process (``serve``'s weekly
    job): matplotlib, once imported, stays resident for the life of the process (measured:
    29 MB to import, more once a figure is drawn), which a collector drawing one report a week
    should not carry between reports.
    """
    if isolate_charts:
        ctx = multiprocessing.get_context("spawn")  # never fork a process that runs threads
        with ProcessPoolExecutor(max_workers=1, mp_context=ctx) as pool:
            drawn = pool.submit(draw_charts, report, completeness_warning).result(
                timeout=CHARTS_TIMEOUT_S)
    else:
        drawn = draw_charts(report, completeness_warning)
    return _template().render(r=report, charts=drawn, threshold=completeness_warning,
                              **_Fmt(report.timezone).functions())


def draw_charts(report: Report, completeness_warning: float) -> dict[str, Any]:
    """The report's charts as ``data:`` URIs, by kind (what the HTML template embeds)."""
    # Imported here: matplotlib holds about 30 MB once loaded, which a `serve` that draws no
    # report (the week already kept) should not carry.
    from tritonwatch.alerts.report import charts

    try:
        return {
            "burn": {s.name: charts.burn_chart(s, report.hours) for s in report.slos},
            "completeness": (charts.completeness_chart(report.completeness, completeness_warning)
                             if report.completeness else None),
            "efficiency": charts.efficiency_chart(report.efficiency),
        }
    finally:
        # A closed figure is a reference cycle of tens of thousands of objects, and `serve`
        # runs its oldest collection rarely (tritonwatch.memory.tune_gc): without this the
        # charts of a 1,000-target week stayed resident (about 40 MB).
        gc.collect()


def _md_table(head: list[str], rows: list[list[str]]) -> list[str]:
    def cell(text: str) -> str:
        return text.replace("|", "\\|").replace("\n", " ")

    return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head),
            *("| " + " | ".join(cell(c) for c in row) + " |" for row in rows), ""]


def render_markdown(report: Report) -> str:
    """The same numbers as the HTML, as Markdown (tables, no images)."""
    f = _Fmt(report.timezone)
    s = report.summary
    out = [f"# Weekly SLO report {report.week}", "",
           f"{report.start_local} {DASH} {report.end_local} ({report.timezone}, "
           f"{report.hours:g} hours)", "",
           f"**{s.held} held, {s.at_risk} at risk, {s.breached} breached**"
           + (f", {s.no_data} without data" if s.no_data else "")
           + f"; {s.incidents} incidents ({s.postmortems} postmortem), {s.regressions} "
             f"regressions, {s.advice} tuning hints. {s.budget_health}", ""]
    if report.dst_note:
        out += [f"> {report.dst_note}", ""]
    out += [f"> ⚠ {w}" for w in report.warnings] + ([""] if report.warnings else [])
    out += ["## Service level objectives", ""]
    out += _md_table(
        ["SLO", "status", "this week", "vs last", "rolling", "objective", "budget left",
         "spent this week", "peak burn (1 h)", "exhausts"],
        [[x.name, x.state.replace("_", " "), f.pct(x.sli_week, 3), f.points(x.sli_change),
          f"{f.pct(x.sli_window, 3)} ({x.window})", f.pct(x.objective, 2),
          f.pct(x.budget_remaining, 1), f.pct(x.budget_spent_week, 1), f.burn(x.peak_burn_1h),
          "spent" if x.exhausted else f.day(x.exhaustion_at) if x.exhaustion_at
          else "not burning"] for x in report.slos])
    if report.slos:
        sym = {"met": "■", "missed": "✖", "no_data": "·"}
        out += [f"Last {len(report.slos[0].strip)} weeks (■ met, ✖ missed, · no data):", ""]
        out += [f"- {x.name}: " + " ".join(sym[c.state] for c in x.strip) for x in report.slos]
        out.append("")
    out += ["## Incidents", ""]
    out += _md_table(
        ["alert", "labels", "started", "duration", "budget spent", "postmortem"],
        [[i.alertname, f.labels(i.labels), f.when(i.started_at),
          f.dur(i.duration_s) + ("" if i.resolved_at is not None else " (still firing)"),
          ", ".join(f"{b.slo} {f.pct(b.budget_spent, 1)}" for b in i.budget) or DASH,
          "yes" if i.postmortem else ""] for i in report.incidents]) if report.incidents \
        else ["No alerts fired this week.", ""]
    out += ["## Regressions against last week", ""]
    out += _md_table(
        ["what", "target", "labels", "this week", "last week", "change"],
        [[g.what, g.target, f.labels(g.labels), f.val(g.current, g.series),
          f.val(g.baseline, g.series), f.change(g.change)] for g in report.regressions]) \
        if report.regressions else ["No regression against last week.", ""]
    out += ["## Efficiency per model", ""]
    out += _md_table(
        ["target", "model", "fill rate", "KV headroom", "GPU util.", "tokens/s per GPU",
         "J / inference", "queue time"],
        [[e.target, e.model,
          f"{f.pct(e.fill_rate.current, 0)} ({f.change(e.fill_rate.change)})",
          f"{f.pct(e.kv_cache_headroom.current, 0)} ({f.change(e.kv_cache_headroom.change)})",
          f"{f.pct(e.gpu_utilization.current, 0)} ({f.change(e.gpu_utilization.change)})",
          f"{f.num(e.tokens_per_s_per_gpu.current)} "
          f"({f.change(e.tokens_per_s_per_gpu.change)})",
          f"{f.num(e.energy_per_inference_j.current)} "
          f"({f.change(e.energy_per_inference_j.change)})",
          f"{f.ms(e.queue_time_s.current)} ({f.change(e.queue_time_s.change)})"]
         for e in report.efficiency]) if report.efficiency else ["No per-model data.", ""]
    out += ["## Tuning advice", ""]
    for a in report.advice:
        nums = "; ".join(f"{k} = {v:.6g}" for k, v in a.numbers.items())
        out += [f"- **{a.title}** ({a.model} on {a.target}): {a.text} _({nums})_"]
    out += ["" if report.advice else "No tuning advice this week.", ""]
    out += ["## Data completeness", ""]
    out += _md_table(
        ["target", "stored", "expected", "share", ""],
        [[c.target, str(c.stored), str(c.expected), f.pct(c.ratio, 1),
          "⚠ below threshold" if c.warning else ""] for c in report.completeness])
    out += [f"_Generated {f.when(report.generated_at)}, configuration {report.config_key}._", ""]
    return "\n".join(out)


def render(report: Report, fmt: str, *, completeness_warning: float = 0.95,
           isolate_charts: bool = False) -> str:
    if fmt == "html":
        return render_html(report, completeness_warning=completeness_warning,
                           isolate_charts=isolate_charts)
    if fmt == "md":
        return render_markdown(report)
    if fmt == "json":
        return render_json(report)
    raise ValueError(f"unknown report format {fmt!r}: use html, md or json")
