"""Precision, recall and detection delay of the built-in alert rules on labelled synthetic data.

    .venv/bin/python -m bench.detection [--seed 1] [--eval-interval 60] [--json]

Every scenario is one Triton target ("<kind>-<size>-<n>") in one temporary SQLite store, with
the SLI series the collector derives, written directly as store samples every 30 s for 6.5 h:
steady traffic with a daily shape (±30 %, random phase) and noise (request rate 5 %, fill rate
5 %, KV-cache 3 %, GPU 5 %, log-normal TTFT 10 % with 0.5 % of 3x spikes, ...), and from a
known onset in the last 2 h one fault:

============== ============================================== =================================
kind           fault, sizes                                   expected rule(s)
============== ============================================== =================================
fill_drop      batch fill rate x (1 - s), s = 0.2 0.3 0.5     batch_fill_rate_regression
kv_filling     KV-cache climbs to 100 % in 15 / 30 / 60 min   kv_cache_saturation, _forecast,
                                                              kv_cache_regression
gpu_util_drop  GPU utilization x (1 - s), same load           gpu_utilization_regression
ttft_increase  probe TTFT x (1 + s), s = 0.2 0.5 1.0          ttft_regression
itl_increase   probe ITL x (1 + s)                            itl_regression
failure_spike  failure ratio 0.2 % -> 5 / 10 / 30 %           failure_ratio_spike
gpu_idle       GPUs idle while queued (join series 0 -> 1)    gpu_idle_while_queued
target_down    no scrape but up=0 for 5 / 15 / 60 min         target_down
steady         none                                           (nothing may fire)
traffic_drop   request rate x (1 - s), s = 0.4 0.6, and all   (nothing may fire)
               load-driven SLIs with it
============== ============================================== =================================

The rules are replayed over the last 2 h in simulated time (step = the eval interval) with a
small for / keep_firing_for state machine.  Per kind: recall = scenarios where an expected rule
fired for the scenario's target at or after onset; delay = that first firing minus the onset;
precision = of all firings of the kind's rules (every target), those on a scenario of the kind
after its onset.  False alarms: firings of any rule on steady and traffic-drop targets.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tritonwatch.alerts.defaults import default_rules
from tritonwatch.alerts.model import Rule
from tritonwatch.schemas.samples import Sample, make_labels
from tritonwatch.store import Store, open_store

SCRAPE_S = 30.0
HISTORY_S = 4.5 * 3600  # before the evaluated span: fills the 4 h + 15 min windows
SPAN_S = 2 * 3600.0  # evaluated span
T0 = 1_750_003_200.0  # an hour boundary

EXPECTED: dict[str, tuple[str, ...]] = {
    "fill_drop": ("batch_fill_rate_regression",),
    "kv_filling": ("kv_cache_saturation", "kv_cache_exhaustion_forecast", "kv_cache_regression"),
    "gpu_util_drop": ("gpu_utilization_regression",),
    "ttft_increase": ("ttft_regression",),
    "itl_increase": ("itl_regression",),
    "failure_spike": ("failure_ratio_spike",),
    "gpu_idle": ("gpu_idle_while_queued",),
    "target_down": ("target_down",),
}
SIZES: dict[str, tuple[float, ...]] = {
    "fill_drop": (0.2, 0.3, 0.5),
    "kv_filling": (15.0, 30.0, 60.0),  # minutes to full
    "gpu_util_drop": (0.2, 0.3, 0.5),
    "ttft_increase": (0.2, 0.5, 1.0),
    "itl_increase": (0.2, 0.5, 1.0),
    "failure_spike": (0.05, 0.1, 0.3),
    "gpu_idle": (1.0,),
    "target_down": (5.0, 15.0, 60.0),  # minutes down
    "steady": (0.0,),
    "traffic_drop": (0.4, 0.6),
}
CONTROLS = ("steady", "traffic_drop")


@dataclass(frozen=True)
class Scenario:
    kind: str
    size: float
    rep: int
    onset: float  # unix s; inf for steady

    @property
    def target(self) -> str:
        return f"{self.kind}-{self.size:g}-{self.rep}"


def scenarios(reps: int, rng: np.random.Generator) -> list[Scenario]:
    out = []
    start = T0 + HISTORY_S
    for kind, sizes in SIZES.items():
        n = reps * (3 if kind == "steady" else 1)
        for size in sizes:
            for rep in range(n):
                onset = math.inf if kind == "steady" else start + float(rng.uniform(10, 40)) * 60
                out.append(Scenario(kind, size, rep, onset))
    return out


def samples(sc: Scenario, rng: np.random.Generator) -> Iterator[tuple[float, list[Sample]]]:
    """(ts, samples) of one scrape of ``sc``'s target, every SCRAPE_S over history + span."""
    m = make_labels({"model": "llm", "version": "1"})
    g = make_labels({"gpu_uuid": f"GPU-{sc.target}"})
    p = make_labels({"probe": f"p-{sc.target}", "model": "llm", "protocol": "grpc"})
    phase = float(rng.uniform(0, 2 * math.pi))
    n = int((HISTORY_S + SPAN_S) / SCRAPE_S)
    kv_base = 0.5
    for i in range(n):
        ts = T0 + i * SCRAPE_S
        on = ts >= sc.onset
        since = ts - sc.onset
        shape = 1 + 0.3 * math.sin(2 * math.pi * ts / 86400 + phase)
        load = shape
        if sc.kind == "traffic_drop" and on:
            load *= 1 - sc.size
        if sc.kind == "target_down" and on and since < sc.size * 60:
            yield ts, [Sample("up", (), 0.0)]
            continue

        def noise(cv: float) -> float:
            return float(rng.lognormal(0.0, cv))

        rate = 20 * load * noise(0.05)
        fail_ratio = sc.size if sc.kind == "failure_spike" and on else 0.002
        fill = min(1.0, 0.6 * load**0.7 * noise(0.05))
        if sc.kind == "fill_drop" and on:
            fill *= 1 - sc.size
        kv = min(1.0, kv_base * load * noise(0.03))
        if sc.kind == "kv_filling" and on:
            kv = min(1.0, kv + (1.0 - kv_base) * since / (sc.size * 60))
        gpu = min(1.0, 0.7 * load**0.8 * noise(0.05))
        if sc.kind == "gpu_util_drop" and on:
            gpu *= 1 - sc.size
        idle = 1.0 if sc.kind == "gpu_idle" and on else 0.0
        spike = 3.0 if rng.random() < 0.005 else 1.0
        ttft = 0.2 * noise(0.10) * spike
        itl = 0.02 * noise(0.10) * (3.0 if rng.random() < 0.005 else 1.0)
        if sc.kind == "ttft_increase" and on:
            ttft *= 1 + sc.size
        if sc.kind == "itl_increase" and on:
            itl *= 1 + sc.size
        yield ts, [
            Sample("up", (), 1.0),
            Sample("sli:request_rate", m, rate * (1 - fail_ratio)),
            Sample("sli:failure_rate", make_labels({**dict(m), "reason": "timeout"}),
                   rate * fail_ratio * noise(0.2)),
            Sample("sli:batch_fill_rate", m, fill),
            Sample("sli:kv_cache_utilization", m, kv),
            Sample("sli:queue_time_seconds", m, 0.01 * noise(0.2)),
            Sample("sli:pending_requests", m, float(rng.poisson(2))),
            Sample("sli:gpu_utilization", g, gpu),
            Sample("sli:gpu_idle_while_queued", g, idle),
            Sample("probe:ttft_seconds", p, ttft),
            Sample("probe:itl_seconds", p, itl),
        ]


@dataclass
class _State:
    since: float
    last_true: float
    firing: bool


def replay(store: Store, rules: list[Rule], start: float, end: float, step: float
           ) -> tuple[list[tuple[str, str, float]], dict[str, float]]:
    """Evaluate ``rules`` from ``start`` to ``end``; returns (rule, target, fired_at) for each
    transition to firing, and seconds spent per rule."""
    states: dict[tuple[str, tuple[tuple[str, str], ...]], _State] = {}
    fired: list[tuple[str, str, float]] = []
    cost: dict[str, float] = {r.name: 0.0 for r in rules}
    now = start
    while now <= end:
        for rule in rules:
            t = time.perf_counter()
            cands = rule.evaluate(store, now)
            cost[rule.name] += time.perf_counter() - t
            seen = set()
            for c in cands:
                key = (rule.name, c.labels)
                seen.add(key)
                st = states.get(key)
                if st is None:
                    st = states[key] = _State(now, now, False)
                st.last_true = now
                if not st.firing and now - st.since >= rule.for_s:
                    st.firing = True
                    fired.append((rule.name, dict(c.labels)["target"], now))
            for key, st in list(states.items()):
                if key[0] != rule.name or key in seen:
                    continue
                if not st.firing or now - st.last_true > rule.keep_firing_for_s:
                    del states[key]
        now += step
    return fired, cost


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--reps", type=int, default=2, help="scenarios per kind and size")
    ap.add_argument("--eval-interval", type=float, default=60.0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    scs = scenarios(args.reps, rng)
    by_target = {sc.target: sc for sc in scs}
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        store = open_store(f"sqlite:///{Path(tmp) / 'bench.db'}")
        store.create_schema()
        rows = 0
        for sc in scs:
            for ts, ss in samples(sc, rng):
                rows += store.write(sc.target, ts, ss)
            store.flush()
        t_written = time.perf_counter()
        rules = default_rules(None)
        start = T0 + HISTORY_S
        fired, cost = replay(store, rules, start, start + SPAN_S, args.eval_interval)
        store.close()
    t_done = time.perf_counter()

    report: dict[str, dict[str, object]] = {}
    for kind, expected in EXPECTED.items():
        kind_scs = [sc for sc in scs if sc.kind == kind]
        delays: list[float] = []
        for sc in kind_scs:
            hits = [ts for r, t, ts in fired if t == sc.target and r in expected
                    and ts >= sc.onset]
            if hits:
                delays.append(min(hits) - sc.onset)
        mine = [(r, t, ts) for r, t, ts in fired if r in expected]
        true = [x for x in mine
                if by_target[x[1]].kind == kind and x[2] >= by_target[x[1]].onset]
        report[kind] = {
            "scenarios": len(kind_scs),
            "detected": len(delays),
            "recall": len(delays) / len(kind_scs),
            "firings": len(mine),
            "precision": len(true) / len(mine) if mine else None,
            "median_delay_min": statistics.median(delays) / 60 if delays else None,
            "by_size": {
                f"{size:g}": sum(
                    1 for sc in kind_scs if sc.size == size and any(
                        t == sc.target and r in expected and ts >= sc.onset
                        for r, t, ts in fired))
                for size in SIZES[kind]
            },
        }
    control_hours = sum(SPAN_S for sc in scs if sc.kind in CONTROLS) / 3600
    false_alarms = [(r, t) for r, t, _ in fired if by_target[t].kind in CONTROLS]
    pre_onset = [(r, t) for r, t, ts in fired
                 if by_target[t].kind not in CONTROLS and ts < by_target[t].onset]
    summary = {
        "kinds": report,
        "control_targets": sum(1 for sc in scs if sc.kind in CONTROLS),
        "control_hours": control_hours,
        "false_alarms_on_controls": false_alarms,
        "firings_before_onset": pre_onset,
        "rows": rows,
        "seconds": {"write": round(t_written - t_start, 1), "replay": round(t_done - t_written, 1)},
        "rule_seconds": {k: round(v, 2) for k, v in cost.items()},
    }
    if args.json:
        print(json.dumps(summary, indent=2))
        return
    print(f"{len(scs)} scenarios, {rows} samples, eval every {args.eval_interval:g} s over "
          f"{SPAN_S / 3600:g} h; write {summary['seconds']['write']} s, "  # type: ignore[index]
          f"replay {summary['seconds']['replay']} s")  # type: ignore[index]
    print(f"{'kind':<15}{'recall':>10}{'precision':>11}{'median delay':>14}  detected by size")
    for kind, r in report.items():
        prec = "-" if r["precision"] is None else f"{r['precision']:.2f}"
        delay = "-" if r["median_delay_min"] is None else f"{r['median_delay_min']:.1f} min"
        sizes = " ".join(f"{s}:{n}/{args.reps}" for s, n in r["by_size"].items())  # type: ignore[attr-defined]
        print(f"{kind:<15}{r['detected']}/{r['scenarios']} {r['recall']:>5.2f}"
              f"{prec:>11}{delay:>14}  {sizes}")
    print(f"false alarms on {summary['control_targets']} control targets "
          f"({control_hours:g} target-hours, steady + traffic drop): {len(false_alarms)} "
          f"{false_alarms if false_alarms else ''}")
    print(f"firings before onset on fault targets: {len(pre_onset)} {pre_onset or ''}")
    print("rule cost (s): " + ", ".join(f"{k} {v:.1f}" for k, v in cost.items()))


if __name__ == "__main__":
    main()
