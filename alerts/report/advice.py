"""Tuning advice drawn from a week of the fleet's own data, as rules kept as data.

Each :class:`AdviceRule` names the week's means it reads (``needs``), a condition over them,
and a text that quotes them.  A rule whose numbers are not all there gives no advice: advice
is never given without the numbers it rests on.  The thresholds live in :data:`RULES` next to
their reasons, so changing one is a data change with a test that names it.

Signals per (target, model) — means of hourly means over the week (``build.model_signals``):
``sli:batch_fill_rate``, ``sli:queue_time_seconds``, ``sli:compute_time_seconds``,
``sli:pending_requests``, ``sli:llm_waiting_requests``, ``sli:llm_paused_requests``,
``sli:kv_cache_utilization`` (and ``:peak``, the highest hourly mean), ``sli:gpu_utilization``
(the target's GPUs).  Derived here: ``queue_budget_s`` (the threshold of a queue-time SLO
covering the model, else the model's mean compute time: queueing that adds at most that much
latency), and from the stored model config ``max_batch_size``, ``max_queue_delay_us``,
``instance_count``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tritonwatch.alerts.report.model import Advice
from tritonwatch.schemas.rules import QueueTimeSli

Signals = Mapping[str, float]


@dataclass(frozen=True)
class AdviceRule:
    id: str
    title: str
    needs: tuple[str, ...]  # signals that must all be known
    when: Callable[[Signals], bool]
    text: Callable[[Signals], str]


#: Fill below this is "low": half-empty batches cost GPU time per request.
LOW_FILL = 0.6
#: Queue time at most this share of its budget is "far under budget".
QUEUE_HEADROOM = 0.1
#: A GPU below this utilization while requests wait is idle.
IDLE_GPU = 0.3
#: Mean pending requests at least this: requests do wait.
QUEUED = 1.0
#: KV cache whose busiest hour averaged at least this is near full.
KV_FULL = 0.9


def _ms(s: float) -> str:
    return f"{s * 1000:.3g} ms"


def _pct(r: float) -> str:
    return f"{r * 100:.0f} %"


def _delay(s: Signals) -> str:
    if "max_queue_delay_us" in s:
        return f"now {s['max_queue_delay_us']:g} µs"
    return "not set"


RULES: tuple[AdviceRule, ...] = (
    AdviceRule(
        id="low_fill_queue_headroom",
        title="Batches run half empty while queue time is far under budget",
        needs=("sli:batch_fill_rate", "sli:queue_time_seconds", "queue_budget_s"),
        when=lambda s: s["sli:batch_fill_rate"] < LOW_FILL
        and s["sli:queue_time_seconds"] <= QUEUE_HEADROOM * s["queue_budget_s"],
        text=lambda s: (
            f"Batch fill rate averaged {_pct(s['sli:batch_fill_rate'])} while requests queued "
            f"{_ms(s['sli:queue_time_seconds'])} against a budget of {_ms(s['queue_budget_s'])}. "
            f"Raise dynamic_batching.max_queue_delay_microseconds ({_delay(s)}) toward "
            f"{s['queue_budget_s'] * 0.5e6:g} µs (half the budget), or add preferred_batch_size "
            "values, so that more requests share an execution."
        ),
    ),
    AdviceRule(
        id="gpu_idle_while_queued",
        title="GPUs idle while requests queue",
        needs=("sli:gpu_utilization", "sli:pending_requests"),
        when=lambda s: s["sli:gpu_utilization"] < IDLE_GPU
        and s["sli:pending_requests"] >= QUEUED,
        text=lambda s: (
            f"GPU utilization averaged {_pct(s['sli:gpu_utilization'])} while "
            f"{s['sli:pending_requests']:.3g} requests were pending on average. Add model "
            f"instances (instance_group count, now {s.get('instance_count', 1):g}) or allow a "
            f"larger batch (max_batch_size, now {s.get('max_batch_size', 0):g})."
        ),
    ),
    AdviceRule(
        id="kv_cache_full_with_waiting",
        title="KV cache near full with requests waiting or paused",
        needs=("sli:kv_cache_utilization:peak", "sli:llm_waiting_requests",
               "sli:llm_paused_requests"),
        when=lambda s: s["sli:kv_cache_utilization:peak"] >= KV_FULL
        and (s["sli:llm_waiting_requests"] >= QUEUED or s["sli:llm_paused_requests"] > 0),
        text=lambda s: (
            f"KV-cache utilization reached {_pct(s['sli:kv_cache_utilization:peak'])} in its "
            f"busiest hour while {s['sli:llm_waiting_requests']:.3g} requests waited and "
            f"{s['sli:llm_paused_requests']:.3g} were paused on average. Lower the concurrent "
            "sequences (max_batch_size / max_num_sequences) or give the KV cache more blocks "
            "(kv_cache_free_gpu_mem_fraction, a larger GPU, or a quantized KV cache)."
        ),
    ),
)


def _config_numbers(config: Mapping[str, Any]) -> dict[str, float]:
    out: dict[str, float] = {}
    mbs = config.get("max_batch_size")
    if isinstance(mbs, int | float):
        out["max_batch_size"] = float(mbs)
    batching = config.get("dynamic_batching")
    if isinstance(batching, Mapping):
        delay = batching.get("max_queue_delay_microseconds")
        if isinstance(delay, int | float | str) and str(delay).isdigit():
            out["max_queue_delay_us"] = float(delay)
    groups = config.get("instance_group")
    if isinstance(groups, list) and groups:
        out["instance_count"] = float(sum(int(g.get("count", 1)) for g in groups
                                          if isinstance(g, Mapping)))
    return out


def _queue_budget(target: str, model: str, signals: Signals,
                  budgets: Sequence[tuple[QueueTimeSli, float]]) -> float | None:
    for sli, threshold in budgets:
        if (sli.model in (None, model)) and (sli.target in (None, target)):
            return threshold
    return signals.get("sli:compute_time_seconds")


def advise(
    signals: Mapping[tuple[str, str], Signals],
    configs: Mapping[tuple[str, str], Mapping[str, Any]],
    queue_budgets: Sequence[tuple[QueueTimeSli, float]],
    rules: Sequence[AdviceRule] = RULES,
) -> tuple[Advice, ...]:
    """Every rule's advice for every model whose numbers satisfy it."""
    out = []
    for (target, model), found in sorted(signals.items()):
        s: dict[str, float] = {**found, **_config_numbers(configs.get((target, model), {}))}
        budget = _queue_budget(target, model, s, queue_budgets)
        if budget is not None:
            s["queue_budget_s"] = budget
        for rule in rules:
            if not all(k in s for k in rule.needs) or not rule.when(s):
                continue
            quoted = {k: s[k] for k in rule.needs}
            for extra in ("max_queue_delay_us", "max_batch_size", "instance_count"):
                if extra in s:
                    quoted[extra] = s[extra]
            out.append(Advice(rule.id, target, model, rule.title, rule.text(s), quoted))
    return tuple(out)
