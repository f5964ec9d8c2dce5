"""Remote-write throughput: tritonwatch next to Prometheus 2.42, same targets, same receiver.

    .venv/bin/python -m bench.remote_write [--targets 20] [--interval 1] [--duration 30]
        [--warmup 15] [--models 20] [--gpus 8]

One simulated fleet (``bench.common.simulated_fleet``: ~2,900 series a target, counters
advancing every scrape; a process of its own whose CPU is in no figure) and one real
VictoriaMetrics (Debian's ``victoria-metrics``).  In the same run, at the same time:

1. ``tritonwatch serve`` (a subprocess, as deployed) scrapes every target, stores into SQLite
   and remote-writes everything to VictoriaMetrics (``replica="tritonwatch"``);
2. Prometheus 2.42 in agent mode (``--enable-feature=agent``: scrape and remote-write only,
   no local TSDB queries) scrapes the same targets and remote-writes to the same receiver
   (``replica="prometheus"``).

Measured over ``--duration`` seconds after ``--warmup``: samples the receiver accepted from
each (tritonwatch's ``tritonwatch_remote_write_samples_sent_total``, Prometheus's
``prometheus_remote_storage_samples_total``), and CPU seconds of each process (all threads,
/proc).  tritonwatch's CPU also pays for its SQLite store and derived SLIs; so a third row
isolates remote-write itself: the same scrapes, already parsed, through ``RemoteWriter``
(encode, snappy, disk buffer, HTTP) in this process, CPU from ``time.process_time``.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml
from prometheus_client import CollectorRegistry

from bench.common import (
    Fleet,
    fleet_models,
    http_get,
    process_tree_cpu,
    simulated_fleet,
    wait_until,
)
from tests.fixtures_pg import _free_port
from tests.scale.receivers import VictoriaMetrics, find_binary
from tritonwatch.collector.remote_write.writer import RemoteWriter
from tritonwatch.collector.shape import parse_columns
from tritonwatch.schemas.remote_write import RemoteWriteConfig


def _counter(port: int, prefix: str) -> float:
    total = 0.0
    for line in http_get(f"http://127.0.0.1:{port}/metrics").splitlines():
        if line.startswith(prefix):
            total += float(line.rsplit(" ", 1)[1])
    return total


def _start_tritonwatch(fleet: Fleet, targets: int, interval: float, write_url: str,
                       tmp: Path) -> tuple[subprocess.Popen[bytes], int]:
    models = fleet_models(fleet)
    port = _free_port()
    config = {
        "targets": [{"name": f"triton-{i}", "metrics_url": fleet.url(i),
                     "max_batch_size": dict.fromkeys(models, 8)} for i in range(targets)],
        "scrape": {"interval": f"{interval:g}s", "timeout": f"{interval:g}s"},
        "store": {"url": f"sqlite:///{tmp}/tw/tw.db"},
        "api": {"listen": f"127.0.0.1:{port}"},
        "reports": {"enabled": False},
        "nvml": {"enabled": False},
        "remote_write": [{"name": "vm", "url": write_url, "labels": {"replica": "tritonwatch"}}],
    }
    path = tmp / "tritonwatch.yaml"
    path.write_text(yaml.safe_dump(config))
    proc = subprocess.Popen([sys.executable, "-m", "tritonwatch.cli", "serve", "--config",
                             str(path)], cwd=tmp, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    return proc, port


def _start_prometheus(fleet: Fleet, targets: int, interval: float, write_url: str,
                      tmp: Path) -> tuple[subprocess.Popen[bytes], int]:
    config = {
        "global": {"scrape_interval": f"{interval:g}s", "scrape_timeout": f"{interval:g}s",
                   "external_labels": {"replica": "prometheus"}},
        "scrape_configs": [{
            "job_name": "triton",
            "static_configs": [{"targets": [fleet.address],
                                "labels": {"__metrics_path__": fleet.path(i),
                                           "target": f"triton-{i}"}}
                               for i in range(targets)],
        }],
        "remote_write": [{"url": write_url}],
    }
    path = tmp / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    port = _free_port()
    proc = subprocess.Popen(
        [find_binary("prometheus", "apt-get install prometheus"), f"--config.file={path}",
         f"--storage.agent.path={tmp}/agent", "--enable-feature=agent",
         f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return proc, port


def _isolated(fleet: Fleet, targets: int, write_url: str, tmp: Path, scrapes: int
              ) -> tuple[int, float, float]:
    """The remote-write path alone: (samples, wall s, CPU s of this process)."""
    shapes = [parse_columns(http_get(fleet.url(i)), None) for i in range(targets)]
    cfg = RemoteWriteConfig(name="iso", url=write_url, labels={"replica": "isolated"})
    registry = CollectorRegistry()
    writer = RemoteWriter(cfg, tmp / "iso", registry=registry)
    writer.start()
    t0 = time.time() - scrapes
    c0, w0 = time.process_time(), time.perf_counter()
    for step in range(scrapes):
        for i, (shape, values) in enumerate(shapes):
            writer.append_columns(f"triton-{i}", t0 + step, shape.names, shape.labels,
                                  values + step)
    writer.seal_due(force=True)
    while writer.pending()[0]:
        time.sleep(0.01)
    c1, w1 = time.process_time(), time.perf_counter()
    sent = registry.get_sample_value("tritonwatch_remote_write_samples_sent_total",
                                     {"remote": "iso"}) or 0.0
    writer.close()
    return int(sent), w1 - w0, c1 - c0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--targets", type=int, default=20)
    ap.add_argument("--interval", type=float, default=1.0)
    ap.add_argument("--duration", type=float, default=30.0)
    ap.add_argument("--warmup", type=float, default=15.0)
    ap.add_argument("--models", type=int, default=20)
    ap.add_argument("--gpus", type=int, default=8)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="tw-bench-rw-") as tmp_text, \
            simulated_fleet(args.targets, models=args.models, gpus=args.gpus) as fleet:
        tmp = Path(tmp_text)
        vm = VictoriaMetrics(tmp / "vm")
        vm.start()
        procs: list[subprocess.Popen[bytes]] = []
        try:
            tw, tw_port = _start_tritonwatch(fleet, args.targets, args.interval, vm.write_url,
                                             tmp)
            procs.append(tw)
            prom, prom_port = _start_prometheus(fleet, args.targets, args.interval,
                                                vm.write_url, tmp)
            procs.append(prom)
            wait_until(lambda: http_get(f"http://127.0.0.1:{tw_port}/metrics") != "", 60,
                       "tritonwatch serve")
            wait_until(lambda: "Ready" in http_get(f"http://127.0.0.1:{prom_port}/-/ready"),
                       60, "Prometheus")
            time.sleep(args.warmup)
            tw_name = "tritonwatch_remote_write_samples_sent_total"
            prom_name = "prometheus_remote_storage_samples_total"
            s0 = (_counter(tw_port, tw_name), _counter(prom_port, prom_name))
            c0 = (process_tree_cpu(tw.pid), process_tree_cpu(prom.pid))
            w0 = time.perf_counter()
            time.sleep(args.duration)
            c1 = (process_tree_cpu(tw.pid), process_tree_cpu(prom.pid))
            w1 = time.perf_counter()
            s1 = (_counter(tw_port, tw_name), _counter(prom_port, prom_name))
            lag = _counter(tw_port, "tritonwatch_remote_write_lag_seconds")
        finally:
            for proc in procs:
                proc.send_signal(signal.SIGTERM)
            for proc in procs:
                try:
                    proc.wait(60)
                except subprocess.TimeoutExpired:
                    proc.kill()
        iso = _isolated(fleet, args.targets, vm.write_url, tmp, scrapes=10)
        vm.close()
    window = w1 - w0
    print(f"remote-write to VictoriaMetrics, {args.targets} targets x {fleet.series} series "
          f"every {args.interval:g} s, {window:.0f} s window, {os.cpu_count()} CPUs")
    print(f"{'who':<44} {'samples/s':>11} {'CPU s':>7} {'samples/CPU-s':>14}")
    rows = [
        ("tritonwatch serve (scrape+SQLite+derive+RW)", s1[0] - s0[0], c1[0] - c0[0], window),
        ("prometheus 2.42 agent (scrape+RW)", s1[1] - s0[1], c1[1] - c0[1], window),
        ("tritonwatch RemoteWriter alone (in-process)", iso[0], iso[2], iso[1]),
    ]
    for who, samples, cpu, wall in rows:
        per_cpu = samples / cpu if cpu > 0 else 0.0
        print(f"{who:<44} {samples / wall:>11,.0f} {cpu:>7.2f} {per_cpu:>14,.0f}")
    print(f"tritonwatch remote-write lag at the end: {lag:.1f} s")


if __name__ == "__main__":
    main()
