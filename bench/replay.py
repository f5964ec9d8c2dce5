"""How fast ``tritonwatch replay`` and ``backtest`` run the built-in rules over history.

    .venv/bin/python -m bench.replay [--small-scrapes 2880] [--large-scrapes 120]
        [--only small|large] [--reference] [--jobs N] [--backtest-scrapes N] [--json]

Two recordings in the ``tritonwatch record`` format (``<unix-seconds>.prom`` every 30 s),
written from :func:`tests.payloads.triton_payload` (counters advancing scrape by scrape,
series shuffled within each family at every scrape, which is harder on the deriver than
Triton's stable order):

* *small*: 2 models on 1 GPU without TRT-LLM, 116 series per scrape (the issue's "120-series
  target"); a day is 2,880 scrapes;
* *large*: 20 models on 8 GPUs with TRT-LLM, 2,879 series per scrape.

Each is replayed once through :func:`tritonwatch.replay.replay` with the built-in rules,
evaluating at every scrape.  Printed per recording: scrapes, raw samples, wall and CPU
seconds (this process and its children), the same scaled to one target-day (2,880 scrapes
at 30 s), and replayed raw samples per second of wall time.  ``--reference``: each is first
replayed the old way too (time series in the scratch SQLite store), checked to give the same
alerts.  ``--backtest-scrapes N``: the
small recording stored in a SQLite store as ``serve`` keeps it (flushed, maintained), then
``backtest`` over it every 30 s, reading the database at every step (``held=False``, the
reference) and holding what it reads in memory (the default), checked to give the same
alerts.  ``--jobs N``: N copies of the small recording replayed by the CLI with ``--jobs 1``
and ``--jobs N``.

Goals (issue 20): a small target-day in at most 15 s; at least 100,000 samples/s on the
large one.  Measured here on 2 cores shared with other work (CPU seconds are the figures to
compare; wall time is what the other processes left):

====================================  ==========================  ==========================
per target-day (2,880 scrapes)        before (SQLite scratch)     after (``store.memory``)
====================================  ==========================  ==========================
small replay, CPU s                   207.8                       10.3 - 11.5
small replay, wall s                  633.3 (load 4-9)            14.0 (load 2.8),
                                                                  18.3 (load 4-5)
large replay (120 scrapes), CPU s     125.6                       48.5 - 58.1
large replay, samples/s (wall)        45,004 (load 4-9)           94,665 (load 4-5),
                                                                  100,493 (load 2.8)
large, 1,440 scrapes, CPU s           -                           64.0 (130,000 samples per
                                                                  CPU-second: flat, not
                                                                  growing with history)
small backtest, CPU s                 87.8 (reads the database)   14.8 (held), same alerts
====================================  ==========================  ==========================

Side by side in one run (``--reference --small-scrapes 720``, load 8-9), CPU s per
target-day: small 101.1 before, 11.9 after; large 172.9 before, 61.7 after; same alerts.

``--jobs 2`` over two small target-days: 41.0 s wall and 23.5 CPU s, against 33.0 and 19.8
with ``--jobs 1`` (load 4-5: the other work on the 2 cores left about one core to share, two
replays side by side each ran at half speed, and each worker pays about 2 CPU s to start);
on idle cores the recordings run side by side.

Before: the time series in the scratch SQLite store, every rule's window read back through
SQLAlchemy and decoded from the sample log at every evaluation (the cost grew with what was
stored).  After: the time series in memory, a read is a slice of its window.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tests.payloads import series_count, triton_payload
from tritonwatch.alerts.rules import load_rules
from tritonwatch.replay import _Replayer, backtest, load_recording, replay
from tritonwatch.store import open_store

SCRAPE_S = 30.0
DAY_SCRAPES = 2880
T0 = 1_750_003_200.0

SHAPES: dict[str, dict[str, Any]] = {
    "small": {"models": 2, "gpus": 1, "trtllm": False},
    "large": {"models": 20, "gpus": 8, "trtllm": True},
}


def write_recording(root: Path, scrapes: int, shape: dict[str, Any]) -> int:
    """``scrapes`` payloads under ``root``; returns the series per scrape."""
    root.mkdir(parents=True, exist_ok=True)
    n = 0
    for i in range(scrapes):
        text = triton_payload(seed=3, step=i, **shape)
        n = n or series_count(text)
        (root / f"{int(T0 + i * SCRAPE_S)}.prom").write_text(text, encoding="utf-8")
    return n


def _cpu() -> float:
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def measure(name: str, scrapes: int, tmp: Path, *, reference: bool = False
            ) -> list[dict[str, Any]]:
    """Replay recording ``name``; with ``reference``, first with the time series in the
    scratch SQLite store (``memory=False``, how replay ran before ``store.memory``), checked
    to give the same alerts."""
    rec = tmp / name
    series = write_recording(rec, scrapes, SHAPES[name])
    rules = load_rules(None)
    rows, outcomes = [], []
    for memory in (False, True) if reference else (True,):
        wall0, cpu0 = time.perf_counter(), _cpu()
        outcomes.append(replay(rec, rules, memory=memory))
        wall, cpu = time.perf_counter() - wall0, _cpu() - cpu0
        scale = DAY_SCRAPES / scrapes
        rows.append({
            "recording": name if memory else f"{name} (SQLite scratch)", "series": series,
            "scrapes": scrapes, "samples": series * scrapes,
            "alerts": len(outcomes[-1].alerts), "wall_s": round(wall, 2),
            "cpu_s": round(cpu, 2), "wall_s_per_target_day": round(wall * scale, 1),
            "cpu_s_per_target_day": round(cpu * scale, 1),
            "samples_per_s": round(series * scrapes / wall),
        })
    if outcomes[0] != outcomes[-1]:
        raise AssertionError(f"replay of {name}: memory and SQLite gave different alerts")
    return rows


def measure_jobs(jobs: int, scrapes: int, tmp: Path) -> list[dict[str, Any]]:
    """``tritonwatch replay <fleet> --jobs 1`` and ``--jobs N`` over N small recordings (one
    target each), in a child process: wall and CPU seconds (with its workers)."""
    fleet = tmp / "fleet"
    first = fleet / "t0"
    write_recording(first, scrapes, SHAPES["small"])
    for i in range(1, jobs):
        shutil.copytree(first, fleet / f"t{i}")
    code = "import sys; from tritonwatch import cli; sys.exit(cli.main(sys.argv[1:]))"
    rows = []
    for n in sorted({1, jobs}):
        wall0, cpu0 = time.perf_counter(), _cpu()
        subprocess.run([sys.executable, "-c", code, "replay", str(fleet), "--json", "--jobs",
                        str(n)], check=True, stdout=subprocess.DEVNULL)
        wall, cpu = time.perf_counter() - wall0, _cpu() - cpu0
        rows.append({"recording": f"{jobs} x small, --jobs {n}", "series": 116 * jobs,
                     "scrapes": scrapes * jobs, "samples": 116 * scrapes * jobs,
                     "wall_s": round(wall, 2), "cpu_s": round(cpu, 2),
                     "wall_s_per_target_day": round(wall * DAY_SCRAPES / scrapes / jobs, 1),
                     "cpu_s_per_target_day": round(cpu * DAY_SCRAPES / scrapes / jobs, 1),
                     "samples_per_s": round(116 * scrapes * jobs / wall)})
    return rows


def measure_backtest(scrapes: int, tmp: Path) -> list[dict[str, Any]]:
    """``backtest`` over a SQLite store holding the small recording as ``serve`` would have
    stored it (flushed every 5 scrapes, maintained every 10: log moved into chunks, rollups,
    compaction), evaluating every 30 s from its first scrape to its last: reading every
    window from the database at every step (``held=False``, the reference), then holding
    what it reads in memory (``Store.held``, the default)."""
    rec = tmp / "backtest"
    write_recording(rec, scrapes, SHAPES["small"])
    recording = load_recording(rec)
    rows = []
    with open_store(f"sqlite:///{tmp}/backtest.db") as store:
        store.migrations.apply()
        ingest = _Replayer(recording, store, target="t0", ttft_slo=None, itl_slo=None)
        for i, scrape in enumerate(recording.scrapes, 1):
            ingest.ingest_until(scrape.ts)
            if i % 5 == 0:
                store.flush()
            if i % 10 == 0:
                store.maintenance.rollup(scrape.ts)
        store.flush()
        store.maintenance.rollup(recording.scrapes[-1].ts)
        rules = load_rules(None)
        outcomes = []
        for held in (False, True):
            wall0, cpu0 = time.perf_counter(), _cpu()
            outcomes.append(backtest(store, rules, start=T0,
                                     end=T0 + (scrapes - 1) * SCRAPE_S, step=SCRAPE_S,
                                     held=held))
            wall, cpu = time.perf_counter() - wall0, _cpu() - cpu0
            scale = DAY_SCRAPES / scrapes
            rows.append({
                "recording": f"small, backtest{' (held)' if held else ' (database)'}",
                "series": 116, "scrapes": scrapes, "samples": 116 * scrapes,
                "alerts": len(outcomes[-1].alerts), "wall_s": round(wall, 2),
                "cpu_s": round(cpu, 2), "wall_s_per_target_day": round(wall * scale, 1),
                "cpu_s_per_target_day": round(cpu * scale, 1),
                "samples_per_s": round(116 * scrapes / wall)})
    if outcomes[0] != outcomes[1]:
        raise AssertionError("backtest: held and database reads gave different alerts")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--small-scrapes", type=int, default=DAY_SCRAPES)
    ap.add_argument("--large-scrapes", type=int, default=120)
    ap.add_argument("--only", choices=sorted(SHAPES), help="one recording only")
    ap.add_argument("--reference", action="store_true",
                    help="also replay each recording the old way (SQLite scratch store)")
    ap.add_argument("--jobs", type=int, default=0,
                    help="also replay this many small recordings with --jobs 1 and --jobs N")
    ap.add_argument("--backtest-scrapes", type=int, default=0,
                    help="also backtest over a store holding this many small scrapes")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-replay-", dir=os.environ.get("TMPDIR")) as t:
        for name, scrapes in (("small", args.small_scrapes), ("large", args.large_scrapes)):
            if args.only in (None, name):
                rows += measure(name, scrapes, Path(t), reference=args.reference)
        if args.backtest_scrapes:
            rows += measure_backtest(args.backtest_scrapes, Path(t))
        if args.jobs:
            rows += measure_jobs(args.jobs, args.small_scrapes, Path(t))
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    cols = ["recording", "series", "scrapes", "samples", "alerts", "wall_s", "cpu_s",
            "wall_s_per_target_day", "cpu_s_per_target_day", "samples_per_s"]
    print(" | ".join(cols))
    for r in rows:
        print(" | ".join(str(r.get(c, "")) for c in cols))


if __name__ == "__main__":
    main()
