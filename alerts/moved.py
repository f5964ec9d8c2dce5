"""What moved with a regression: the server-side signals of the same model, each recent window's
median against the baseline's, ranked by how far they moved; the largest are the alert's
``likely_cause`` and the dashboard's "what moved with it".

GPU throttling (``sli:gpu_throttle_reason{reason}``, 0/1 per performance-limiting NVML clock
reason, collector/gpu.py) is ranked with them per reason, as the share of the window the
target's GPUs spent throttled for it (the mean of the 0/1 buckets over the GPUs): "GPU
throttled: HW slowdown (thermal) 80 % of the window (0 % before)".  Its size is the rise of
that share, ``log(1 + rise)``: throttled all the time where it never was weighs as a doubling
of any other signal; a share that did not rise is no cause.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from tritonwatch.alerts.formatting import display, fmt_change, fmt_value
from tritonwatch.alerts.grouping import GroupKey, SeriesLoader, group_points, load_match, load_names
from tritonwatch.alerts.stats import relative_change
from tritonwatch.schemas.regressions import RegressionSpec

if TYPE_CHECKING:
    from tritonwatch.store import Store

#: The server-side signals ranked as "what moved with it" (the likely cause) when a spec names
#: none: where time went (queue, compute), memory (KV cache), the scheduler's backlog
#: (waiting, paused, pending), batching, the GPUs.
DEFAULT_RELATED: tuple[str, ...] = (
    "sli:queue_time_seconds",
    "sli:compute_time_seconds",
    "sli:kv_cache_utilization",
    "sli:llm_waiting_requests",
    "sli:llm_paused_requests",
    "sli:pending_requests",
    "sli:batch_fill_rate",
    "sli:gpu_utilization",
    "sli:gpu_power_ratio",
    "sli:gpu_throttle_reason",
    "probe:ttft_seconds",
)
#: Per GPU and NVML clock reason, 0/1 (collector/gpu.py): ranked per reason.
THROTTLE = "sli:gpu_throttle_reason"
#: How a throttle reason reads in a page.
THROTTLE_WORDS: dict[str, str] = {
    "sw_power_cap": "SW power cap",
    "hw_slowdown": "HW slowdown",
    "sw_thermal_slowdown": "SW thermal slowdown",
    "hw_thermal_slowdown": "HW slowdown (thermal)",
    "hw_power_brake_slowdown": "HW power brake",
}
#: Series kept per GPU (no model label): a model's signals include every GPU of its target.
_GPU_PREFIX = "sli:gpu_"
#: Moves smaller than this (relative) are quoted but not named as a likely cause.
CAUSE_MIN_CHANGE = 0.1


class Moved(NamedTuple):
    """One signal's move between a baseline and a recent window (:func:`moved_with`)."""

    series: str
    label: str  # "queue time"
    current: float  # median over the recent window
    baseline: float | None  # median over the baseline window (None: no data there)
    text: str  # "queue time 41 ms (x4.1)"
    unit: str = ""  # "ratio", "s", "req/s" or "": how fmt_value shows current and baseline
    weight: float | None = None  # the size, where not a log ratio (throttle shares)

    @property
    def change(self) -> float | None:
        """Relative change (+3.1 = +310 %); None without a baseline."""
        return None if self.baseline is None else relative_change(self.current, self.baseline)

    @property
    def size(self) -> float:
        """How far it moved, as |log ratio| (infinite from or to zero; 0 without baseline)."""
        if self.weight is not None:
            return self.weight
        if self.baseline is None:
            return 0.0
        if self.baseline <= 0 or self.current <= 0:
            return 0.0 if self.baseline == self.current else math.inf
        return abs(math.log(self.current / self.baseline))


def moved_with(
    store: Store,
    target: str,
    model: Mapping[str, str],
    *,
    recent: tuple[float, float],
    baseline: tuple[float, float],
    names: Sequence[str] = DEFAULT_RELATED,
    step: float = 60.0,
    skip: Sequence[str] = (),
    loader: SeriesLoader | None = None,
) -> list[Moved]:
    """What moved with a regression: each of ``names`` on ``target`` (series of the model
    ``model`` names, e.g. ``{"model": "llm", "version": "2"}``; ``sli:gpu_*`` series of every
    GPU of the target), its median over ``recent`` against its median over ``baseline``
    (``step`` buckets averaged over the matching series), ranked by how far it moved (|log
    ratio|), largest first; series without data in ``recent`` are left out.

    The alert annotations' "likely cause" and the dashboard's "what moved with it" both come
    from here.  ``loader``: the reads of the evaluation asking (its step, not ``step``)."""
    if loader is None:
        loader = SeriesLoader(store, step)
    model = dict(model)
    out: list[Moved] = []
    for name in names:
        if name in skip:
            continue
        want = {} if name.startswith(_GPU_PREFIX) else model

        def pick(window: tuple[float, float], name: str = name,
                 want: dict[str, str] = want) -> list[float]:
            data = loader.get(name, window[0], window[1], want, target)
            kept = [sd for sd in data
                    if all(dict(sd.labels).get(k) == v for k, v in want.items())]
            return list(group_points(kept, ()).get((target, ()), {}).values())

        if name == THROTTLE:
            out += _throttled(loader, target, recent, baseline)
            continue
        cur, base = pick(recent), pick(baseline)
        if not cur:
            continue
        label, unit = display(name)
        c = float(np.median(cur))
        b = float(np.median(base)) if base else None
        text = f"{label} {fmt_value(c, unit)}" + (f" ({fmt_change(c, b)})" if b is not None
                                                 else "")
        out.append(Moved(name, label, c, b, text, unit))
    out.sort(key=lambda m: -m.size)  # stable: equal moves keep the order of ``names``
    return out


def _throttled(loader: SeriesLoader, target: str, recent: tuple[float, float],
               baseline: tuple[float, float]) -> list[Moved]:
    """Per throttle reason: the share of ``recent`` the target's GPUs were throttled for it
    against the share of ``baseline``; reasons never active in ``recent`` are left out."""

    def shares(window: tuple[float, float]) -> dict[str, float]:
        by_reason: dict[str, list[float]] = {}
        for sd in loader.get(THROTTLE, window[0], window[1], {}, target):
            reason = dict(sd.labels).get("reason", "")
            by_reason.setdefault(reason, []).extend(sd.values)
        return {r: float(np.mean(v)) for r, v in by_reason.items() if v}

    cur, base = shares(recent), shares(baseline)
    out = []
    for reason, c in sorted(cur.items()):
        if c <= 0:
            continue
        b = base.get(reason)
        words = THROTTLE_WORDS.get(reason, reason.replace("_", " "))
        text = (f"GPU throttled: {words} {c * 100:.0f} % of the window"
                + (f" ({b * 100:.0f} % before)" if b is not None else ""))
        rise = c - (b or 0.0)
        out.append(Moved(THROTTLE, f"GPU throttled ({words})", c, b, text, "ratio",
                         weight=math.log1p(max(rise, 0.0))))
    return out


def likely_cause(moved: Sequence[Moved], limit: int = 3) -> str:
    """The largest moves (at least :data:`CAUSE_MIN_CHANGE`) as one line, e.g. ``queue time
    41 ms (x4.1); KV-cache utilization 97 % (+25 %)``; "" when nothing moved that much."""
    big = [m for m in moved if m.size >= math.log1p(CAUSE_MIN_CHANGE)]
    return "; ".join(m.text for m in big[:limit])


def related_moves(
    loader: SeriesLoader,
    spec: RegressionSpec,
    key: GroupKey,
    base_window: tuple[float, float],
    now: float,
) -> list[Moved]:
    target, labels = key
    names = spec.related if spec.related is not None else DEFAULT_RELATED
    skip = [spec.series, *load_names(spec)]
    return moved_with(loader.store, target, load_match(labels),
                      recent=(now - spec.recent_window, now + spec.step), baseline=base_window,
                      names=names, step=spec.step, skip=skip, loader=loader)

