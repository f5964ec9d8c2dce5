"""Built-in rules on capacity: the KV cache full or filling up, GPUs idle while requests queue.
Their thresholds and timings come from ``alerts/builtin_rules.yaml`` (built by
``alerts/defaults.py``).  Each rule writes its own annotations (a summary, a description, its
numbers): alike in shape from rule to rule, deliberately not shared, as no two say the same."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from tritonwatch.alerts.formatting import display, fmt_value, where
from tritonwatch.alerts.history import RecentBuckets
from tritonwatch.alerts.series_reads import MODEL, BuiltinRule, means, means_of
from tritonwatch.schemas.alerts import AlertCandidate
from tritonwatch.schemas.samples import Labels
from tritonwatch.schemas.values import Duration, format_duration

if TYPE_CHECKING:
    from tritonwatch.store import Store


@dataclass
class KvCacheSaturationRule(BuiltinRule):
    """``sli:kv_cache_utilization`` mean over ``window`` at or above ``threshold``."""

    threshold: float
    window: Duration

    def evaluate(self, store: Store, now: float) -> list[AlertCandidate]:
        out: list[AlertCandidate] = []
        util = means(store, "sli:kv_cache_utilization", now, self.window, MODEL)
        # What the annotations quote, read for the targets alerted on only.
        hot = {target for (target, _), u in util.items() if not u < self.threshold}
        queue = means_of(store, "sli:queue_time_seconds", now, self.window, MODEL, hot)
        pending = means_of(store, "sli:pending_requests", now, self.window, MODEL, hot)
        for key in sorted(util):
            u = util[key]
            if u < self.threshold:
                continue
            target, labels = key
            moved = [
                f"{display(n)[0]} {fmt_value(m[key], display(n)[1])}"
                for n, m in (("sli:queue_time_seconds", queue), ("sli:pending_requests", pending))
                if key in m
            ]
            summary = f"KV-cache utilization {fmt_value(u, 'ratio')} (>= " + (
                f"{fmt_value(self.threshold, 'ratio')})" + "".join(f"; {t}" for t in moved)
            )
            description = (
                f"KV-cache of {where(labels)} on {target} is {u * 100:.1f} % used "
                f"({format_duration(self.window)} mean), threshold "
                f"{self.threshold * 100:.0f} %: new requests wait or are preempted."
            )
            out.append(self.candidate(target, labels, u, summary, description,
                                      utilization=f"{u:.4g}", threshold=f"{self.threshold:g}"))
        return out


@dataclass
class KvCacheForecastRule(BuiltinRule):
    """Linear trend of ``sli:kv_cache_utilization`` reaches ``threshold`` within ``horizon``.

    The fit takes the whole ``step`` buckets starting in ``[now - window, now]`` (the one cut
    by the window's start is left out).  Buckets before the last 5-minute grid line at least
    2 min old are kept between evaluations and read once; the fit itself is recomputed.
    """

    threshold: float
    window: Duration
    horizon: Duration
    step: Duration
    min_points: int
    min_t: float

    # Whole buckets of the window up to a 5-minute grid line at least 2 min old are kept
    # between evaluations (each read once); only the rest is read on every evaluation.
    _recent: RecentBuckets | None = field(default=None, init=False, repr=False, compare=False)

    def _points(self, store: Store, now: float) -> dict[tuple[str, Labels], tuple[Any, Any]]:
        """Per model: bucket starts (relative to ``now``) and means, oldest first."""
        if self._recent is None or self._recent.history.step != self.step:
            self._recent = RecentBuckets("sli:kv_cache_utilization", step=self.step, by=MODEL)
        stamps, groups = self._recent.read(store, now - self.window, now)
        out: dict[tuple[str, Labels], tuple[Any, Any]] = {}
        for key, arr in groups.items():
            ok = ~np.isnan(arr)
            out[key] = (stamps[ok] - now, arr[ok])
        return out

    def evaluate(self, store: Store, now: float) -> list[AlertCandidate]:
        out: list[AlertCandidate] = []
        for (target, labels), (t, y) in sorted(self._points(store, now).items()):
            if len(y) < self.min_points:
                continue
            t = t + self.step / 2  # bucket midpoints, seconds relative to now
            tm, ym = t.mean(), y.mean()
            sxx = float(((t - tm) ** 2).sum())
            if sxx <= 0:
                continue
            slope = float(((t - tm) * (y - ym)).sum()) / sxx
            level = ym - slope * tm  # fitted value at now
            resid = y - (ym + slope * (t - tm))
            dof = len(y) - 2
            s2 = float((resid**2).sum()) / dof if dof > 0 else 0.0
            se = math.sqrt(s2 / sxx) if s2 > 0 else 0.0
            t_stat = slope / se if se > 0 else (math.inf if slope > 0 else 0.0)
            if slope <= 0 or t_stat < self.min_t or level >= self.threshold:
                continue
            eta = (self.threshold - level) / slope
            if eta > self.horizon:
                continue
            summary = (
                f"KV-cache {fmt_value(level, 'ratio')} and rising "
                f"{slope * 6000:.1f} %/min: full in ~{eta / 60:.0f} min"
            )
            description = (
                f"A least-squares line through the last {format_duration(self.window)} of "
                f"KV-cache utilization of {where(labels)} on {target} ({len(y)} points, "
                f"slope t={t_stat:.1f}) reaches {self.threshold * 100:.0f} % in "
                f"{eta / 60:.1f} min (horizon {format_duration(self.horizon)})."
            )
            out.append(self.candidate(
                target, labels, eta, summary, description, utilization=f"{level:.4g}",
                slope_per_minute=f"{slope * 60:.4g}", seconds_to_exhaustion=f"{eta:.0f}",
            ))
        return out


@dataclass
class GpuIdleWhileQueuedRule(BuiltinRule):
    """GPUs idle while requests queue: the GPU join series, else Triton's own view."""

    threshold: float  # utilization under which a GPU is idle (Triton-only fallback)
    idle_share: float  # of the window: a GPU idle while queued this long is flagged
    window: Duration

    def evaluate(self, store: Store, now: float) -> list[AlertCandidate]:
        out: list[AlertCandidate] = []
        joined = means(store, "sli:gpu_idle_while_queued", now, self.window, ("gpu_uuid",))
        # What the annotations quote, read for the targets alerted on only.
        idle = {target for (target, _), share in joined.items()
                if not share < self.idle_share}
        pending_gpu = means_of(store, "sli:gpu_pending_requests", now, self.window,
                               ("gpu_uuid",), idle)
        util_ratio = means_of(store, "sli:gpu_utilization_ratio", now, self.window,
                              ("gpu_uuid",), idle)
        with_join = {target for target, _ in joined}
        for key in sorted(joined):
            share = joined[key]
            if share < self.idle_share:
                continue
            target, labels = key
            extra = []
            if key in util_ratio:
                extra.append(f"utilization {fmt_value(util_ratio[key], 'ratio')}")
            if key in pending_gpu:
                extra.append(f"{pending_gpu[key]:.3g} requests pending")
            out.append(self._candidate(target, labels, share, extra))
        # Fallback from Triton's own metrics, per target without the join series.
        util = means(store, "sli:gpu_utilization", now, self.window, ("gpu_uuid",))
        by_target: dict[str, list[tuple[Labels, float]]] = {}
        for (target, labels), u in util.items():
            if target not in with_join:
                by_target.setdefault(target, []).append((labels, u))
        # Pending requests matter only where every GPU is idle: read for those targets only
        # (none on a busy fleet).
        all_idle = {target for target, gpus in by_target.items()
                    if not any(u >= self.threshold for _, u in gpus)}
        pending = means_of(store, "sli:pending_requests", now, self.window, MODEL, all_idle)
        # Summed per target in one pass: summing inside the loop over targets read every
        # target's models once per target (7 M steps per evaluation at 1,000 targets).
        queued_by_target: dict[str, float] = {}
        for (t, _), v in pending.items():
            queued_by_target[t] = queued_by_target.get(t, 0.0) + v
        for target, gpus in sorted(by_target.items()):
            queued = queued_by_target.get(target, 0.0)
            if queued < 1 or any(u >= self.threshold for _, u in gpus):
                continue
            for labels, u in sorted(gpus):
                extra = [f"utilization {fmt_value(u, 'ratio')}",
                         f"{queued:.3g} requests pending on {target}"]
                out.append(self._candidate(target, labels, 1.0, extra))
        return out

    def _candidate(
        self, target: str, labels: Labels, share: float, extra: list[str]
    ) -> AlertCandidate:
        summary = (
            f"GPU idle while requests queue ({share * 100:.0f} % of the last "
            f"{format_duration(self.window)})" + "".join(f"; {t}" for t in extra)
        )
        description = (
            f"GPU {where(labels)} of {target} was idle while models on it had queued "
            f"requests for {share * 100:.0f} % of the last {format_duration(self.window)}: "
            "check instance placement, max_queue_delay_microseconds and the input pipeline."
        )
        return self.candidate(target, labels, share, summary, description,
                              idle_share=f"{share:.3g}")

