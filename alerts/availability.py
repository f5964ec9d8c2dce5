"""Built-in rules on availability: failures spiking by reason, a target that stops answering.
Their thresholds and timings come from ``alerts/builtin_rules.yaml`` (built by
``alerts/defaults.py``).  Each rule writes its own annotations (a summary, a description, its
numbers): alike in shape from rule to rule, deliberately not shared, as no two say the same."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from tritonwatch.alerts.formatting import fmt_change, fmt_value, where
from tritonwatch.alerts.grouping import by_labels
from tritonwatch.alerts.history import QUANTUM_S, ceil_to, floor_to
from tritonwatch.alerts.series_reads import (
    FEW_TARGETS,
    MODEL,
    BuiltinRule,
    group_means,
    group_sums,
)
from tritonwatch.schemas.alerts import AlertCandidate
from tritonwatch.schemas.samples import Labels
from tritonwatch.schemas.values import Duration, format_duration
from tritonwatch.store import Query

if TYPE_CHECKING:
    from collections.abc import Iterator

    from tritonwatch.store import SeriesKey, Store


def sums_counts(
    store: Store, name: str, lo: float, hi: float, by: tuple[str, ...], *,
    nonzero: bool = False,
) -> dict[tuple[str, Labels], list[float]]:
    """Per group (target, ``by`` labels): ``[sum, count]`` of the finite samples with
    ``lo <= ts <= hi``, from 5-minute ``sum`` and ``count`` buckets; ``nonzero``: only the
    groups with a series whose sum is not zero (as :func:`group_sums`).

    For a window on the 5-minute grid these come from the 5-minute rollup up to its watermark
    (raw after it) instead of every raw sample of the window.  A series with a non-finite
    bucket sum (a NaN or infinite sample: the bucket cannot tell its finite samples apart) is
    read raw instead.  Each read is summed per series in the store, a batch of series at a
    time (``Store.finite_sums``): the hour of failure rates by reason of 1,000 targets is
    336,000 buckets of each kind.
    """
    sums = store.finite_sums(Query(name, start=lo, end=hi, step=QUANTUM_S, agg="sum"))
    counts = store.finite_sums(Query(name, start=lo, end=hi, step=QUANTUM_S, agg="count"))
    # Per series of ``sums``: its samples (the sum of its count buckets) and its buckets.
    if counts.keys == sums.keys:  # always, unless a flush came between the two reads
        samples, buckets = counts.sums.tolist(), counts.counts.tolist()
    else:
        of = {k: (n, b) for k, n, b in zip(counts.keys, counts.sums.tolist(),
                                             counts.counts.tolist(), strict=True)}
        got = [of.get(k, (0.0, 0)) for k in sums.keys]
        samples, buckets = [n for n, _ in got], [b for _, b in got]
    totals, finites = sums.sums.tolist(), sums.counts.tolist()

    def rows() -> Iterator[tuple[SeriesKey, float, int, float, int]]:
        return zip(sums.keys, totals, finites, samples, buckets, strict=True)

    wanted = None
    if nonzero:  # groups of a series with a nonzero sum, or one read raw (it may have one)
        wanted = {(k.target, by_labels(k.labels, by)) for k, total, finite, _, b in rows()
                  if total != 0 or finite < b}
    acc: dict[tuple[str, Labels], list[float]] = {}
    for key, total, finite, n, b in rows():
        group = (key.target, by_labels(key.labels, by))
        if wanted is not None and group not in wanted:
            continue
        a = acc.setdefault(group, [0.0, 0.0])
        if finite == b:  # every bucket's sum is finite
            a[0] += total
            a[1] += n
            continue
        for raw in store.read(Query(name, start=lo, end=hi, target=key.target,
                                    match=dict(key.labels))).series():
            if raw.labels == key.labels:
                finite_values = [v for v in raw.values if math.isfinite(v)]
                a[0] += math.fsum(finite_values)
                a[1] += float(len(finite_values))
    return acc


def mean(a: list[float] | None) -> float:
    """The mean of a ``[sum, count]`` (0 without a count)."""
    return a[0] / a[1] if a is not None and a[1] else 0.0


@dataclass
class FailureRatioSpikeRule(BuiltinRule):
    """Failures by reason / all requests spike above the ratio of the hour before.

    The recent ``window`` is read raw on every evaluation, as per-series sums and counts
    (``Store.finite_sums``: a batch of series' samples in memory at a time).  The hour before is the
    ``baseline_window`` of whole 5-minute intervals ending on the 5-minute grid line at or
    before the recent window's start (0 to 5 min before it; that gap is in neither window): so
    it comes from the 5-minute rollup, and changes only once per 5 minutes, when it is read
    again (``_baseline`` caches it); re-reading an hour of raw samples of every target every
    30 s made evaluation cost grow with the fleet and the stored history.
    """

    threshold: float
    window: Duration
    baseline_window: Duration
    min_traffic: float
    factor: float
    margin: float
    # (window, {(target, model labels): mean request rate}, likewise failures by reason);
    # replaced when the window moves to the next 5 minutes.  Means, not the [sum, count]
    # lists they come from: a float per instance instead of a list of two (4 of the 8 MB
    # this rule kept at 1,000 targets).
    _baseline: tuple[tuple[float, float], dict[Any, float], dict[Any, float]] | None = (
        field(default=None, init=False, repr=False, compare=False))

    def baseline_span(self, now: float) -> tuple[float, float]:
        """The baseline's ``[start, end)`` at ``now``: whole 5-minute intervals."""
        end = floor_to(now - self.window, QUANTUM_S)
        return end - ceil_to(self.baseline_window, QUANTUM_S), end

    def _base(self, store: Store, now: float) -> tuple[dict[Any, float], dict[Any, float]]:
        span = self.baseline_span(now)
        if self._baseline is None or self._baseline[0] != span:
            lo, hi = span[0], span[1] - 0.001  # [start, end): the store's end is inclusive
            ok = sums_counts(store, "sli:request_rate", lo, hi, MODEL)
            # Reasons without failures are left out (a missing one reads as 0): most are.
            fail = sums_counts(store, "sli:failure_rate", lo, hi, (*MODEL, "reason"),
                               nonzero=True)
            fail_means = {k: v for k, v in group_means(fail).items() if v != 0}
            self._baseline = (span, group_means(ok), fail_means)
        return self._baseline[1], self._baseline[2]

    def evaluate(self, store: Store, now: float) -> list[AlertCandidate]:
        split = now - self.window
        ok_base, fail_base = self._base(store, now)

        # [sum, count] of the finite samples of (split, now].
        ok_now = group_sums(store.finite_sums(
            Query("sli:request_rate", start=split, end=now), after=split), MODEL)
        # A reason without failures in the window (nearly all of them, in a healthy fleet)
        # adds nothing to its model's failures and has a ratio of 0, under any threshold
        # (which is positive): only the others are grouped.
        fail_now = group_sums(store.finite_sums(
            Query("sli:failure_rate", start=split, end=now), after=split), (*MODEL, "reason"),
            nonzero=self.threshold > 0)

        models: dict[Labels, Labels] = {}  # the same few label sets on every target

        def model_key(key: tuple[str, Labels]) -> tuple[str, Labels]:
            found = models.get(key[1])
            if found is None:
                found = models[key[1]] = tuple(p for p in key[1] if p[0] != "reason")
            return key[0], found

        fail_all: dict[tuple[str, Labels], list[float]] = {}  # [recent, baseline] mean rates
        for key, a in fail_now.items():
            # Mean rates add up over reasons.
            fail_all.setdefault(model_key(key), [0.0, 0.0])[0] += mean(a)
        for key, rate in fail_base.items():
            fail_all.setdefault(model_key(key), [0.0, 0.0])[1] += rate
        out: list[AlertCandidate] = []
        for (target, labels), a in sorted(fail_now.items()):
            mkey = model_key((target, labels))
            allf = fail_all[mkey]
            total_now = mean(ok_now.get(mkey)) + allf[0]
            total_base = ok_base.get(mkey, 0.0) + allf[1]
            if total_now < self.min_traffic:
                continue
            ratio = mean(a) / total_now
            base = fail_base.get((target, labels), 0.0) / total_base if total_base > 0 else 0.0
            if ratio < self.threshold or ratio < self.factor * base + self.margin:
                continue
            reason = dict(labels).get("reason", "ALL")
            summary = (
                f"{ratio * 100:.1f} % of requests failing ({reason}) vs "
                f"{base * 100:.2f} % in the hour before; "
                f"{fmt_value(total_now, 'req/s')} ({fmt_change(total_now, total_base)})"
            )
            description = (
                f"{where(labels)} on {target}: {mean(a):.3g} failures/s with reason "
                f"{reason} out of {total_now:.3g} requests/s over the last "
                f"{format_duration(self.window)} ({ratio * 100:.1f} %, threshold "
                f"{self.threshold * 100:.0f} %); baseline {base * 100:.2f} % over the "
                f"{format_duration(self.baseline_window)} before."
            )
            out.append(self.candidate(
                target, labels, ratio, summary, description, failure_ratio=f"{ratio:.4g}",
                baseline_ratio=f"{base:.4g}", request_rate=f"{total_now:.4g}",
            ))
        return out


@dataclass
class TargetDownRule(BuiltinRule):
    """A target whose latest ``up`` is 0, or that has not been scraped for ``stale_after``.

    ``targets``: the targets configured now (``serve`` sets it, see :func:`watch_targets`);
    the store keeps the history of removed ones, which are not down but gone, so their alerts
    resolve.  ``None`` (replay, backtests over a store alone) judges every target it finds.
    """

    stale_after: Duration
    lookback: Duration
    targets: frozenset[str] | None = None

    def evaluate(self, store: Store, now: float) -> list[AlertCandidate]:
        last: dict[str, tuple[float, float]] = {}  # target -> (ts, value) of latest ``up``
        # The latest raw samples decide (a bucket's min hides a recovery inside it).
        recent = store.read(Query("up", start=now - 2 * self.stale_after, end=now)).series()
        # The lookback's minute buckets matter only for targets without a recent sample: of a
        # target with one, the latest bucket starts at or before its latest sample (both
        # windows end at ``now``), so the recent samples decide as they would after it.  A
        # configured target that is answering (all of them, mostly) needs no hour of ``up``.
        fresh = {sd.target for sd in recent if sd.ts}
        hour = Query("up", start=now - self.lookback, end=now, step=60.0, agg="min")
        if self.targets is None:
            buckets = store.read(hour).series()
        else:
            stale = sorted(self.targets - fresh)
            buckets = (store.read(hour).series() if len(stale) > FEW_TARGETS else
                       [sd for t in stale for sd in store.read(replace(hour, target=t)).series()])
        for sd in buckets:
            if sd.ts and (sd.target not in last or sd.ts[-1] > last[sd.target][0]):
                last[sd.target] = (sd.ts[-1], sd.values[-1])
        for sd in recent:
            if sd.ts and sd.ts[-1] >= last.get(sd.target, (-math.inf, 0.0))[0]:
                last[sd.target] = (sd.ts[-1], sd.values[-1])
        errors: dict[str, str] = {}
        for h in store.health():
            if h.source != "metrics":
                continue
            if h.error:
                errors[h.target] = h.error
            if h.target not in last or h.ts > last[h.target][0]:
                last[h.target] = (h.ts, 1.0 if h.up else 0.0)
        out: list[AlertCandidate] = []
        for target, (ts, value) in sorted(last.items()):
            if self.targets is not None and target not in self.targets:
                continue
            age = now - ts
            if value >= 1 and age <= self.stale_after:
                continue
            if value < 1:
                why = f"its last scrape failed ({format_duration(max(age, 0))} ago)"
            else:
                why = f"it has not been scraped for {format_duration(round(age))}"
            if target in errors:
                why += f": {errors[target]}"
            out.append(self.candidate(
                target, (), age, f"Target {target} is not answering",
                f"Tritonwatch cannot read {target}: {why}.", last_scrape_age_seconds=f"{age:.0f}",
            ))
        return out

