"""``tritonwatch demo``: a real local Triton, traffic, and ``serve`` scraping it, shown live.

Everything is real except the models (Python-backend stand-ins from the test rig): the
``tritonserver`` binary from nvidia-pytriton, its /metrics, statistics and model-config APIs,
the embedded SQLite store.  A small script varies the load and the fake LLM's KV-cache use so
the table has something to show: batches fill and empty, the KV cache fills up.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import socket
import subprocess
import time
from pathlib import Path

import yaml
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from tritonwatch import dashboard_cmd
from tritonwatch.collector.jobs import Collector
from tritonwatch.loadgen import LoadGenerator
from tritonwatch.render import model_table
from tritonwatch.rig import TritonRig, ensure_triton_env
from tritonwatch.schemas.alerts import AlertState
from tritonwatch.schemas.config import validate_config
from tritonwatch.schemas.samples import TargetHealth, label_value
from tritonwatch.serve import serve
from tritonwatch.store.alerts import AlertStore

log = logging.getLogger(__name__)

#: Where the demo's dashboard listens (``tritonwatch dashboard``'s default port).
DASHBOARD_PORT = dashboard_cmd.DEFAULT_PORT

# (seconds, batcher concurrency, LLM streams, KV-cache fraction, fake LLM's TTFT in ms): one
# act of the demo each.  The last two acts trip the demo's alert rules below.
SCENARIO = (
    (30.0, 12, 2, 0.35, 40),
    (30.0, 3, 3, 0.60, 40),
    (30.0, 16, 4, 0.95, 40),
    (30.0, 8, 2, 0.40, 150),
)

# Threshold rules with demo-sized timings (the built-in rules judge minutes to hours of
# history, so they stay quiet in a short demo); the built-ins run as well.
DEMO_RULES = """\
version: 1
alerts:
  - name: KVCacheNearlyFull
    series: sli:kv_cache_utilization
    agg: avg
    window: 15s
    op: ">="
    threshold: 0.9
    for: 10s
    keep_firing_for: 10s
    labels: {severity: warning}
    annotations: {summary: "KV cache {value:.0%} full on {labels[model]}"}
  - name: SlowFirstToken
    series: probe:ttft_seconds
    agg: avg
    window: 15s
    op: ">"
    threshold: 0.1
    for: 10s
    keep_firing_for: 10s
    labels: {severity: page}
    annotations: {summary: "TTFT {value:.3f}s on {labels[model]} ({labels[probe]})"}
"""


def _mean_ms(values: list[float | None]) -> str:
    kept = [v for v in values if v is not None]
    return f"{1000 * sum(kept) / len(kept):.1f}" if kept else "-"


def _view(collector: Collector, health_rows: list[TargetHealth], alerts: list[AlertState],
          started: float, act: str, dashboard_url: str) -> Group:
    state = next(iter(collector.targets.values()))
    models: dict[str, dict[str, float | None]] = {}
    for sample in state.latest:
        model = label_value(sample.labels, "model")
        if model:
            models.setdefault(model, {})[sample.name.removeprefix("sli:")] = sample.value
    health = Table.grid(padding=(0, 2))
    for h in health_rows:
        mark = "[green]up[/]" if h.up else f"[red]down[/] {h.error}"
        health.add_row(f"{h.target} {h.source}", mark, f"{h.duration_s * 1000:.0f} ms",
                       f"{h.samples} samples")
    probes = Table(title="synthetic probes (last run)", title_justify="left")
    for column in ("probe", "requests", "errors", "TTFT ms", "ITL ms", "e2e ms", "tokens/s"):
        probes.add_column(column, justify="left" if column == "probe" else "right")
    for name, results in sorted(collector.latest_probes.items()):
        ok = [r for r in results if r.ok]
        rates = [r.tokens_per_s for r in ok if r.tokens_per_s is not None]
        probes.add_row(
            name, str(len(results)), str(len(results) - len(ok)),
            _mean_ms([r.ttft_s for r in ok]), _mean_ms([r.itl_s for r in ok]),
            _mean_ms([r.e2e_s for r in ok]),
            f"{sum(rates) / len(rates):.0f}" if rates else "-",
        )
    elapsed = time.monotonic() - started
    header = Text.from_markup(
        f"[bold]tritonwatch demo[/] — {elapsed:.0f} s — {act} — "
        f"API on http://{collector.config.api.listen}, dashboard on "
        f"{dashboard_url}  (Ctrl-C to stop)"
    )
    table = model_table(dict(sorted(models.items())), "per model, last scrape interval")
    alert_table = Table(title="alerts (pending and firing)", title_justify="left")
    for column in ("alert", "status", "since", "summary"):
        alert_table.add_column(column)
    now = time.time()
    for a in sorted(alerts, key=lambda a: a.active_since):
        if a.status == "resolved":
            continue
        labels = dict(a.labels)
        color = "red" if a.status == "firing" else "yellow"
        alert_table.add_row(
            labels.get("alertname", a.rule), f"[{color}]{a.status}[/]",
            f"{now - a.active_since:.0f} s", dict(a.annotations).get("summary", ""),
        )
    return Group(header, health, table, probes, alert_table)


async def _drive(rig: TritonRig, load: LoadGenerator, collector: Collector,
                 console: Console, dashboard_url: str) -> None:
    started = time.monotonic()
    acts = itertools.cycle(SCENARIO)
    act_ends, act_name = 0.0, ""
    with Live(console=console, refresh_per_second=2, transient=False) as live:
        while True:
            now = time.monotonic()
            if now >= act_ends:
                seconds, batch_c, llm_c, kv, ttft = next(acts)
                load.set(concurrency=batch_c, llm_concurrency=llm_c)
                rig.control(kv_used_fraction=kv, ttft_ms=ttft)
                act_ends = now + seconds
                act_name = (f"{batch_c} batcher clients, {llm_c} LLM streams, "
                            f"KV target {kv:.0%}, TTFT {ttft} ms")
            rows = await asyncio.to_thread(collector.store.health)
            alerts = await asyncio.to_thread(AlertStore(collector.store).states)
            live.update(_view(collector, rows, alerts, started, act_name, dashboard_url))
            await asyncio.sleep(1.0)


def _port_or_free(port: int) -> int:
    """``port`` if nothing listens on it, else a free one (a dashboard or a second demo may
    already have 8501: the demo then says where its own dashboard is)."""
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def run_demo(*, listen: str, duration: float | None, data_dir: str) -> int:
    console = Console()
    data = Path(data_dir).resolve()
    data.mkdir(parents=True, exist_ok=True)
    with console.status("Preparing tritonserver (first run installs nvidia-pytriton)..."):
        venv = ensure_triton_env()
    rig = TritonRig(workdir=data / "rig", venv=venv)
    with console.status("Starting tritonserver and loading models..."):
        rig.start()
    console.print(f"tritonserver ready in {rig.last_start_seconds or 0:.0f} s: "
                  f"HTTP {rig.http_url}, gRPC {rig.grpc_url}, metrics {rig.metrics_url}")
    rules = data / "demo-rules.yaml"
    rules.write_text(DEMO_RULES, encoding="utf-8")
    settings = {
        "targets": [{"name": "rig", "metrics_url": rig.metrics_url, "http_url": rig.http_url,
                     "grpc_url": rig.grpc_url}],
        # Synthetic users of the fake LLM, over both of Triton's streaming protocols.
        "probes": [
            {"name": "llm-grpc", "target": "rig", "model": "fake_llm", "protocol": "grpc",
             "interval": "5s", "timeout": "4s", "requests": 4, "concurrency": 2,
             "ttft_slo": "100ms", "itl_slo": "20ms"},
            {"name": "llm-http", "target": "rig", "model": "fake_llm", "protocol": "http",
             "interval": "5s", "timeout": "4s", "requests": 4, "concurrency": 2,
             "ttft_slo": "100ms", "itl_slo": "20ms"},
        ],
        "scrape": {"interval": "5s", "timeout": "4s", "api_interval": "10s"},
        "store": {"url": f"sqlite:///{data}/tritonwatch.db", "flush_interval": "5s"},
        "api": {"listen": listen},
        "alerting": {"rules_file": str(rules), "eval_interval": "5s"},
    }
    # The dashboard is a second process: it reads the same settings from a file.
    config_file = data / "demo-config.yaml"
    config_file.write_text(yaml.safe_dump(settings, sort_keys=False), encoding="utf-8")
    config = validate_config(settings, str(config_file))
    load = LoadGenerator(rig.grpc_url, concurrency=8, llm_concurrency=2,
                         max_duration=duration or 7 * 86400.0)
    stop = asyncio.Event()

    async def main() -> None:
        async def sidecar(collector: Collector) -> None:
            if duration:
                asyncio.get_running_loop().call_later(duration, stop.set)
            await _drive(rig, load, collector, console, dashboard_url)

        await serve(config, listen=listen, sidecar=sidecar, stop=stop)

    dashboard_port = _port_or_free(DASHBOARD_PORT)
    dashboard_url = dashboard_cmd.url(dashboard_port, "127.0.0.1")
    dashboard = dashboard_cmd.start(str(config_file), port=dashboard_port,
                                    address="127.0.0.1", quiet=True)
    console.print(f"API on http://{listen}, dashboard on {dashboard_url}")
    load.start()
    try:
        asyncio.run(main())
    finally:
        load.stop()
        rig.stop()
        dashboard.terminate()
        try:
            dashboard.wait(timeout=10)
        except subprocess.TimeoutExpired:
            dashboard.kill()
    stats = load.stats()
    console.print(
        f"Stopped. Sent {stats.batcher.sent} batcher requests ({stats.batcher.failed} failed) "
        f"and {stats.llm.sent} LLM streams ({stats.llm.failed} failed). "
        f"Data kept in {data}/tritonwatch.db"
    )
    return 0
