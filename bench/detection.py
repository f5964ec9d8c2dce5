"""Precision, recall and detection delay of the built-in alert rules on labelled synthetic data.

    .venv/bin/python -m bench.detection [--seed 1] [--eval-interval 60] [--json]

The scenarios (one Triton target each, "<kind>-<size>-<n>", with the SLI series the collector
derives written straight into one temporary SQLite store) come from tests/alerts/scenarios.py,
which documents every kind, its fault and its expected rule(s).

The rules are replayed over the last 2 h in simulated time (step = the eval interval) with a
small for / keep_firing_for state machine.  Per kind: recall = scenarios where an expected rule
fired for the scenario's target at or after onset; delay = that first firing minus the onset;
precision = of all firings of the kind's rules (every target), those on a scenario of the kind
after its onset.  False alarms: firings of any rule on the no-event targets (steady, traffic
drop, deploys / config changes / reloads that change nothing, longer requests or prompts that
the load drivers explain, ...).  The alerts of a deploy, config change or reload must say so
("since version 2 at", "since config change at", "since reload at").  ``--kinds`` runs some
kinds only (e.g. ``--kinds long_fill_drop --reps 4`` for the 6 h hold over more seeds).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tests.alerts.scenarios import (
    CONTROLS,
    HISTORY_S,
    LONG,
    LONG_SPAN_S,
    SIZES,
    SPAN_S,
    T0,
    Scenario,
    configs,
    samples,
    scenarios,
    span_of,
)
from tritonwatch.alerts.defaults import default_rules
from tritonwatch.alerts.model import Rule
from tritonwatch.store import Store, open_store

EXPECTED: dict[str, tuple[str, ...]] = {
    "fill_drop": ("batch_fill_rate_regression",),
    "ramp_fill_drop": ("batch_fill_rate_regression",),
    "ramp_ttft": ("ttft_regression",),
    "long_fill_drop": ("batch_fill_rate_regression",),
    "deploy_bad": ("batch_fill_rate_regression",),
    "config_bad": ("batch_fill_rate_regression",),
    "reload_bad": ("batch_fill_rate_regression",),
    "gpu_util_rise": ("gpu_efficiency_regression",),
    "kv_filling": ("kv_cache_saturation", "kv_cache_exhaustion_forecast", "kv_cache_regression"),
    "gpu_util_drop": ("gpu_utilization_regression",),
    "ttft_increase": ("ttft_regression",),
    "itl_increase": ("itl_regression",),
    "failure_spike": ("failure_ratio_spike",),
    "gpu_idle": ("gpu_idle_while_queued",),
    "target_down": ("target_down",),
}
#: What a deploy kind's alerts must say ("since version 2 at 10:04 UTC", ...).
SINCE = {"deploy_bad": "since version 2 at", "config_bad": "since config change at",
         "reload_bad": "since reload at"}


@dataclass
class _State:
    since: float
    last_true: float
    firing: bool
    absent_since: float | None = None


@dataclass
class Firing:
    rule: str
    target: str
    labels: dict[str, str]
    fired_at: float
    resolved_at: float | None = None
    summary: str = ""  # the summary annotation when it fired


def replay(store: Store, rules: list[Rule], start: float, end: float, step: float
           ) -> tuple[list[Firing], dict[str, float]]:
    """Evaluate ``rules`` from ``start`` to ``end`` with the engine's for / keep_firing_for
    state machine; returns every firing (with when it resolved) and seconds spent per rule."""
    states: dict[tuple[str, tuple[tuple[str, str], ...]], _State] = {}
    open_: dict[tuple[str, tuple[tuple[str, str], ...]], Firing] = {}
    fired: list[Firing] = []
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
                st.last_true, st.absent_since = now, None
                if not st.firing and now - st.since >= rule.for_s:
                    st.firing = True
                    labels = dict(c.labels)
                    f = open_[key] = Firing(rule.name, labels["target"], labels, now,
                                            summary=dict(c.annotations).get("summary", ""))
                    fired.append(f)
            for key, st in list(states.items()):
                if key[0] != rule.name or key in seen:
                    continue
                if st.absent_since is None:
                    st.absent_since = now
                if not st.firing or now - st.absent_since >= rule.keep_firing_for_s:
                    del states[key]
                    if key in open_:
                        open_.pop(key).resolved_at = now
        now += step
    return fired, cost


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--reps", type=int, default=2, help="scenarios per kind and size")
    ap.add_argument("--kinds", default="",
                    help="comma-separated scenario kinds to run (default: all)")
    ap.add_argument("--eval-interval", type=float, default=60.0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    scs = scenarios(args.reps, rng)
    if args.kinds:
        kinds = set(args.kinds.split(","))
        unknown = kinds - {sc.kind for sc in scs}
        if unknown:
            ap.error(f"--kinds: unknown {', '.join(sorted(unknown))}")
        scs = [sc for sc in scs if sc.kind in kinds]
    by_target = {sc.target: sc for sc in scs}
    t_start = time.perf_counter()
    fired: list[Firing] = []
    cost: dict[str, float] = {}
    rows = 0
    write_s = 0.0
    for span in sorted({span_of(sc) for sc in scs}):
        group = [sc for sc in scs if span_of(sc) == span]
        with tempfile.TemporaryDirectory() as tmp:
            t = time.perf_counter()
            store = open_store(f"sqlite:///{Path(tmp) / 'bench.db'}")
            store.migrations.apply()
            for sc in group:
                for ts, ss in samples(sc, rng):
                    rows += store.write(sc.target, ts, ss)
                store.flush()
                for model, config, at in configs(sc):
                    store.put_model_config(sc.target, model, config, at)
            write_s += time.perf_counter() - t
            rules = default_rules(None)
            start = T0 + HISTORY_S
            got, c = replay(store, rules, start, start + span, args.eval_interval)
            fired += got
            for k, v in c.items():
                cost[k] = cost.get(k, 0.0) + v
            store.close()
    t_done = time.perf_counter()

    def hits(sc: Scenario, expected: tuple[str, ...]) -> list[Firing]:
        return sorted((f for f in fired if f.target == sc.target and f.rule in expected
                       and f.fired_at >= sc.onset), key=lambda f: f.fired_at)

    def is_true(f: Firing) -> bool:
        sc = by_target[f.target]
        return f.rule in EXPECTED.get(sc.kind, ()) and f.fired_at >= sc.onset

    report: dict[str, dict[str, object]] = {}
    all_delays: list[float] = []
    for kind, expected in EXPECTED.items():
        kind_scs = [sc for sc in scs if sc.kind == kind]
        if not kind_scs:  # left out by --kinds
            continue
        delays: list[float] = []
        for sc in kind_scs:
            h = hits(sc, expected)
            if h:
                delays.append(h[0].fired_at - sc.onset)
        all_delays += delays
        # Precision: of the firings of this kind's rules on this kind's targets and on
        # targets where those rules are not expected (or fired before onset), the share
        # on this kind's targets after onset.  A rule firing on another fault kind that
        # also expects it (a fill rule on a deploy that cuts the fill rate) is neither.
        mine = [f for f in fired if f.rule in expected and (
            by_target[f.target].kind == kind or not is_true(f))]
        true = [f for f in mine if by_target[f.target].kind == kind and is_true(f)]
        entry: dict[str, object] = {
            "scenarios": len(kind_scs),
            "detected": len(delays),
            "recall": len(delays) / len(kind_scs),
            "firings": len(mine),
            "precision": len(true) / len(mine) if mine else None,
            "median_delay_min": statistics.median(delays) / 60 if delays else None,
            "max_delay_min": max(delays) / 60 if delays else None,
            "by_size": {
                f"{size:g}": sum(1 for sc in kind_scs if sc.size == size and hits(sc, expected))
                for size in SIZES[kind]
            },
        }
        if kind in LONG:
            # Held for the whole regression: one alert from detection to past its end,
            # resolved within 10 minutes of the end.
            held = []
            for sc in kind_scs:
                h = hits(sc, expected)
                held.append(len(h) == 1 and h[0].resolved_at is not None
                            and sc.end <= h[0].resolved_at <= sc.end + 600)
            entry["held_whole_duration"] = f"{sum(held)}/{len(held)}"
            entry["resolved_after_end_min"] = [
                round((h[0].resolved_at - sc.end) / 60, 1)
                if (h := hits(sc, expected)) and h[0].resolved_at is not None else None
                for sc in kind_scs]
        report[kind] = entry
    control_hours = sum(span_of(sc) for sc in scs if sc.kind in CONTROLS) / 3600
    false_alarms = [(f.rule, f.target) for f in fired if by_target[f.target].kind in CONTROLS]
    pre_onset = [(f.rule, f.target) for f in fired
                 if by_target[f.target].kind not in CONTROLS
                 and f.fired_at < by_target[f.target].onset]
    # Every alert says what regressed: a model (or probe of one) or a GPU.
    unnamed = [(f.rule, f.target) for f in fired
               if not ({"model", "gpu_uuid"} & f.labels.keys()) and f.rule != "target_down"]
    wrong = [(f.rule, f.target, round((f.fired_at - T0 - HISTORY_S) / 60, 1))
             for f in fired if not is_true(f)]
    # After a deploy, config change or reload, every alert says since what and when.
    since_ok = [(f.rule, f.target, f.summary) for f in fired
                if by_target[f.target].kind in SINCE and is_true(f)]
    since_wrong = [x for x in since_ok if SINCE[by_target[x[1]].kind] not in x[2]]
    summary = {
        "kinds": report,
        "deploy_alerts_saying_since": f"{len(since_ok) - len(since_wrong)}/{len(since_ok)}",
        "deploy_alerts_not_saying_since": since_wrong,
        "overall": {
            "precision": round(1 - len(wrong) / len(fired), 3) if fired else None,
            "recall": round(sum(int(r["detected"]) for r in report.values())  # type: ignore[call-overload]
                            / max(1, sum(int(r["scenarios"]) for r in report.values())), 3),  # type: ignore[call-overload]
            "median_delay_min": (round(statistics.median(all_delays) / 60, 1)
                                 if all_delays else None),
            "max_delay_min": round(max(all_delays) / 60, 1) if all_delays else None,
        },
        "control_targets": sum(1 for sc in scs if sc.kind in CONTROLS),
        "control_hours": control_hours,
        "false_alarms_on_controls": false_alarms,
        "firings_before_onset": pre_onset,
        "false_firings": wrong,
        "alerts_naming_no_model_or_gpu": unnamed,
        "rows": rows,
        "seconds": {"write": round(write_s, 1), "replay": round(t_done - t_start - write_s, 1)},
        "rule_seconds": {k: round(v, 2) for k, v in cost.items()},
    }
    if args.json:
        print(json.dumps(summary, indent=2))
        return
    print(f"{len(scs)} scenarios, {rows} samples, seed {args.seed}, eval every "
          f"{args.eval_interval:g} s over {SPAN_S / 3600:g} h ({LONG_SPAN_S / 3600:g} h for "
          f"{', '.join(LONG)}); write {summary['seconds']['write']} s, "  # type: ignore[index]
          f"replay {summary['seconds']['replay']} s")  # type: ignore[index]
    print(f"{'kind':<16}{'recall':>10}{'precision':>11}{'median delay':>14}{'max delay':>11}"
          "  detected by size")
    for kind, r in report.items():
        prec = "-" if r["precision"] is None else f"{r['precision']:.2f}"
        delay = "-" if r["median_delay_min"] is None else f"{r['median_delay_min']:.1f} min"
        mx = "-" if r["max_delay_min"] is None else f"{r['max_delay_min']:.1f} min"
        sizes = " ".join(f"{s}:{n}/{args.reps}" for s, n in r["by_size"].items())  # type: ignore[attr-defined]
        extra = (f"  held {r['held_whole_duration']}, resolved "
                 f"{r['resolved_after_end_min']} min after its end" if kind in LONG else "")
        print(f"{kind:<16}{r['detected']}/{r['scenarios']} {r['recall']:>5.2f}"
              f"{prec:>11}{delay:>14}{mx:>11}  {sizes}{extra}")
    o = summary["overall"]
    print(f"overall: recall {o['recall']}, precision {o['precision']}, "  # type: ignore[index]
          f"median delay {o['median_delay_min']} min, "  # type: ignore[index]
          f"max {o['max_delay_min']} min")  # type: ignore[index]
    print(f"false alarms on {summary['control_targets']} no-event targets "
          f"({control_hours:g} target-hours: {', '.join(CONTROLS)}): {len(false_alarms)} "
          f"{false_alarms if false_alarms else ''}")
    print(f"firings before onset on fault targets: {len(pre_onset)} {pre_onset or ''}")
    print(f"false firings (rule, target, minutes into the span): {len(wrong)} {wrong or ''}")
    print(f"alerts naming no model or GPU: {len(unnamed)} {unnamed or ''}")
    print(f"deploy / config / reload alerts saying since what: "
          f"{summary['deploy_alerts_saying_since']} {since_wrong or ''}")
    print("rule cost (s): " + ", ".join(f"{k} {v:.1f}" for k, v in cost.items()))


if __name__ == "__main__":
    main()
