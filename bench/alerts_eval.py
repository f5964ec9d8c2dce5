"""CPU of one evaluation of the built-in alert rules over a fleet, as ``serve`` runs it.

    .venv/bin/python -m bench.alerts_eval [--backend sqlite|postgres|both] [--targets 300]
        [--hours 4] [--evals 20] [--profile FILE]

**Fill.**  ``--targets`` targets of ``tests.payloads.Template`` (7 models, 2 GPUs: the fleet
shape of ``bench.flush``: 566 series a payload, plus 100 derived ``sli:*`` and ``up``), scraped
every 15 s for ``--hours`` of history.  Each payload is parsed once
(``collector.shape.parse_columns``); per target, 16 scrapes of a random walk (each interval
0.6 to 1.4 of the template's rate, so the ``sli:*`` rates wobble like real load instead of
being flat) are derived by the collector's own ``Deriver.derive_columns`` (with
``max_batch_size`` 8, as serve's config gives it, for the fill rate), and every scrape writes
one of them at random, with ``up``, through ``Store.write_columns`` and the target's health,
as ``collector.jobs`` does.  Older history holds the derived series only (what the built-in
rules read: a fill of the whole payload took 13 min at 300 targets), flushed once a minute;
the last 15 min and every scrape during the timed phase hold the whole payload, flushed every
15 s as serve does.  ``Store.maintenance.rollup`` runs every 5 simulated minutes, as serve's
maintenance job does.  4 h is the longest window of the built-in rules (the regressions'
trailing baseline; the week-ago one is absent, as on any collector younger than a week, so the
trailing one decides); shorter ``--hours`` leave the regression baselines partly empty.

**Timing.**  The engine is built by ``AlertJob.from_config`` (default rules, TargetDown
watching the configured targets, no delivery), exactly as serve builds it.  The first
evaluation (cold: every cache empty, the 4 h baselines read whole) is timed on its own; then
``--evals`` evaluations 30 s apart (serve's ``eval_interval``), each after two more scrapes of
every target and a flush (not timed; rollups every 5 simulated minutes, not timed), time
``AlertJob.evaluate`` (its flush finds nothing left).  CPU is this process's
(``time.process_time``) and, on PostgreSQL, the server's: user+system of the postmaster and
its children from /proc (``bench.common.process_tree_cpu``), idle around the evaluation.
Prints the median, min and max per evaluation and a per-rule breakdown (process CPU of each
rule's ``evaluate``, summed over the timed evaluations) and the alerts' answers' digest
(fingerprints and values of every evaluation: equal before and after a change of the read
path means the answers did not change, for this data) and the verdicts' digest (fingerprints
and states only: equal across a change that moves values in their last digits, such as the
histories' float32 buckets, means every alert was pending, firing and resolved alike).
``--sizes`` also prints the bytes each rule keeps between evaluations; ``--peaks`` each rule's
highest transient of one timed evaluation, traced by ``tracemalloc`` (slower: its CPU figures are
not comparable with a run without it).
"""

from __future__ import annotations

import argparse
import cProfile
import hashlib
import os
import random
import resource
import statistics
import tempfile
import time
import tracemalloc
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

from bench.common import proc_stat, process_tree_cpu
from bench.memory_state import deep_size
from tests.payloads import Template
from tritonwatch.alerts.engine import Engine
from tritonwatch.alerts.jobs import AlertJob
from tritonwatch.alerts.model import Rule
from tritonwatch.collector.derive import Deriver
from tritonwatch.collector.shape import Shape, parse_columns
from tritonwatch.schemas.config import Config
from tritonwatch.schemas.samples import Labels, TargetHealth, label_value
from tritonwatch.schemas.triton import ModelConfigInfo
from tritonwatch.store import Store, open_store

T0 = 1_700_000_000.0
INTERVAL_S = 15.0
EVAL_S = 30.0
ROLLUP_S = 300.0
MODELS, GPUS = 7, 2
RAW_S = 900.0  # the last 15 min of the fill hold every series of the payload


VARIANTS = 16  # derived scrapes computed per target (the fill cycles through them)


@dataclass
class Source:
    """One target: its payload's shape, how its values move, and its derived scrapes."""

    name: str
    shape: Shape
    v0: np.ndarray[Any, np.dtype[np.float64]]
    dv: np.ndarray[Any, np.dtype[np.float64]]
    rng: random.Random
    derived_names: list[str]
    derived_labels: list[Labels]
    #: ``VARIANTS`` rows of derived values (and ``up``): one per scrape of a random walk.
    derived: np.ndarray[Any, np.dtype[np.float64]]
    progress: float = 0.0  # scrapes' worth of counter movement so far (raw series)
    full: tuple[list[str], list[Labels]] | None = None


def sources(targets: int) -> list[Source]:
    """Each target's shape and ``VARIANTS`` derived scrapes of it, by the collector's
    ``Deriver`` (the fill writes them in random order: each a real interval's SLIs)."""
    out = []
    for i in range(targets):
        tpl = Template(i, MODELS, GPUS)
        shape, v0 = parse_columns(tpl.render(0).decode(), None)
        _, v1 = parse_columns(tpl.render(1).decode(), shape)
        name, rng = f"triton-{i}", random.Random(i)
        models = {label_value(lbl, "model") for lbl in shape.labels} - {""}
        configs = {m: ModelConfigInfo(m, 8) for m in models}  # as serve's max_batch_size
        deriver = Deriver(name)
        deriver.derive_columns(shape, v0, T0 - INTERVAL_S * (VARIANTS + 1), configs)
        progress, rows, layout = 0.0, [], None
        for k in range(VARIANTS):
            progress += rng.uniform(0.6, 1.4)
            got = deriver.derive_columns(shape, v0 + progress * (v1 - v0),
                                         T0 - INTERVAL_S * (VARIANTS - k), configs)
            if layout is None:
                layout = ([s.name for s in got] + ["up"], [s.labels for s in got] + [()])
            assert [s.name for s in got] + ["up"] == layout[0], "derived layout changed"
            rows.append([s.value for s in got] + [1.0])
        assert layout is not None
        out.append(Source(name, shape, v0, v1 - v0, rng, *layout, np.array(rows)))
    return out


def scrape(store: Store, src: Source, ts: float, *, raw: bool) -> None:
    """One scrape of ``src`` at ``ts``: its derived series and ``up`` (one of its derived
    scrapes, at random), with ``raw`` the payload's own series too, buffered as
    ``collector.jobs`` does, and its health."""
    derived = src.derived[src.rng.randrange(VARIANTS)]
    if raw:
        src.progress += src.rng.uniform(0.6, 1.4)
        if src.full is None:
            src.full = (src.shape.names + src.derived_names,
                        src.shape.labels + src.derived_labels)
        values = np.concatenate([src.v0 + src.progress * src.dv, derived])
        store.write_columns(src.name, ts, src.full[0], src.full[1], values)
    else:
        store.write_columns(src.name, ts, src.derived_names, src.derived_labels, derived)
    store.write_health(TargetHealth(src.name, "metrics", ts, True, 0.01, len(src.v0)))


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def advance(store: Store, srcs: list[Source], clock: Clock, until: float, *, raw: bool,
            flush_every: int = 1) -> None:
    """Scrape every target each 15 s up to ``until``; flush every ``flush_every`` rounds,
    roll up each 5 min (as serve's maintenance job)."""
    rounds = 0
    while clock.now + INTERVAL_S <= until + 1e-9:
        clock.now += INTERVAL_S
        rounds += 1
        for src in srcs:
            scrape(store, src, clock.now, raw=raw)
        if rounds % flush_every == 0:
            store.flush()
        if (clock.now - T0) % ROLLUP_S < 1e-6:
            store.flush()
            store.maintenance.rollup(clock.now)
    store.flush()


@contextmanager
def backend(name: str) -> Iterator[tuple[str, int | None]]:
    """The store URL, and the PostgreSQL postmaster's pid (None for SQLite)."""
    if name == "sqlite":
        with tempfile.TemporaryDirectory() as tmp:
            yield f"sqlite:///{tmp}/alerts.db", None
        return
    import psycopg

    from tests.fixtures_pg import running_postgres

    with running_postgres() as url:
        with psycopg.connect(url, autocommit=True) as conn:
            row = conn.execute("SELECT pg_backend_pid()").fetchone()
            assert row is not None
            info = proc_stat(int(row[0]))  # a backend's parent is the postmaster
            assert info is not None
        yield url, info[0]


class _Backends:
    """CPU of the PostgreSQL client backends of the store's database (its connections), from
    /proc: the server's work for the evaluation's queries, without autovacuum, the
    checkpointer and the WAL writer, whose bursts after the fill swamp the server total."""

    def __init__(self, url: str) -> None:
        import psycopg

        self.conn = psycopg.connect(url, autocommit=True)

    def cpu(self) -> float:
        rows = self.conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE backend_type = 'client backend' "
            "AND datname = current_database() AND pid <> pg_backend_pid()").fetchall()
        total = 0.0
        for (pid,) in rows:
            st = proc_stat(int(pid))
            if st is not None:
                total += st[1] + st[2]
        return total

    def close(self) -> None:
        self.conn.close()


class TimedRule:
    """``rule`` with the process CPU of its evaluations added up (per-rule breakdown) and, while
    ``tracemalloc`` traces, the highest bytes any one evaluation allocated above what was
    allocated when it began (``peaks``: its transient, what adds to the collector's RSS while
    it runs)."""

    def __init__(self, rule: Rule, spent: dict[str, float], peaks: dict[str, int]) -> None:
        self.rule, self.spent, self.peaks = rule, spent, peaks

    def __getattr__(self, name: str) -> Any:
        return getattr(self.rule, name)

    def evaluate(self, store: Store, now: float) -> Any:
        tracing = tracemalloc.is_tracing()
        if tracing:
            tracemalloc.reset_peak()
            base = tracemalloc.get_traced_memory()[0]
        c0 = time.process_time()
        try:
            return self.rule.evaluate(store, now)
        finally:
            self.spent[self.rule.name] += time.process_time() - c0
            if tracing:
                peak = tracemalloc.get_traced_memory()[1] - base
                self.peaks[self.rule.name] = max(self.peaks.get(self.rule.name, 0), peak)


def _digest(engine: Engine, h: Any, verdicts: Any) -> None:
    for s in engine.states():
        h.update(f"{s.fingerprint} {s.status} {s.value!r}\n".encode())
        verdicts.update(f"{s.fingerprint} {s.status}\n".encode())


def _state_sizes(engine: Engine, store: Store) -> list[tuple[str, int]]:
    """Bytes each rule keeps between evaluations (caches, histories, per-group state), and the
    engine's alert states, each object counted once, for the first holder that reaches it (the
    store first: rules hold it, and it is not theirs)."""
    seen: set[int] = set()
    sizes = [("(store)", deep_size([store], seen))]
    sizes += [(r.name, deep_size([getattr(r, "rule", r)], seen)) for r in engine.rules]
    sizes.append(("(alert states)", deep_size([engine.states()], seen)))
    return sizes


def run(name: str, targets: int, hours: float, evals: int,
        profile: cProfile.Profile | None, show_sizes: bool = False,
        show_peaks: bool = False) -> None:
    with backend(name) as (url, pg_pid):
        def db_cpu() -> float:
            return process_tree_cpu(pg_pid) if pg_pid else 0.0

        watcher = _Backends(url) if pg_pid else None

        def backends_cpu() -> float:
            return watcher.cpu() if watcher is not None else 0.0

        store = open_store(url)
        store.migrations.apply()
        srcs = sources(targets)
        clock = Clock(T0)
        f0, w0 = time.process_time(), time.perf_counter()
        end = T0 + hours * 3600.0
        # Derived series only for the older history (what the rules read: 101 of a
        # target's 667 series; a fill of the whole payload took 13 min at 300 targets),
        # flushed once a minute; the payload's own series too for the last RAW_S.
        advance(store, srcs, clock, end - RAW_S, raw=False, flush_every=4)
        advance(store, srcs, clock, end, raw=True)
        fill_cpu, fill_wall = time.process_time() - f0, time.perf_counter() - w0
        config = Config.model_validate({
            "targets": [{"name": s.name, "metrics_url": f"http://127.0.0.1:1/{s.name}"}
                        for s in srcs]})
        job = AlertJob.from_config(config, store, clock=clock)
        spent: dict[str, float] = defaultdict(float)
        peaks: dict[str, int] = {}
        engine = job.engine
        engine.rules = [TimedRule(r, spent, peaks) for r in engine.rules]
        rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        digest, verdicts = hashlib.sha256(), hashlib.sha256()

        served: list[float] = []

        def one() -> tuple[float, float]:
            b0 = backends_cpu()
            c0, d0 = time.process_time(), db_cpu()
            job.evaluate()
            c1, d1 = time.process_time(), db_cpu()
            served.append(backends_cpu() - b0)
            _digest(engine, digest, verdicts)
            return c1 - c0, d1 - d0

        cold = one()
        spent.clear()
        served.clear()
        if show_peaks:
            # After the cold evaluation: its first reads of the 4 h baselines happen once.
            tracemalloc.start()
        cpu: list[float] = []
        db: list[float] = []
        for _ in range(evals):
            advance(store, srcs, clock, clock.now + EVAL_S, raw=True)
            if profile is not None:
                profile.enable()
            c, d = one()
            if profile is not None:
                profile.disable()
            cpu.append(c)
            db.append(d)
        rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        tracemalloc.stop()
        states = engine.states()
        sizes = _state_sizes(engine, store) if show_sizes else []
        store.close()
        if watcher is not None:
            watcher.close()
    total = [c + d for c, d in zip(cpu, db, strict=True)]
    print(f"{name}: {targets} targets, {hours:g} h filled in {fill_wall:.0f} s "
          f"({fill_cpu:.0f} CPU s); {len(states)} alert state(s) at the end; "
          f"answers digest {digest.hexdigest()[:16]}, verdicts digest "
          f"{verdicts.hexdigest()[:16]}")
    print(f"  cold evaluation: {cold[0] * 1e3:.0f} ms process CPU"
          + (f" + {cold[1] * 1e3:.0f} ms PostgreSQL" if pg_pid else ""))
    print(f"  per evaluation ({evals}, 30 s apart): process CPU median "
          f"{statistics.median(cpu) * 1e3:.1f} ms (min {min(cpu) * 1e3:.1f}, max "
          f"{max(cpu) * 1e3:.1f})" + (
              f"; PostgreSQL server median {statistics.median(db) * 1e3:.1f} ms (min "
              f"{min(db) * 1e3:.1f}, max {max(db) * 1e3:.1f}); both median "
              f"{statistics.median(total) * 1e3:.1f} ms" if pg_pid else ""))
    with_backends = [c + b for c, b in zip(cpu, served, strict=True)]
    if pg_pid:
        print(f"  PostgreSQL backends serving the store (client backends, not autovacuum or "
              f"the checkpointer): median {statistics.median(served) * 1e3:.1f} ms per "
              f"evaluation (min {min(served) * 1e3:.1f}, max {max(served) * 1e3:.1f}); process "
              f"+ backends median {statistics.median(with_backends) * 1e3:.1f} ms")
    print(f"  peak RSS {rss0 / 1024:.0f} MiB after the fill, {rss1 / 1024:.0f} MiB after the "
          "evaluations")
    print("  per rule (process CPU, mean per evaluation):")
    for rule, s in sorted(spent.items(), key=lambda kv: -kv[1]):
        print(f"    {rule:32} {s / evals * 1e3:8.1f} ms")
    if peaks:
        print("  highest transient of one evaluation (tracemalloc: Python and numpy "
              "allocations, not SQLite's or the driver's):")
        for rule, b in sorted(peaks.items(), key=lambda kv: -kv[1]):
            print(f"    {rule:32} {b / 2**20:8.1f} MiB")
    if sizes:
        print(f"  state kept between evaluations, {sum(b for _, b in sizes) / 2**20:.1f} MiB:")
        for rule, b in sorted(sizes, key=lambda kv: -kv[1]):
            print(f"    {rule:32} {b / 2**20:8.1f} MiB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", choices=("sqlite", "postgres", "both"), default="both")
    parser.add_argument("--targets", type=int, default=300)
    parser.add_argument("--hours", type=float, default=4.0)
    parser.add_argument("--evals", type=int, default=20)
    parser.add_argument("--profile", help="write a cProfile of the timed evaluations here")
    parser.add_argument("--sizes", action="store_true",
                        help="also print the bytes each rule keeps between evaluations")
    parser.add_argument("--peaks", action="store_true",
                        help="also print each rule's highest transient of one evaluation "
                        "(traced by tracemalloc, which slows the evaluations: the CPU figures "
                        "of such a run are not comparable)")
    args = parser.parse_args()
    profile = cProfile.Profile() if args.profile else None
    print(f"load average {os.getloadavg()[0]:.2f}, {os.cpu_count()} CPUs")
    for name in ("sqlite", "postgres") if args.backend == "both" else (args.backend,):
        run(name, args.targets, args.hours, args.evals, profile, args.sizes, args.peaks)
    if profile is not None:
        profile.dump_stats(args.profile)


if __name__ == "__main__":
    main()
