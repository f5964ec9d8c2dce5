"""The ``tritonwatch`` command line (argparse; one sub-command per job).

Every failure a user can cause or meet ends in one line on stderr that names the input and
what to do, never a traceback (``-v`` adds it).  Exit codes, the same for every command:

- ``0`` (:data:`EXIT_OK`): done;
- ``1`` (:data:`EXIT_FAILURE`): it ran and failed (a store that cannot be opened or written,
  a port in use, every probe request failed, a scrape that could not be read);
- ``2`` (:data:`EXIT_USAGE`): bad arguments or an invalid configuration, rules or input file;
- ``3`` (:data:`tritonwatch.serve.EXIT_STORE_IN_USE`): ``serve``/``demo`` found another
  process holding the store's single-writer lock;
- ``130`` (:data:`EXIT_INTERRUPTED`): Ctrl-C (``probe`` prints what it measured so far,
  ``record`` keeps every scrape it saved).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import socket
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from tritonwatch.schemas.config import ConfigError, load_config
from tritonwatch.schemas.configfile import redact_text
from tritonwatch.schemas.values import host_port, parse_duration

log = logging.getLogger("tritonwatch")

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report it

T = TypeVar("T")


def _out(text: str) -> None:
    sys.stdout.write(text + "\n")


def _err(text: str) -> None:
    sys.stderr.write(text + "\n")


def _traceback(args: argparse.Namespace) -> None:
    """The traceback of the exception being handled, with ``-v`` only."""
    if getattr(args, "verbose", 0):
        traceback.print_exc()


def _max_batch_sizes(values: Sequence[str]) -> dict[str, int]:
    sizes = {}
    for value in values:
        model, sep, size = value.rpartition("=")
        if not sep or not model or not size.isdigit():
            raise argparse.ArgumentTypeError(f"--max-batch-size {value!r}: expected MODEL=N")
        sizes[model] = int(size)
    return sizes


def _config_errors(exc: ConfigError) -> int:
    """Print every line of ``exc`` (each names its key) the way check-config does."""
    _err(f"{exc.source}: {len(exc.errors)} error(s)")
    for line in exc.errors:
        _err(f"  {line}")
    return EXIT_USAGE


def cmd_check_config(args: argparse.Namespace) -> int:
    config = load_config(args.file)  # a ConfigError is reported by main()
    backend = config.store.url.split(":")[0]
    _out(f"{args.file}: OK ({len(config.targets)} target(s), store {backend})")
    return EXIT_OK


def listen_problem(listen: str) -> str | None:
    """Why the API cannot listen on ``listen`` (``HOST:PORT``), or None when it can.

    Binds and releases the address the way uvicorn will (SO_REUSEADDR), so a port in use is
    reported in our words, with the way out, before anything is started.
    """
    from tritonwatch.serve import split_listen

    try:
        host, port = split_listen(listen)
    except ValueError:
        return "expected HOST:PORT"
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                   flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError) as exc:
        return f"cannot resolve {host!r} ({getattr(exc, 'strerror', None) or exc})"
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(address)
        except OSError as exc:
            return (exc.strerror or str(exc)).lower()
    return None


def cmd_serve(args: argparse.Namespace) -> int:
    from tritonwatch.memory import skip_unused_imports, tune_gc, tune_malloc

    skip_unused_imports()  # before serve's modules import httpx
    from tritonwatch.serve import EXIT_STORE_IN_USE, serve
    from tritonwatch.store import StoreError, WriterLockHeld

    config = load_config(args.config)  # a ConfigError is reported by main()
    listen = args.listen or config.api.listen
    problem = listen_problem(listen)
    if problem is not None:
        where = "--listen" if args.listen else "api.listen"
        stop = "stop the process using it or " if "in use" in problem else ""
        _err(f"serve: cannot listen on {listen} ({where}): {problem}; {stop}choose another "
             "address with --listen HOST:PORT (or api.listen in the config)")
        return EXIT_FAILURE
    tune_malloc()
    tune_gc()
    store = redact_text(config.store.url)
    try:
        asyncio.run(serve(config, listen=listen))
    except WriterLockHeld as exc:
        # Before StoreError: another serve writes to this store; the message names it.
        _err(f"serve: {exc}")
        return EXIT_STORE_IN_USE
    except StoreError as exc:
        # Its message names the store by its redacted URL and says what failed.
        _traceback(args)
        _err(f"serve: {exc}; check store.url, that the database is running and that this "
             "user may write to it")
        return EXIT_FAILURE
    except PermissionError as exc:
        # The default SQLite store lives under the working directory.
        _traceback(args)
        _err(f"serve: cannot create {exc.filename or 'the store'!s}: permission denied (store "
             f"{store}); run from a writable directory or set store.url to a writable path")
        return EXIT_FAILURE
    except OSError as exc:
        if exc.filename is None:
            raise
        _traceback(args)
        _err(f"serve: {exc.filename}: {(exc.strerror or str(exc)).lower()} (store {store}); "
             "check store.url")
        return EXIT_FAILURE
    except SystemExit as exc:
        # uvicorn logs why it could not start (e.g. the port was taken after our check) and
        # exits; say what to do about it.
        if exc.code in (0, None):
            raise
        _err(f"serve: the API could not start on {listen} (see the error above); choose "
             "another address with --listen HOST:PORT")
        return EXIT_FAILURE
    return EXIT_OK


def cmd_inspect(args: argparse.Namespace) -> int:
    from tritonwatch.inspect import inspect_sources
    from tritonwatch.render import render_inspect

    try:
        sizes = _max_batch_sizes(args.max_batch_size)
        result = asyncio.run(inspect_sources(
            args.source, args.source2, seconds=args.seconds, max_batch_size=sizes,
            http_url=args.http_url,
        ))
    except ConnectionError as exc:  # a scrape that failed: ScrapeError names the URL, redacted
        _err(f"inspect: {exc}")
        return EXIT_FAILURE
    except UnicodeDecodeError as exc:
        _err(f"inspect: a snapshot is not UTF-8 text (byte offset {exc.start}); give a saved "
             "/metrics body")
        return EXIT_USAGE
    except (argparse.ArgumentTypeError, ValueError, OSError) as exc:
        _err(f"inspect: {redact_text(str(exc))}")
        return EXIT_USAGE
    if args.json:
        _out(json.dumps(result, indent=2, allow_nan=False))
    else:
        render_inspect(result)
    return EXIT_OK


def cmd_demo(args: argparse.Namespace) -> int:
    from tritonwatch.demo import run_demo
    from tritonwatch.serve import EXIT_STORE_IN_USE
    from tritonwatch.store import WriterLockHeld

    try:
        return run_demo(listen=args.listen, duration=args.duration, data_dir=args.data_dir)
    except WriterLockHeld as exc:
        _err(f"tritonwatch demo: {exc}")
        return EXIT_STORE_IN_USE


def cmd_probe(args: argparse.Namespace) -> int:
    from tritonwatch.probe_cmd import run

    return run(args)


def cmd_dashboard(args: argparse.Namespace) -> int:
    from tritonwatch.dashboard_cmd import run

    return run(args)


def _usage_checked(check: Callable[[str], T]) -> Callable[[str], T]:
    """An argparse ``type`` from a schemas check: a bad value is a usage error whose message is
    the check's own (it names the value, credentials masked)."""
    def convert(value: str) -> T:
        try:
            return check(value)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return convert


#: ``--listen HOST:PORT``, checked as ``api.listen`` is.
_listen = _usage_checked(host_port)
_duration = _usage_checked(parse_duration)


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

    written: list[Path] = []
    try:
        asyncio.run(record(args.url, Path(args.out), every=args.every, duration=args.for_,
                           stats_url=args.stats_url, written=written))
    except RecordError as exc:
        _err(f"record: {exc}")
        return EXIT_USAGE
    except KeyboardInterrupt:
        # Every file is written whole before the next scrape starts: what is there is usable.
        _err(f"record: interrupted; {len(written)} scrape(s) saved under {args.out} "
             "(replay reads them as they are)")
        return EXIT_INTERRUPTED
    except OSError as exc:
        _err(f"record: cannot write {exc.filename or args.out}: "
             f"{(exc.strerror or str(exc)).lower()}; choose a writable --out directory")
        return EXIT_FAILURE
    _err(f"record: {len(written)} scrape(s) saved under {args.out}")
    return EXIT_OK if written else EXIT_FAILURE


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


def _bar(what: str) -> Any:
    """A progress bar on stderr when it is a terminal (nothing on a pipe or a log file)."""
    if not sys.stderr.isatty():
        return None
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    from tritonwatch.render import make_console

    return Progress(TextColumn(what), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    TimeRemainingColumn(), console=make_console(stderr=True), transient=True)


def _replay_one(job: tuple[str, str | None, str, float | None, float | None, float | None]
                ) -> Any:
    # One recording in a worker process (``--jobs``): rules are loaded there, not pickled.
    from tritonwatch.replay import replay

    path, rules_path, target, eval_interval, ttft_slo, itl_slo = job
    return replay(path, _load_rules(rules_path), target=target, eval_interval=eval_interval,
                  ttft_slo=ttft_slo, itl_slo=itl_slo)


def _merge(outcomes: list[Any]) -> Any:
    from tritonwatch.replay import Outcome

    alerts = sorted((a for o in outcomes for a in o.alerts),
                    key=lambda a: (a.fired_at, a.alertname, sorted(a.labels.items())))
    starts = [o.start for o in outcomes if o.start is not None]
    ends = [o.end for o in outcomes if o.end is not None]
    failures: dict[str, int] = {}
    for o in outcomes:
        for rule, n in o.rule_failures.items():
            failures[rule] = failures.get(rule, 0) + n
    return Outcome(alerts, min(starts, default=None), max(ends, default=None),
                   sum(o.evaluations for o in outcomes), sum(o.scrapes for o in outcomes),
                   failures)


def cmd_replay(args: argparse.Namespace) -> int:
    from tritonwatch.replay import ReplayError, recordings_in, replay

    if args.jobs < 1:
        _err(f"replay: --jobs must be at least 1, got {args.jobs}")
        return EXIT_USAGE
    try:
        rules = _load_rules(args.rules)
        recordings = recordings_in(args.dir)
    except ConfigError as exc:
        return _config_errors(exc)
    except (ReplayError, OSError) as exc:
        _err(f"replay: {exc}")
        return EXIT_USAGE
    # Several recordings are several targets: each is named after its directory.
    jobs = [(str(path), args.rules,
             name or (path.name if len(recordings) > 1 else args.target),
             args.eval_interval, args.ttft_slo, args.itl_slo) for path, name in recordings]
    what = " ".join(args.dir)
    bar = _bar(f"replay {what}" if len(jobs) == 1 else f"replay of {len(jobs)} recordings")
    outcomes: list[Any] = []
    failed = 0
    with bar if bar is not None else contextlib.nullcontext():
        if len(jobs) == 1 or args.jobs == 1:
            task = bar.add_task("", total=None) if bar is not None else None

            def tick(done: int, total: int) -> None:
                if bar is not None:
                    bar.update(task, completed=done, total=total)

            for job in jobs:
                try:
                    outcomes.append(replay(job[0], rules, target=job[2], eval_interval=job[3],
                                           ttft_slo=job[4], itl_slo=job[5],
                                           progress=tick if len(jobs) == 1 else None))
                except (ReplayError, OSError) as exc:
                    _err(f"replay: {exc}")
                    failed += 1
                if bar is not None and len(jobs) > 1:
                    bar.update(task, advance=1, total=len(jobs))
        else:
            import concurrent.futures
            import multiprocessing

            task = bar.add_task("", total=len(jobs)) if bar is not None else None
            # spawn, not fork: a forked child would inherit this process's threads' locks.
            with concurrent.futures.ProcessPoolExecutor(
                    max_workers=min(args.jobs, len(jobs)),
                    mp_context=multiprocessing.get_context("spawn")) as pool:
                futures = {pool.submit(_replay_one, job): job for job in jobs}
                for fut in concurrent.futures.as_completed(futures):
                    try:
                        outcomes.append(fut.result())
                    except (ReplayError, OSError, ConfigError) as exc:
                        _err(f"replay: {futures[fut][0]}: {exc}")
                        failed += 1
                    if bar is not None:
                        bar.update(task, advance=1)
    if failed == len(jobs):
        return EXIT_USAGE
    _print_alerts(outcomes[0] if len(outcomes) == 1 and len(jobs) == 1 else _merge(outcomes),
                  args.json, f"replay of {what}")
    return EXIT_FAILURE if failed else EXIT_OK


def cmd_backtest(args: argparse.Namespace) -> int:
    from tritonwatch.replay import ReplayError, backtest
    from tritonwatch.store import StoreError, open_store

    config = load_config(args.config)  # a ConfigError is reported by main()
    rules = _load_rules(args.rules)
    step = args.step or config.alerting.eval_interval
    try:
        with open_store(config.store.url) as store:
            bar = _bar("backtest")
            with bar if bar is not None else contextlib.nullcontext():
                task = bar.add_task("", total=None) if bar is not None else None

                def tick(done: int, total: int) -> None:
                    if bar is not None:
                        bar.update(task, completed=done, total=total)

                outcome = backtest(store, rules, start=args.from_, end=args.to, step=step,
                                   progress=tick)
    except StoreError as exc:
        _err(f"backtest: {exc}; check store.url and that the database is running")
        return EXIT_FAILURE
    except (ReplayError, ValueError) as exc:
        _err(f"backtest: {redact_text(str(exc))}")
        return EXIT_USAGE
    _print_alerts(outcome, args.json, "backtest")
    return EXIT_OK


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
    p.add_argument("--listen", type=_listen, help="HOST:PORT for the API (default: api.listen)")
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
    # Not serve's default data directory: the demo's store must never be the user's own.
    p.add_argument("--data-dir", default="tritonwatch-demo")
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
    p.add_argument("dir", nargs="+",
                   help="recording directory (see `record`); several, or one whose "
                   "subdirectories are recordings (one target each, named after it)")
    p.add_argument("--jobs", type=int, default=1,
                   help="replay this many recordings at once, one process each (default 1)")
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
    from tritonwatch.report_cmd import add_command as add_report_command  # report

    add_report_command(sub)
    return parser


#: Libraries that log every HTTP request or scheduler run at info or debug.
_PER_REQUEST_LOGGERS = ("httpx", "httpcore", "apscheduler.executors", "apscheduler.scheduler")


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)  # bad arguments: argparse's usage line, exit 2
    level = logging.WARNING - 10 * min(args.verbose, 2)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.verbose < 3:
        # A line per scrape request and per job run: at 1,000 targets, hundreds a second.
        for chatty in _PER_REQUEST_LOGGERS:
            logging.getLogger(chatty).setLevel(logging.WARNING)
    func: Any = args.func
    try:
        return int(func(args))
    except KeyboardInterrupt:
        _err(f"{args.command}: interrupted")
        return EXIT_INTERRUPTED
    except ConfigError as exc:  # from any command: every line, each naming its key
        return _config_errors(exc)
    except Exception as exc:
        # Not foreseen: still one line (with any URL's credentials masked), the traceback on -v.
        _traceback(args)
        _err(f"{args.command}: {type(exc).__name__}: {redact_text(str(exc))}"
             + ("" if args.verbose else " (run with -v for the traceback)"))
        return EXIT_FAILURE


if __name__ == "__main__":
    raise SystemExit(main())
