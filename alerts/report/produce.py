"""Produce a week's report: build it, render it, keep it in the store and on disk.

``produce`` is what both ``tritonwatch report`` and the weekly job in ``serve`` call.  The
store's unique key ``(week, config_key)`` makes the scheduled path produce a week once: a
second process (or a restarted one) finds it kept and does nothing, and of two racing for it
only the one whose INSERT lands writes files and delivers.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tritonwatch.alerts.report.build import build_report
from tritonwatch.alerts.report.model import Report, to_json
from tritonwatch.alerts.report.render import render
from tritonwatch.alerts.report.weeks import Week
from tritonwatch.schemas.config import Config
from tritonwatch.schemas.rules import SloSpec, load_rules_file
from tritonwatch.store import Store
from tritonwatch.store.reports import ReportStore

log = logging.getLogger(__name__)

FORMATS = ("html", "md", "json")


def slo_specs(config: Config) -> tuple[SloSpec, ...]:
    """The SLOs of ``alerting.rules_file`` (none without one); ConfigError when invalid."""
    if config.alerting.rules_file is None:
        return ()
    return tuple(load_rules_file(config.alerting.rules_file).slos)


def config_key(config: Config, specs: Sequence[SloSpec]) -> str:
    """16 hex digits identifying what shapes a report: time zone, SLOs, targets and their
    intervals, the report's thresholds.  Delivery settings and paths are left out: changing
    where a report goes does not make it a different report."""
    rep = config.reports
    shape = {
        "timezone": rep.timezone,
        "completeness_warning": rep.completeness_warning,
        "history_weeks": rep.history_weeks,
        "slos": [s.model_dump(mode="json") for s in specs],
        "targets": sorted((t.name, config.interval_for(t)) for t in config.targets),
    }
    text = json.dumps(shape, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Produced:
    id: int
    report: Report
    documents: dict[str, str]
    files: tuple[Path, ...]


def _write_atomic(path: Path, text: str) -> None:
    # A reader (a web server publishing the folder, a mail job) never sees half a file.
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def write_files(out_dir: Path, week: str, documents: dict[str, str],
                formats: Sequence[str]) -> tuple[Path, ...]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for fmt in formats:
        path = out_dir / f"{week}.{fmt}"
        _write_atomic(path, documents[fmt])
        paths.append(path)
    return tuple(paths)


def produce(
    store: Store,
    config: Config,
    week: Week,
    *,
    specs: Sequence[SloSpec] | None = None,
    now: float | None = None,
    replace: bool = False,
    out_dir: Path | None = None,
    formats: Sequence[str] | None = None,
    isolate_charts: bool = False,
) -> Produced | None:
    """Build, render and keep the report of ``week``; None when it was kept already (and
    ``replace`` is false), in which case nothing is written."""
    specs = slo_specs(config) if specs is None else specs
    key = config_key(config, specs)
    reports = ReportStore(store)
    if not replace and reports.exists(week.name, key):
        return None
    now = time.time() if now is None else now
    report = build_report(store, config, specs, week, config_key=key, now=now)
    warn = config.reports.completeness_warning
    documents = {fmt: render(report, fmt, completeness_warning=warn,
                             isolate_charts=isolate_charts) for fmt in FORMATS}
    report_id = reports.insert(
        week=week.name, config_key=key, timezone=week.tz, start=week.start, end=week.end,
        created_at=now, summary=to_json(report)["summary"], documents=documents,
        replace=replace)
    if report_id is None:
        log.info("report %s: another process kept it first", week.name)
        return None
    files = write_files(out_dir or config.reports.out_dir, week.name, documents,
                        formats or config.reports.formats)
    log.info("report %s kept (id %d), files %s", week.name, report_id,
             ", ".join(str(p) for p in files))
    return Produced(report_id, report, documents, files)
