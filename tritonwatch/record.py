"""``tritonwatch record URL --out DIR --every S --for D [--stats-url URL]``: save raw scrapes.

Writes the recording format ``tritonwatch replay`` reads (see tritonwatch/replay.py):

- ``<unix-seconds>.prom``: the /metrics body exactly as received, one per scrape;
- ``<unix-seconds>.stats.json``: with ``--stats-url``, the statistics API's JSON read right
  after that scrape (stamped with the same time, so replay derives both together);
- ``config/<model>.json``: with ``--stats-url``, every ready model's config, read once.

Scrapes are taken at ``start + k * every`` for every ``k * every < for`` (no drift), so
``--every 1 --for 3`` makes three.  File names are whole seconds when ``--every`` is a whole
number of seconds, milliseconds otherwise (``--every 1.5`` or ``500ms``: flooring those to the
second would make the gaps replay sees uneven).  A failed scrape is reported and skipped;
the recording goes on.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from tritonwatch.collector.scrape import ScrapeError, fetch_metrics, make_client, redact_url
from tritonwatch.render import make_console

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 256 << 20


class RecordError(ValueError):
    """Bad arguments for ``record``."""


def api_base(stats_url: str) -> str:
    """Triton's HTTP API root from ``--stats-url`` (the root itself, or its stats URL)."""
    base = stats_url.rstrip("/")
    if "/v2" in base:
        base = base[: base.index("/v2")]
    return base


def stamp(ts: float, every: float) -> str:
    """The file-name time of a scrape taken at ``ts``: whole seconds when ``every`` is a whole
    number of seconds, else milliseconds (replay reads both)."""
    return str(math.floor(ts)) if every >= 1 and float(every).is_integer() else f"{ts:.3f}"


def scrape_count(every: float, duration: float) -> int:
    if not (math.isfinite(every) and every > 0):
        raise RecordError(f"--every must be a positive number of seconds, got {every!r}")
    if not (math.isfinite(duration) and duration > 0):
        raise RecordError(f"--for must be a positive number of seconds, got {duration!r}")
    return max(1, math.ceil(duration / every - 1e-9))


async def _get_json(client: httpx.AsyncClient, method: str, url: str, timeout: float) -> Any:
    response = await client.request(method, url, timeout=timeout)
    if response.status_code != 200:
        raise ScrapeError("record", f"HTTP {response.status_code} from {redact_url(url)}")
    return response.json()


async def save_configs(client: httpx.AsyncClient, base: str, out: Path, timeout: float) -> int:
    """``config/<model>.json`` for every ready model; returns how many were written."""
    index = await _get_json(client, "POST", f"{base}/v2/repository/index", timeout)
    names = sorted({
        str(m["name"]) for m in index
        if isinstance(m, dict) and "name" in m and str(m.get("state", "READY")).upper() == "READY"
    })
    folder = out / "config"
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        config = await _get_json(client, "GET", f"{base}/v2/models/{quote(name, safe='')}/config",
                                 timeout)
        (folder / f"{name}.json").write_text(json.dumps(config, indent=1), encoding="utf-8")
    return len(names)


async def record(
    url: str,
    out: Path,
    *,
    every: float,
    duration: float,
    stats_url: str | None = None,
    timeout: float = 10.0,
    console: Console | None = None,
    clock: Callable[[], float] = time.time,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    written: list[Path] | None = None,
) -> list[Path]:
    """Record; returns the ``.prom`` files written, oldest first.  ``clock`` and ``sleep`` are
    injectable so tests can run a recording in simulated time.  ``written``, when given, is
    that same list, filled as each file is saved: a caller that interrupts the recording
    (Ctrl-C) still knows what it kept."""
    count = scrape_count(every, duration)
    timeout = min(timeout, max(every, 1.0))
    out.mkdir(parents=True, exist_ok=True)
    base = api_base(stats_url) if stats_url else None
    written = [] if written is None else written
    console = console or make_console(stderr=True)  # a pipe or a log file: lines not wrapped
    progress = Progress(
        TextColumn("recording {task.fields[url]}"), BarColumn(), MofNCompleteColumn(),
        TextColumn("{task.fields[failed]} failed"), TimeElapsedColumn(),
        console=console, transient=False,
    )
    async with make_client() as client:
        if base is not None:
            try:
                models = await save_configs(client, base, out, timeout)
                log.info("record: saved %d model config(s)", models)
            except (ScrapeError, httpx.HTTPError, ValueError) as exc:
                console.print(f"[yellow]model configs not saved: {_reason(exc, base)}")
        failed = 0
        with progress:
            task = progress.add_task("record", total=count, url=redact_url(url), failed=0)
            start = clock()
            for k in range(count):
                due = start + k * every
                delay = due - clock()
                if delay > 0:
                    await sleep(delay)
                ts = clock()
                name = stamp(ts, every)
                if (out / f"{name}.prom").exists():  # a late scrape in the same second
                    name = f"{ts:.3f}"
                try:
                    body = await fetch_metrics(client, "record", url, timeout=timeout,
                                               max_bytes=MAX_BODY_BYTES)
                except ScrapeError as exc:
                    failed += 1
                    console.print(f"[red]scrape {k + 1}/{count} failed: {exc.reason}")
                    progress.update(task, advance=1, failed=failed)
                    continue
                path = out / f"{name}.prom"
                path.write_bytes(body.text.encode("utf-8"))
                written.append(path)
                if base is not None:
                    try:
                        stats = await _get_json(client, "GET", f"{base}/v2/models/stats",
                                                timeout)
                        (out / f"{name}.stats.json").write_text(json.dumps(stats),
                                                                encoding="utf-8")
                    except (ScrapeError, httpx.HTTPError, ValueError) as exc:
                        console.print(f"[yellow]statistics {k + 1}/{count} not saved: "
                                      f"{_reason(exc, base)}")
                progress.update(task, advance=1, failed=failed)
    return written


def _reason(exc: Exception, url: str) -> str:
    if isinstance(exc, ScrapeError):
        return exc.reason
    # httpx messages may carry the full URL; name the redacted one.
    return f"{type(exc).__name__} from {redact_url(url)}"
