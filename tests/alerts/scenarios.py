"""Labelled synthetic SLI series for the built-in alert rules: one fault scenario per target.

Every scenario is one Triton target ("<kind>-<size>-<n>") in one temporary SQLite store, with
the SLI series the collector derives, written directly as store samples every 30 s for 6.5 h:
steady traffic with a daily shape (±30 %, random phase) and noise (request rate 5 %, fill rate
5 %, KV-cache 3 %, GPU 5 %, log-normal TTFT 10 % with 0.5 % of 3x spikes, ...; requests in
flight and the prompt-token rate follow the load, TTFT the prompt-token rate), and from a known
onset in the last 2 h one fault:

============== ============================================== =================================
kind           fault, sizes                                   expected rule(s)
============== ============================================== =================================
fill_drop      batch fill rate x (1 - s), s = 0.2 0.3 0.5     batch_fill_rate_regression
deploy_bad     version 1 -> 2 at onset, fill x 0.7            batch_fill_rate_regression
config_bad     config change at onset (same version), fill    batch_fill_rate_regression
               x 0.7
reload_bad     no model data for s = 5 min before onset (a    batch_fill_rate_regression
               reload), fill x 0.7 from onset
gpu_util_rise  GPU utilization x (1 + s) at the same load,    gpu_efficiency_regression
               the GPU thermally throttled
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
deploy_ok,     version 1 -> 2 / a config change / a 5-minute  (nothing may fire)
config_ok,     reload at onset, nothing else changes
reload_ok
kv_longer      requests last x (1 + s) longer: x (1 + s) in   (nothing may fire: KV-cache use is
               flight and KV-cache use, same request rate     modelled on requests in flight)
long_prompts   prompts x (1 + s) longer: prompt-token rate    (nothing may fire: TTFT is
               and TTFT (elasticity 0.5) with them            modelled on the prompt-token rate)
============== ============================================== =================================

The pass/fail suite (tests/alerts/test_defaults.py, test_detect_quality.py) and the detection
benchmark (bench/detection.py, which scores precision, recall and delay on these) share this
generator; it lives under tests/ so that the suite never imports bench.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from tritonwatch.schemas.samples import Sample, make_labels

SCRAPE_S = 30.0
HISTORY_S = 4.5 * 3600  # before the evaluated span: fills the 4 h + 15 min windows
SPAN_S = 2 * 3600.0  # evaluated span
T0 = 1_750_003_200.0  # an hour boundary

SIZES: dict[str, tuple[float, ...]] = {
    "fill_drop": (0.2, 0.3, 0.5),
    "ramp_fill_drop": (0.25,),  # starts where the daily cycle climbs fastest
    "ramp_ttft": (0.25,),
    "long_fill_drop": (0.3,),  # lasts LONG_S, then recovers
    "deploy_bad": (0.3,),  # version 1 -> 2 at onset, fill rate x (1 - s)
    "gpu_util_rise": (0.2, 0.4),  # GPU utilization x (1 + s) at the same load
    "kv_filling": (15.0, 30.0, 60.0),  # minutes to full
    "gpu_util_drop": (0.2, 0.3, 0.5),
    "ttft_increase": (0.2, 0.5, 1.0),
    "itl_increase": (0.2, 0.5, 1.0),
    "failure_spike": (0.05, 0.1, 0.3),
    "gpu_idle": (1.0,),
    "target_down": (5.0, 15.0, 60.0),  # minutes down
    "steady": (0.0,),
    "traffic_drop": (0.4, 0.6),
    "deploy_ok": (0.0,),  # version 1 -> 2 at onset, nothing else changes
    "config_bad": (0.3,),  # the model config changes at onset, fill rate x (1 - s)
    "config_ok": (0.0,),  # the model config changes at onset, nothing else does
    "reload_bad": (5.0,),  # no model data for s minutes before onset (unload + load), then
    # fill rate x 0.7 from onset, when it is back
    "reload_ok": (5.0,),  # no model data for s minutes before onset, then as before
    "kv_longer": (0.3,),  # requests last x (1 + s): in flight and KV-cache use x (1 + s)
    "long_prompts": (1.0,),  # prompts x (1 + s): prompt-token rate x (1 + s), TTFT with it
    "restart": (1.0,),  # no scrape for s minutes; then counters restart (series go on)
    "gpu_dropout": (10.0,),  # no GPU telemetry for s minutes
}
CONTROLS = ("steady", "traffic_drop", "deploy_ok", "config_ok", "reload_ok", "restart",
            "gpu_dropout", "kv_longer", "long_prompts")
#: Kinds whose event is a model config written at onset (``configs``).
CONFIG_CHANGES = ("config_bad", "config_ok")
#: Kinds whose model has no data for ``size`` minutes before onset (a reload).
RELOADS = ("reload_bad", "reload_ok")
#: The fault regresses the fill rate by ``FILL_DROP_OF[kind]`` (or ``size``) from onset.
FILL_DROPS = ("fill_drop", "ramp_fill_drop", "long_fill_drop", "deploy_bad", "config_bad",
              "reload_bad")
LONG = ("long_fill_drop",)  # evaluated over LONG_SPAN_S instead of SPAN_S
LONG_S = 6 * 3600.0  # how long a long regression lasts
LONG_SPAN_S = LONG_S + 3600.0
RAMP = ("ramp_fill_drop", "ramp_ttft")


@dataclass(frozen=True)
class Scenario:
    kind: str
    size: float
    rep: int
    onset: float  # unix s; inf for steady
    phase: float = 1.0  # of the daily cycle
    end: float = math.inf  # unix s: the fault ends (inf: lasts to the end)

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
                phase = float(rng.uniform(0, 2 * math.pi))
                if kind in RAMP:  # the cycle climbs fastest (sin' = 1) at onset
                    phase = -2 * math.pi * onset / 86400
                end = onset + LONG_S if kind in LONG else math.inf
                out.append(Scenario(kind, size, rep, onset, phase, end))
    return out


def samples(sc: Scenario, rng: np.random.Generator) -> Iterator[tuple[float, list[Sample]]]:
    """(ts, samples) of one scrape of ``sc``'s target, every SCRAPE_S over history + span."""
    m1 = make_labels({"model": "llm", "version": "1"})
    m2 = make_labels({"model": "llm", "version": "2"})
    g = make_labels({"gpu_uuid": f"GPU-{sc.target}"})
    p = make_labels({"probe": f"p-{sc.target}", "model": "llm", "protocol": "grpc"})
    phase = sc.phase
    n = int((HISTORY_S + span_of(sc)) / SCRAPE_S)
    # Lower for kv_longer: its step up stays clear of the saturation and forecast rules.
    kv_base = 0.35 if sc.kind == "kv_longer" else 0.5
    for i in range(n):
        ts = T0 + i * SCRAPE_S
        on = sc.onset <= ts < sc.end
        since = ts - sc.onset
        m = m2 if sc.kind in ("deploy_bad", "deploy_ok") and on else m1
        if sc.kind == "restart" and on and since < sc.size * 60:
            continue  # the server restarts: nothing answers
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
        if sc.kind in FILL_DROPS and on:
            fill *= 1 - (0.3 if sc.kind == "reload_bad" else sc.size)
        # Requests in flight: arrivals x how long they last (Little's law).
        longer = 1 + sc.size if sc.kind == "kv_longer" and on else 1.0
        inflight = 30 * load * longer * noise(0.05)
        kv = min(1.0, kv_base * load * longer * noise(0.03))
        # Prompt tokens per second: arrivals x prompt length (500 tokens).
        prompt = 1 + sc.size if sc.kind == "long_prompts" and on else 1.0
        prompt_rate = 500 * rate * prompt * noise(0.05)
        if sc.kind == "kv_filling" and on:
            kv = min(1.0, kv + (1.0 - kv_base) * since / (sc.size * 60))
        gpu = min(1.0, 0.7 * load**0.8 * noise(0.05))
        if sc.kind == "gpu_util_drop" and on:
            gpu *= 1 - sc.size
        if sc.kind == "gpu_util_rise" and on:
            gpu = min(1.0, gpu * (1 + sc.size))
        idle = 1.0 if sc.kind == "gpu_idle" and on else 0.0
        spike = 3.0 if rng.random() < 0.005 else 1.0
        # TTFT follows the prefill work arriving (elasticity 0.5 on the prompt-token rate).
        ttft = 0.2 * (load * prompt) ** 0.5 * noise(0.10) * spike
        itl = 0.02 * noise(0.10) * (3.0 if rng.random() < 0.005 else 1.0)
        if sc.kind in ("ttft_increase", "ramp_ttft") and on:
            ttft *= 1 + sc.size
        if sc.kind == "itl_increase" and on:
            itl *= 1 + sc.size
        throttled = 1.0 if sc.kind == "gpu_util_rise" and on else 0.0
        gpu_series = [
            Sample("sli:gpu_utilization", g, gpu),
            Sample("sli:gpu_idle_while_queued", g, idle),
            Sample("sli:gpu_throttle_reason",
                   make_labels({**dict(g), "reason": "hw_thermal_slowdown"}), throttled),
            Sample("sli:gpu_throttle_reason",
                   make_labels({**dict(g), "reason": "sw_power_cap"}), 0.0),
        ]
        if sc.kind == "gpu_dropout" and on and since < sc.size * 60:
            gpu_series = []
        unloaded = sc.kind in RELOADS and -sc.size * 60 <= since < 0
        if unloaded:  # the model is unloaded (no model series, no probe) until loaded again
            yield ts, [*gpu_series, Sample("up", (), 1.0)]
            continue
        yield ts, [
            *gpu_series,
            Sample("up", (), 1.0),
            Sample("sli:request_rate", m, rate * (1 - fail_ratio)),
            Sample("sli:failure_rate", make_labels({**dict(m), "reason": "timeout"}),
                   rate * fail_ratio * noise(0.2)),
            Sample("sli:batch_fill_rate", m, fill),
            Sample("sli:kv_cache_utilization", m, kv),
            Sample("sli:queue_time_seconds", m, 0.01 * noise(0.2)),
            Sample("sli:pending_requests", m, float(rng.poisson(2))),
            Sample("sli:llm_active_requests", m, inflight),
            Sample("sli:prompt_tokens_rate", m, prompt_rate),
            Sample("probe:ttft_seconds", p, ttft),
            Sample("probe:itl_seconds", p, itl),
        ]


def configs(sc: Scenario) -> list[tuple[str, dict[str, object], float]]:
    """``(model, config, fetched_at)`` the collector stored for ``sc``'s target, oldest first:
    the config read at the start, and for a config change the new one at onset."""
    out: list[tuple[str, dict[str, object], float]] = [
        ("llm", {"name": "llm", "max_batch_size": 8}, T0)]
    if sc.kind in CONFIG_CHANGES:
        out.append(("llm", {"name": "llm", "max_batch_size": 16}, sc.onset))
    return out


def span_of(sc: Scenario) -> float:
    return LONG_SPAN_S if sc.kind in LONG else SPAN_S
