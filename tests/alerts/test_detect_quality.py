"""Detection quality of the regression rules on constructed data (issue 20): held baselines,
comparison at the same load, likely causes and deploys, through the real engine and a real
SQLite store."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from tritonwatch.alerts.detect import RegressionRule
from tritonwatch.alerts.engine import Engine
from tritonwatch.replay import collect
from tritonwatch.schemas.regressions import RegressionSpec
from tritonwatch.schemas.samples import Sample, make_labels
from tritonwatch.store import Store

T0 = 1_750_003_200.0  # an hour boundary
M = make_labels({"model": "llm", "version": "1"})

#: The built-in regression rules' timings, on a rule of the test's own.
FILL = RegressionSpec.model_validate({
    "name": "fill", "series": "sli:batch_fill_rate", "direction": "down",
    "recent_window": "5m", "baseline_window": "4h", "for": "2m", "keep_firing_for": "5m",
})

Shape = Callable[[float], float]


def write_fill(store: Store, *, end: float, load: Shape, fill: Shape, seed: int = 0,
               target: str = "t1") -> None:
    """A scrape every 30 s from T0 to ``end``: request rate ``load(ts)`` and a fill rate
    ``fill(ts)`` that follows it (elasticity 0.7), both with 5 % noise."""
    rng = np.random.default_rng(seed)
    ts = T0
    while ts <= end:
        x = load(ts)
        store.write(target, ts, [
            Sample("sli:request_rate", M, 20 * x * float(rng.lognormal(0, 0.05))),
            Sample("sli:batch_fill_rate", M,
                   0.6 * x**0.7 * fill(ts) * float(rng.lognormal(0, 0.05))),
        ])
        ts += 30.0
    store.flush()


def run(store: Store, spec: RegressionSpec, start: float, end: float,
        step: float = 60.0) -> list[tuple[float, float | None]]:
    """(fired_at, resolved_at) of every alert of ``spec`` evaluated over [start, end]."""
    engine = Engine([RegressionRule(spec)], store, eval_interval=step, persist=False,
                    clock=lambda: start)
    events = []
    now = start
    while now <= end:
        events += engine.evaluate(now)
        now += step
    return [(a.fired_at, a.resolved_at) for a in collect(events)]


def test_lasting_regression_fires_for_its_whole_duration_and_resolves_after_it(
        store: Store) -> None:
    # Fill rate -30 % for 6 hours at steady load.  A trailing 4 h baseline holds the new
    # level as its median after ~2 h: without the baseline held at onset the alert resolved
    # then, with four hours of the regression still to come.
    onset = T0 + 4.5 * 3600
    end_of_it = onset + 6 * 3600
    write_fill(store, end=end_of_it + 3600, load=lambda ts: 1.0,
               fill=lambda ts: 0.7 if onset <= ts < end_of_it else 1.0)
    alerts = run(store, FILL, onset - 600, end_of_it + 1800)
    assert len(alerts) == 1, alerts
    fired, resolved = alerts[0]
    assert onset < fired <= onset + 600
    assert resolved is not None and end_of_it < resolved <= end_of_it + 600, (
        (resolved - end_of_it) / 60 if resolved else None)
