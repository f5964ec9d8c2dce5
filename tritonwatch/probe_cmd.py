"""``tritonwatch probe``: a one-off probe run with a GenAI-Perf-style table (or ``--json``).

The progress bar goes to stderr, so ``--json`` output on stdout stays machine-readable.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from tritonwatch.collector.probes.runner import ProbeRunner
from tritonwatch.collector.probes.stats import STAT_KEYS, summarize
from tritonwatch.schemas.probes import InferInput, ProbeConfig, ProbeResult

ROWS = (
    ("Time to first token (ms)", "ttft_ms"),
    ("Inter-token latency (ms)", "itl_ms"),
    ("  pooled gaps (ms)", "itl_pooled_ms"),
    ("Time per output token (ms)", "tpot_ms"),
    ("Request latency (ms)", "e2e_ms"),
    ("Output tokens", "output_tokens"),
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", required=True,
                   help="host:port (grpc) or http(s)://host:port (http, openai)")
    p.add_argument("--model", required=True)
    p.add_argument("--protocol", choices=["grpc", "http", "openai"], default="grpc")
    p.add_argument("--requests", type=int, default=100, help="measured requests (default 100)")
    p.add_argument("--concurrency", type=int, default=1)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--warmup", type=int, default=2, help="unmeasured requests per connection")
    p.add_argument("--timeout", type=float, default=30.0, help="seconds per request")
    p.add_argument("--prompt", action="append", default=[], help="prompt (repeatable)")
    p.add_argument("--openai-endpoint", choices=["chat", "completions"], default="chat")
    p.add_argument("--infer-input", action="append", default=[], metavar="NAME:DTYPE:SHAPE",
                   help="plain (non-streaming) infer with this input, e.g. INPUT0:FP32:1x4")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def _infer_input(text: str) -> InferInput:
    name, dtype, shape = text.split(":")
    return InferInput(name=name, datatype=dtype, shape=tuple(int(d) for d in shape.split("x")))


def build_config(args: argparse.Namespace) -> ProbeConfig:
    extra: dict[str, Any] = {}
    if args.prompt:
        extra["prompts"] = tuple(args.prompt)
    if args.infer_input:
        extra["mode"] = "infer"
        extra["infer_inputs"] = tuple(_infer_input(v) for v in args.infer_input)
    return ProbeConfig(
        name="cli", url=args.url, model=args.model, protocol=args.protocol,
        requests=args.requests, concurrency=args.concurrency, max_tokens=args.max_tokens,
        warmup=args.warmup, timeout=args.timeout, interval=max(args.timeout, 1.0),
        openai_endpoint=args.openai_endpoint, **extra,
    )


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:,.2f}"


def render(summary: dict[str, Any], config: ProbeConfig, console: Console) -> None:
    table = Table(title=f"{config.protocol} probe of {config.model} ({config.url})")
    table.add_column("Statistic")
    for key in STAT_KEYS:
        table.add_column(key, justify="right")
    for label, key in ROWS:
        table.add_row(label, *(_fmt(summary[key][k]) for k in STAT_KEYS))
    console.print(table)
    console.print(f"Output token throughput (per sec): "
                  f"{summary.get('output_token_throughput_per_s', 0.0):,.2f}")
    console.print(f"Request throughput (per sec): "
                  f"{summary.get('request_throughput_per_s', 0.0):,.2f}")
    console.print(f"Requests: {summary['requests']}  ok: {summary['ok']}  "
                  f"errors: {summary['errors']} {summary['errors_by_kind'] or ''}")
    if "last_error" in summary:
        err = summary["last_error"]
        console.print(f"Last error: {err['kind']} {err['code'] or ''} {err['message']}")


def run(args: argparse.Namespace) -> int:
    err_console = Console(stderr=True)
    try:
        config = build_config(args)
    except ValueError as exc:
        err_console.print(f"probe: {exc}")
        return 2
    runner = ProbeRunner(config, config.url or "")
    progress = Progress(
        TextColumn("probing"), BarColumn(), MofNCompleteColumn(),
        TextColumn("errors {task.fields[errors]}"), TimeElapsedColumn(),
        console=err_console, transient=True,
    )
    errors = 0

    def on_result(result: ProbeResult) -> None:
        nonlocal errors
        errors += 0 if result.ok else 1
        progress.update(task, advance=1, errors=errors)

    try:
        with progress:
            task = progress.add_task("probe", total=config.requests, errors=0)
            t0 = time.monotonic()
            results = runner.run(on_result=on_result)
            duration = time.monotonic() - t0
    finally:
        runner.close()
    summary = summarize(results, duration)
    if args.json:
        sys.stdout.write(json.dumps(summary, indent=2, allow_nan=False) + "\n")
    else:
        render(summary, config, Console())
    return 0 if summary["ok"] else 1
