"""How fast ``tritonwatch replay`` runs the built-in rules over recordings.

    .venv/bin/python -m bench.replay [--small-scrapes 2880] [--large-scrapes 120] [--json]

Two recordings in the ``tritonwatch record`` format (``<unix-seconds>.prom`` every 30 s),
written from :func:`tests.payloads.triton_payload` (counters advancing scrape by scrape):

* *small*: 2 models on 1 GPU without TRT-LLM, 116 series per scrape (the issue's "120-series
  target"); a day is 2,880 scrapes;
* *large*: 20 models on 8 GPUs with TRT-LLM, 2,879 series per scrape.

Each is replayed once through :func:`tritonwatch.replay.replay` with the built-in rules,
evaluating at every scrape.  Printed per recording: scrapes, raw samples, wall and CPU
seconds (this process and its children), the same scaled to one target-day (2,880 scrapes
at 30 s), and replayed raw samples per second of wall time.  The scaling is exact only at
2,880 scrapes: the cost of an evaluation grows with what is stored (more than twice as much
per scrape over a whole day as over its first 2 hours), so shorter runs flatter it.

Goals (issue 20): a small target-day in at most 15 s; at least 100,000 samples/s on the
large one.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import tempfile
import time
from pathlib import Path
from typing import Any

from tests.payloads import series_count, triton_payload
from tritonwatch.alerts.rules import load_rules
from tritonwatch.replay import replay

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


def measure(name: str, scrapes: int, tmp: Path) -> dict[str, Any]:
    rec = tmp / name
    series = write_recording(rec, scrapes, SHAPES[name])
    rules = load_rules(None)
    wall0, cpu0 = time.perf_counter(), _cpu()
    outcome = replay(rec, rules)
    wall, cpu = time.perf_counter() - wall0, _cpu() - cpu0
    scale = DAY_SCRAPES / scrapes
    return {
        "recording": name, "series": series, "scrapes": scrapes,
        "samples": series * scrapes, "alerts": len(outcome.alerts),
        "wall_s": round(wall, 2), "cpu_s": round(cpu, 2),
        "wall_s_per_target_day": round(wall * scale, 1),
        "cpu_s_per_target_day": round(cpu * scale, 1),
        "samples_per_s": round(series * scrapes / wall),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--small-scrapes", type=int, default=DAY_SCRAPES)
    ap.add_argument("--large-scrapes", type=int, default=120)
    ap.add_argument("--only", choices=sorted(SHAPES), help="one recording only")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-replay-", dir=os.environ.get("TMPDIR")) as t:
        for name, scrapes in (("small", args.small_scrapes), ("large", args.large_scrapes)):
            if args.only in (None, name):
                rows.append(measure(name, scrapes, Path(t)))
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    cols = ["recording", "series", "scrapes", "samples", "alerts", "wall_s", "cpu_s",
            "wall_s_per_target_day", "cpu_s_per_target_day", "samples_per_s"]
    print(" | ".join(cols))
    for r in rows:
        print(" | ".join(str(r[c]) for c in cols))


if __name__ == "__main__":
    main()
