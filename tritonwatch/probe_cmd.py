"""``tritonwatch probe``: a one-off probe run with a GenAI-Perf-style table (or ``--json``).

The progress bar goes to stderr, so ``--json`` output on stdout stays machine-readable.
Ctrl-C stops the run and still prints the table (or JSON) of the requests completed so far,
then exits 130.  Bad options give one line naming the option (``--url``, ``--requests``...).

The command line's parser imports this module for :func:`add_arguments` whatever the command,
so what only a probe run needs (rich, the probe runner and, through it, httpx's command-line
client) is imported by :func:`run`: ``tritonwatch serve`` does not carry it (4.5 MiB of RSS).
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from tritonwatch.schemas.probes import InferInput, ProbeConfig, ProbeResult
from tritonwatch.schemas.values import redact_url_text

if TYPE_CHECKING:
    from rich.console import Console

EXIT_OK, EXIT_FAILURE, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130  # as tritonwatch.cli

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
    try:
        name, dtype, shape = text.split(":")
        dims = tuple(int(d) for d in shape.split("x"))
        return InferInput(name=name, datatype=dtype, shape=dims)
    except (ValueError, ValidationError):
        raise ValueError(
            f"--infer-input {text!r}: expected NAME:DTYPE:SHAPE, e.g. INPUT0:FP32:1x4"
        ) from None


def url_problem(protocol: str, url: str) -> str | None:
    """A clear line for the usual ``--url`` mistakes, or None (validation says the rest)."""
    shown = redact_url_text(url)
    if protocol == "grpc" and "://" in url.removeprefix("grpc://"):
        return (f"--url {shown!r}: the grpc protocol takes HOST:PORT without a scheme "
                "(e.g. localhost:8001); for an http(s) URL use --protocol http or openai")
    if protocol != "grpc" and not url.startswith(("http://", "https://")):
        return (f"--url {shown!r}: the {protocol} protocol takes an http(s) URL "
                "(e.g. http://localhost:8000); for HOST:PORT use --protocol grpc")
    return None


def option_errors(exc: ValidationError) -> list[str]:
    """One line per error, named by its command-line option, with no input quoted whole."""
    from tritonwatch.schemas.config import error_lines

    lines = []
    for line in error_lines(exc):
        key, _, message = line.partition(": ")
        option = "--" + key.split(".")[0].split("[")[0].replace("_", "-")
        lines.append(message if key == "(top level)" else f"{option}: {message}")
    return lines


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
    from rich.table import Table

    from tritonwatch.collector.probes.stats import STAT_KEYS

    table = Table(title=f"{config.protocol} probe of {config.model} "
                        f"({redact_url_text(config.url or '')})")
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


def _usage(text: str) -> int:
    sys.stderr.write(f"probe: {text}\n")
    return EXIT_USAGE


def run(args: argparse.Namespace) -> int:
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    from tritonwatch.collector.probes.runner import ProbeRunner
    from tritonwatch.collector.probes.stats import summarize
    from tritonwatch.render import make_console

    err_console = make_console(stderr=True)
    problem = url_problem(args.protocol, args.url)
    if problem is not None:
        return _usage(problem)
    try:
        config = build_config(args)
    except ValidationError as exc:
        for line in option_errors(exc):
            _usage(line)
        return EXIT_USAGE
    except ValueError as exc:
        return _usage(str(exc))
    runner = ProbeRunner(config, config.url or "")
    progress = Progress(
        TextColumn("probing"), BarColumn(), MofNCompleteColumn(),
        TextColumn("errors {task.fields[errors]}"), TimeElapsedColumn(),
        console=err_console, transient=True,
    )
    errors = 0
    # Filled as results arrive (from the probe's worker threads), so Ctrl-C loses none.
    results: list[ProbeResult] = []
    lock = threading.Lock()

    def on_result(result: ProbeResult) -> None:
        nonlocal errors
        with lock:
            results.append(result)
            errors += 0 if result.ok else 1
        progress.update(task, advance=1, errors=errors)

    interrupted = False
    t0 = time.monotonic()
    try:
        with progress:
            task = progress.add_task("probe", total=config.requests, errors=0)
            runner.run(on_result=on_result)
    except KeyboardInterrupt:
        interrupted = True
    finally:
        duration = time.monotonic() - t0
        if not interrupted:
            runner.close()
        # Interrupted: worker threads may still hold sessions; the process is about to end
        # and takes the connections with it, so nothing waits on them.
    with lock:
        done = list(results)
    summary = summarize(done, duration)
    if args.json:
        if interrupted:
            summary["interrupted"] = True
        sys.stdout.write(json.dumps(summary, indent=2, allow_nan=False) + "\n")
    else:
        render(summary, config, make_console())
    if interrupted:
        sys.stderr.write(f"probe: interrupted after {len(done)} of {config.requests} "
                         "request(s); the figures above cover those\n")
        return EXIT_INTERRUPTED
    return EXIT_OK if summary["ok"] else EXIT_FAILURE
