"""The ``tritonwatch`` command line (argparse; one sub-command per job)."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from collections.abc import Sequence
from typing import Any

from schemas.config import ConfigError, load_config

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
    from tritonwatch.serve import serve

    try:
        config = load_config(args.config)
    except ConfigError as exc:
        for line in exc.errors:
            _err(f"{exc.source}: {line}")
        return 2
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tritonwatch", description="Observability and SLOs for Triton Inference Server fleets"
    )
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("serve", help="run the collector, store jobs and API until SIGTERM")
    p.add_argument("--config", help="YAML config file (default: embedded defaults)")
    p.add_argument("--listen", help="HOST:PORT for the API (default: api.listen)")
    p.set_defaults(func=cmd_serve)

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

    from tritonwatch.probe_cmd import add_arguments

    p = sub.add_parser("probe", help="one-off synthetic LLM probe: TTFT, ITL, TPOT, e2e")
    add_arguments(p)
    p.set_defaults(func=cmd_probe)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    level = logging.WARNING - 10 * min(args.verbose, 2)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    func: Any = args.func
    return int(func(args))


if __name__ == "__main__":
    raise SystemExit(main())
