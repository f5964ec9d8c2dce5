"""The ``tritonwatch`` command line (argparse; one sub-command per job)."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from collections.abc import Sequence
from typing import Any

from tritonwatch.schemas.config import ConfigError, load_config

log = logging.getLogger("tritonwatch")


def _out(text: str) -> None:
    sys.stdout.write(text + "\n")


def _err(text: str) -> None:
    sys.stderr.write(text + "\n")


def _max_batch_sizes(values: Sequence[str]) -> dict[str, int]:
    sizes = {}
    for value in values:
        model, sep, size = value.rpartition("=")
        if not sep or not model or not size.isdigit():
            raise argparse.ArgumentTypeError(f"--max-batch-size {value!r}: expected MODEL=N")
        sizes[model] = int(size)
    return sizes


def cmd_check_config(args: argparse.Namespace) -> int:
    try:
        config = load_config(args.file)
    except ConfigError as exc:
        _err(f"{exc.source}: {len(exc.errors)} error(s)")
        for line in exc.errors:
            _err(f"  {line}")
        return 1
    backend = config.store.url.split(":")[0]
    _out(f"{args.file}: OK ({len(config.targets)} target(s), store {backend})")
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from tritonwatch.memory import tune_gc, tune_malloc
    from tritonwatch.serve import serve

    try:
        config = load_config(args.config)
    except ConfigError as exc:
        for line in exc.errors:
            _err(f"{exc.source}: {line}")
        return 2
    tune_malloc()
    tune_gc()
    asyncio.run(serve(config, listen=args.listen))
    return 0


def cmd_inspect(args: argparse.Namespace) -> int:
    from tritonwatch.inspect import inspect_sources
    from tritonwatch.render import render_inspect

    try:
        sizes = _max_batch_sizes(args.max_batch_size)
        result = asyncio.run(inspect_sources(
            args.source, args.source2, seconds=args.seconds, max_batch_size=sizes,
            http_url=args.http_url,
        ))
    except (argparse.ArgumentTypeError, ValueError, OSError) as exc:
        _err(f"inspect: {exc}")
        return 2
    if args.json:
        _out(json.dumps(result, indent=2, allow_nan=False))
    else:
        render_inspect(result)
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from tritonwatch.demo import run_demo

    return run_demo(listen=args.listen, duration=args.duration, data_dir=args.data_dir)


def cmd_probe(args: argparse.Namespace) -> int:
    from tritonwatch.probe_cmd import run

    return run(args)


def cmd_dashboard(args: argparse.Namespace) -> int:
    from tritonwatch.dashboard_cmd import run

    return run(args)


def _duration(value: str) -> float:
    from tritonwatch.schemas.config import parse_duration

    try:
        return parse_duration(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _time(value: str) -> float:
    """Unix seconds, ``now``, ``now-1h``, or an ISO 8601 time (UTC unless it says otherwise)."""
    from datetime import UTC, datetime
    from time import time

    text = value.strip()
    if text == "now" or text.startswith("now-"):
        return time() - (_duration(text[4:]) if text != "now" else 0.0)
    try:
        return float(text)
    except ValueError:
        pass
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"invalid time {value!r}: use unix seconds, ISO 8601 or now-<duration>"
        ) from None
    return (parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)).timestamp()


def cmd_record(args: argparse.Namespace) -> int:
    from pathlib import Path

    from tritonwatch.record import RecordError, record

    try:
        written = asyncio.run(record(args.url, Path(args.out), every=args.every,
                                     duration=args.for_, stats_url=args.stats_url))
    except RecordError as exc:
        _err(f"record: {exc}")
        return 2
    _err(f"record: {len(written)} scrape(s) saved under {args.out}")
    return 0 if written else 1


def _print_alerts(outcome: Any, as_json: bool, what: str) -> None:
    from tritonwatch.replay import Outcome

    assert isinstance(outcome, Outcome)
    if as_json:
        _out(json.dumps({"alerts": [a.as_json() for a in outcome.alerts]}, indent=2,
                        allow_nan=False))
        return
    from datetime import UTC, datetime

    def iso(ts: float) -> str:
        return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S")

    span = (f"{iso(outcome.start)} .. {iso(outcome.end)} UTC"
            if outcome.start is not None and outcome.end is not None else "nothing")
    _out(f"{what}: {span}, {outcome.evaluations} evaluation(s); "
         f"{len(outcome.alerts)} alert(s) would have fired")
    for alert in outcome.alerts:
        until = iso(alert.resolved_at) if alert.resolved_at is not None else "still firing"
        labels = ", ".join(f"{k}={v}" for k, v in sorted(alert.labels.items())
                           if k != "alertname")
        _out(f"  {iso(alert.fired_at)} -> {until}  {alert.alertname} {{{labels}}}")
    for rule, count in sorted(outcome.rule_failures.items()):
        _err(f"  rule {rule!r} failed {count} time(s) (see the log)")


def _load_rules(path: str | None) -> Any:
    from tritonwatch.alerts.rules import load_rules

    return load_rules(path)


def cmd_replay(args: argparse.Namespace) -> int:
    from tritonwatch.replay import ReplayError, replay

    try:
        rules = _load_rules(args.rules)
        outcome = replay(args.dir, rules, target=args.target, eval_interval=args.eval_interval,
                         ttft_slo=args.ttft_slo, itl_slo=args.itl_slo)
    except ConfigError as exc:
        for line in exc.errors:
            _err(f"{exc.source}: {line}")
        return 2
    except (ReplayError, OSError) as exc:
        _err(f"replay: {exc}")
        return 2
    _print_alerts(outcome, args.json, f"replay of {args.dir}")
    return 0


def cmd_backtest(args: argparse.Namespace) -> int:
    from tritonwatch.replay import ReplayError, backtest
    from tritonwatch.store import StoreError, open_store

    try:
        config = load_config(args.config)
        rules = _load_rules(args.rules)
    except ConfigError as exc:
        for line in exc.errors:
            _err(f"{exc.source}: {line}")
        return 2
    step = args.step or config.alerting.eval_interval
    try:
        with open_store(config.store.url) as store:
            outcome = backtest(store, rules, start=args.from_, end=args.to, step=step)
    except (ReplayError, StoreError, ValueError) as exc:
        _err(f"backtest: {exc}")
        return 2
    _print_alerts(outcome, args.json, "backtest")
    return 0


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("tritonwatch")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tritonwatch", description="Observability and SLOs for Triton Inference Server fleets"
    )
    parser.add_argument("--version", action="version", version=f"tritonwatch {_version()}")
    parser.add_argument("-v", "--verbose", action="count", default=0,
                        help="more logging: -v info, -vv debug, -vvv also every HTTP request "
                        "and scheduler run")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("serve", help="run the collector, store jobs and API until SIGTERM")
    p.add_argument("--config", help="YAML config file (default: embedded defaults)")
    p.add_argument("--listen", help="HOST:PORT for the API (default: api.listen)")
    p.set_defaults(func=cmd_serve)

    from tritonwatch.dashboard_cmd import add_arguments as dashboard_arguments

    p = sub.add_parser("dashboard", help="the Streamlit dashboard over serve's store (read-only)")
    dashboard_arguments(p)
    p.set_defaults(func=cmd_dashboard)

    p = sub.add_parser("check-config", help="validate a config file, print every error")
    p.add_argument("file")
    p.set_defaults(func=cmd_check_config)

    p = sub.add_parser("inspect", help="parse a /metrics URL or file and show SLIs")
    p.add_argument("source", help="http(s) URL of /metrics, or a saved file")
    p.add_argument("source2", nargs="?", help="a second, later snapshot (file or URL)")
    p.add_argument("--seconds", type=float, help="time between the snapshots (or between two "
                   "reads of SOURCE when it is a URL)")
    p.add_argument("--max-batch-size", action="append", default=[], metavar="MODEL=N",
                   help="fill-rate denominator for MODEL (repeatable)")
    p.add_argument("--http-url", help="Triton HTTP API for model configs (default: guessed)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=cmd_inspect)

    p = sub.add_parser("demo", help="a real local Triton, load, and serve scraping it")
    p.add_argument("--listen", default="127.0.0.1:8080")
    p.add_argument("--duration", type=float, help="stop after this many seconds (default: Ctrl-C)")
    p.add_argument("--data-dir", default="tritonwatch-data")
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("record", help="save raw scrapes (+ statistics, model configs) to DIR")
    p.add_argument("url", help="Triton /metrics URL")
    p.add_argument("--out", required=True, help="recording directory (created)")
    p.add_argument("--every", type=_duration, default=15.0, help="scrape interval (default 15s)")
    p.add_argument("--for", dest="for_", type=_duration, required=True,
                   help="how long to record (e.g. 10m)")
    p.add_argument("--stats-url", help="Triton HTTP API (http://host:8000): statistics with "
                   "every scrape, model configs once")
    p.set_defaults(func=cmd_record)

    p = sub.add_parser("replay", help="the alert rules over a recording, in simulated time")
    p.add_argument("dir", help="recording directory (see `record`)")
    p.add_argument("--rules", help="rules file (default: the built-in rules)")
    p.add_argument("--json", action="store_true",
                   help='print {"alerts": [{alertname, labels, fired_at, resolved_at}]}')
    p.add_argument("--eval-interval", type=_duration,
                   help="evaluate every this much simulated time (default: at every scrape)")
    p.add_argument("--target", default="replay", help="target name of the replayed series")
    p.add_argument("--ttft-slo", type=_duration, help="TTFT threshold for probes.jsonl events")
    p.add_argument("--itl-slo", type=_duration, help="ITL threshold for probes.jsonl events")
    p.set_defaults(func=cmd_replay)

    p = sub.add_parser("backtest", help="the alert rules over stored history")
    p.add_argument("--rules", help="rules file (default: the built-in rules)")
    p.add_argument("--config", help="YAML config file naming the store (default: embedded)")
    p.add_argument("--from", dest="from_", type=_time, required=True,
                   help="start: unix seconds, ISO 8601, or now-<duration>")
    p.add_argument("--to", type=_time, default=_time("now"), help="end (default: now)")
    p.add_argument("--step", type=_duration,
                   help="evaluation step (default: alerting.eval_interval)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=cmd_backtest)

    from tritonwatch.probe_cmd import add_arguments

    p = sub.add_parser("probe", help="one-off synthetic LLM probe: TTFT, ITL, TPOT, e2e")
    add_arguments(p)
    p.set_defaults(func=cmd_probe)

    from tritonwatch.rules_cmd import add_commands  # check-rules, rules-schema, import-slo

    add_commands(sub)
    return parser


#: Libraries that log every HTTP request or scheduler run at info or debug.
_PER_REQUEST_LOGGERS = ("httpx", "httpcore", "apscheduler.executors", "apscheduler.scheduler")


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    level = logging.WARNING - 10 * min(args.verbose, 2)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.verbose < 3:
        # A line per scrape request and per job run: at 1,000 targets, hundreds a second.
        for chatty in _PER_REQUEST_LOGGERS:
            logging.getLogger(chatty).setLevel(logging.WARNING)
    func: Any = args.func
    return int(func(args))


if __name__ == "__main__":
    raise SystemExit(main())
