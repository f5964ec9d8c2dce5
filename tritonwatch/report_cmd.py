"""``tritonwatch report``: the weekly SLO report of one ISO week, now.

Without ``--week`` the last complete week in ``reports.timezone``.  The report is kept in the
store (replacing one of the same week and configuration: late data may have arrived) and
written to ``--out`` (default ``reports.out_dir``) as ``<week>.<format>``.  Not delivered:
delivery is the scheduled job's (``serve``).
Exit 0 on success, 2 on bad input (config, rules, week, formats) or a store error.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any


def _out(text: str) -> None:
    sys.stdout.write(text + "\n")


def _err(text: str) -> None:
    sys.stderr.write(text + "\n")


def _formats(value: str) -> tuple[str, ...]:
    found = tuple(dict.fromkeys(f.strip() for f in value.split(",") if f.strip()))
    bad = [f for f in found if f not in ("html", "md", "json")]
    if bad or not found:
        raise argparse.ArgumentTypeError(
            f"--format {value!r}: use a comma-separated list of html, md, json")
    return found


def run(args: argparse.Namespace) -> int:
    from tritonwatch.alerts.report.produce import produce, slo_specs
    from tritonwatch.alerts.report.weeks import Week
    from tritonwatch.schemas.config import ConfigError, load_config
    from tritonwatch.store import StoreError, open_store
    from tritonwatch.store.tsdb import TsdbReader

    try:
        config = load_config(args.config)
        specs = slo_specs(config)
    except ConfigError as exc:
        for line in exc.errors:
            _err(f"{exc.source}: {line}")
        return 2
    tz = config.reports.timezone
    try:
        week = Week.parse(args.week, tz) if args.week else Week.last_complete(time.time(), tz)
    except ValueError as exc:
        _err(f"report: --week: {exc}")
        return 2
    out_dir = Path(args.out) if args.out else config.reports.out_dir
    try:
        ts = config.store.timeseries
        with open_store(config.store.url, timeseries=None if ts is None
                        else TsdbReader.from_config(ts)) as store:
            store.migrations.apply()
            produced = produce(store, config, week, specs=specs, replace=True,
                               out_dir=out_dir, formats=args.format or config.reports.formats)
    except (StoreError, OSError) as exc:
        _err(f"report: {exc}")
        return 2
    assert produced is not None  # replace=True always keeps it
    s = produced.report.summary
    _out(f"report {week.name} ({week.hours:g} h, {tz}): {s.held} held, {s.at_risk} at risk, "
         f"{s.breached} breached, {s.incidents} incident(s), {s.regressions} regression(s), "
         f"{s.advice} tuning hint(s); id {produced.id}")
    for path in produced.files:
        _out(f"  {path}")
    for warning in produced.report.warnings:
        _err(f"report: warning: {warning}")
    return 0


def add_command(sub: Any) -> None:
    """Register ``report`` on the CLI's sub-parsers."""
    p = sub.add_parser("report", help="the weekly SLO report of one ISO week, now")
    p.add_argument("--week", help="ISO week, e.g. 2026-W48 (default: the last complete week "
                   "in reports.timezone)")
    p.add_argument("--config", help="YAML config file (default: embedded defaults)")
    p.add_argument("--out", help="directory for the files (default: reports.out_dir)")
    p.add_argument("--format", type=_formats,
                   help="comma-separated html,md,json (default: reports.formats)")
    p.set_defaults(func=run)
