"""``tritonwatch replay`` and ``tritonwatch backtest``: the alert rules over past data.

A **recording** (written by ``tritonwatch record``, or by hand) is a directory holding:

- ``<unix-seconds>.prom``: the raw ``/metrics`` body of one scrape taken at that time;
- ``<unix-seconds>.stats.json`` (optional): the statistics API's JSON at that time;
- ``config/<model>.json`` (optional): model configs (``max_batch_size`` for the fill rate);
- ``probes.jsonl`` (optional): one probe result per line, ``{"ts", "model", "ok", "ttft_ms",
  "itl_ms", "e2e_ms"}`` (``tokens``, ``error_kind``, ``probe`` optional).  ``ok`` is a JSON
  boolean, the latencies numbers (milliseconds) or null, ``probe`` a probe name
  (``[A-Za-z0-9_.:-]``; default: the model name with other characters as ``_``).  A line that
  is not so is a ``ReplayError`` naming the file and line.

``replay`` runs the live pipeline over it in simulated time, as fast as it can: parse →
derive (one ``Deriver`` per recording, so rates come from consecutive scrapes exactly as live)
→ a throwaway store (SQLite without journal or fsync for its relational state, the time
series in this process's memory, ``store.memory``: it is deleted at the end, so nothing in it
has to survive a crash, and a read costs what its window holds, not a statement and a
decode of the stored history) → ``Engine.evaluate`` at every scrape time (or every
``eval_interval`` of simulated time); probe lines stamped after the last scrape are evaluated
at their own times after it, so none is left out.  Probe lines become the series
``collector/probes/sink.py`` writes (``probe:ttft_seconds``, ``probe:slo_good``/
``probe:slo_total``, ...; one run per ``(ts, model)``) plus ``probe_results`` rows.

``backtest`` evaluates the rules over a store's history instead, without writing alert state;
what the rules read is read from the store once per name and 6-hour span and held in memory
(``Store.held``), so a step costs what the replay's does.

Both answer the alerts that would have fired: ``alertname``, ``labels``, ``fired_at`` and
``resolved_at`` (None while still firing at the end), in unix seconds.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import re
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from itertools import pairwise
from pathlib import Path
from typing import Any, NamedTuple, cast

from pydantic import ValidationError

from tritonwatch.alerts.engine import Engine
from tritonwatch.alerts.model import Rule
from tritonwatch.collector.derive import Deriver
from tritonwatch.collector.parse import ParseError, parse
from tritonwatch.collector.probes.sink import run_samples
from tritonwatch.collector.triton import parse_model_config, stats_families
from tritonwatch.schemas.alerts import AlertEvent
from tritonwatch.schemas.probes import ERROR_KINDS, ErrorKind, ProbeConfig, ProbeResult
from tritonwatch.schemas.samples import MetricFamily, Sample, Snapshot
from tritonwatch.schemas.triton import ModelConfigInfo
from tritonwatch.store import Store, open_store
from tritonwatch.store.memory import MemorySeries

log = logging.getLogger(__name__)

#: The ``target`` of every series of a replayed recording (``--target`` changes it).
DEFAULT_TARGET = "replay"

_STATS_SUFFIX = ".stats.json"
_PROM_SUFFIX = ".prom"


class ReplayError(ValueError):
    """The recording directory cannot be replayed (missing, empty, malformed probes.jsonl)."""


class FiredAlert(NamedTuple):
    alertname: str
    labels: dict[str, str]
    fired_at: float
    resolved_at: float | None

    def as_json(self) -> dict[str, Any]:
        return {
            "alertname": self.alertname,
            "labels": self.labels,
            "fired_at": self.fired_at,
            "resolved_at": self.resolved_at,
        }


class Outcome(NamedTuple):
    alerts: list[FiredAlert]
    start: float | None
    end: float | None
    evaluations: int
    scrapes: int
    rule_failures: dict[str, int]


class Scrape(NamedTuple):
    ts: float
    prom: Path | None
    stats: Path | None


class Recording(NamedTuple):
    directory: Path
    scrapes: list[Scrape]
    configs: dict[str, dict[str, Any]]
    probes: list[dict[str, Any]]  # sorted by ts


def _stamp(name: str, suffix: str) -> float | None:
    try:
        ts = float(name[: -len(suffix)])
    except ValueError:
        return None
    return ts if math.isfinite(ts) else None


def load_recording(directory: str | Path) -> Recording:
    """Index a recording directory (see the module docstring); raises ReplayError."""
    root = Path(directory)
    if not root.is_dir():
        raise ReplayError(f"{root}: not a directory")
    proms: dict[float, Path] = {}
    stats: dict[float, Path] = {}
    for path in root.iterdir():
        if not path.is_file():
            continue
        name = path.name
        suffix = _STATS_SUFFIX if name.endswith(_STATS_SUFFIX) else (
            _PROM_SUFFIX if name.endswith(_PROM_SUFFIX) else None)
        if suffix is None:
            continue
        ts = _stamp(name, suffix)
        if ts is None:
            log.warning("replay: %s: name is not <unix-seconds>%s; skipped", path, suffix)
            continue
        (stats if suffix == _STATS_SUFFIX else proms)[ts] = path
    scrapes = [Scrape(ts, proms.get(ts), stats.get(ts)) for ts in sorted(proms.keys() | stats)]
    configs: dict[str, dict[str, Any]] = {}
    config_dir = root / "config"
    if config_dir.is_dir():
        for path in sorted(config_dir.glob("*.json")):
            try:
                raw = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError) as exc:
                raise ReplayError(f"{path}: not a model config: {exc}") from None
            if not isinstance(raw, dict):
                raise ReplayError(f"{path}: not a model config (expected a JSON object)")
            configs[path.stem] = dict(raw.get("config", raw))
    probes = _load_probes(root / "probes.jsonl")
    if not scrapes and not probes:
        raise ReplayError(f"{root}: no <unix-seconds>.prom, .stats.json or probes.jsonl found")
    return Recording(root, scrapes, configs, probes)


def _number(item: Mapping[str, Any], key: str, *, required: bool = False) -> float | None:
    value = item.get(key)
    if value is None:
        if required:
            raise ValueError(f"{key!r} is required (a number)")
        return None
    # bool is an int in Python: true/false are not numbers here.
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{key!r} must be a finite number, got {value!r}")
    return float(value)


def _probe_line(item: Any) -> dict[str, Any]:
    """One probes.jsonl object, checked and normalised; ValueError says what is wrong."""
    if not isinstance(item, dict):
        raise ValueError("expected a JSON object")
    if "model" not in item:
        raise ValueError("'model' is missing")
    if "ok" not in item:
        raise ValueError("'ok' is missing")
    if not isinstance(item["ok"], bool):
        # "false" (a string) is truthy: refuse rather than count a failure as a success.
        raise ValueError(f"'ok' must be true or false, got {item['ok']!r}")
    item["ts"] = _number(item, "ts", required=True)
    item["model"] = str(item["model"])
    for key in ("ttft_ms", "itl_ms", "e2e_ms"):
        _number(item, key)
    tokens = item.get("tokens")
    if tokens is not None and (isinstance(tokens, bool) or not isinstance(tokens, int)
                               or tokens < 0):
        raise ValueError(f"'tokens' must be a non-negative integer, got {tokens!r}")
    probe = item.get("probe")
    if probe is not None and not isinstance(probe, str):
        raise ValueError(f"'probe' must be a string, got {probe!r}")
    # The probe name and model as the live probe's config would take them.
    name = probe or _probe_name(item["model"])
    try:
        ProbeConfig(name=name, target=DEFAULT_TARGET, model=item["model"])
    except ValidationError as exc:
        fields = {"name": f"'probe' {name!r}", "model": f"'model' {item['model']!r}"}
        raise ValueError("; ".join(
            f"{fields.get('.'.join(map(str, e['loc'])), 'line')}: {e['msg']}"
            for e in exc.errors()
        )) from None
    return item


def _load_probes(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    lines = []
    with path.open(encoding="utf-8") as f:
        for no, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                item = _probe_line(json.loads(line))
            except ValueError as exc:
                raise ReplayError(f"{path}:{no}: bad probe line ({exc!s}): {line.strip()[:200]}")\
                    from None
            lines.append(item)
    lines.sort(key=lambda item: float(item["ts"]))
    return lines


def _seconds(item: Mapping[str, Any], key: str) -> float | None:
    value = item.get(key)
    return None if value is None else float(value) / 1000


def _probe_name(model: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.:\-]", "_", model)[:200] or "probe"


def probe_run(
    items: Sequence[Mapping[str, Any]], *, target: str, ttft_slo: float | None,
    itl_slo: float | None,
) -> tuple[list[ProbeResult], list[Sample]]:
    """One probe run (lines of one model at one ts): results and the sink's series."""
    model = str(items[0]["model"])
    name = str(items[0].get("probe") or _probe_name(model))
    config = ProbeConfig(name=name, target=target, model=model, ttft_slo=ttft_slo,
                         itl_slo=itl_slo)
    results = []
    for item in items:
        ok = bool(item["ok"])
        kind = item.get("error_kind")
        error_kind: ErrorKind | None = None
        if not ok:
            error_kind = cast(ErrorKind, kind) if kind in ERROR_KINDS else "server_error"
        results.append(ProbeResult(
            probe=name, target=target, model=model, protocol=config.protocol,
            ts=float(item["ts"]), ok=ok, tokens=int(item.get("tokens") or 0),
            ttft_s=_seconds(item, "ttft_ms") if ok else None,
            itl_s=_seconds(item, "itl_ms") if ok else None,
            e2e_s=_seconds(item, "e2e_ms") if ok else None,
            error_kind=error_kind,
        ))
    return results, run_samples(config, results)


def _up(up: bool, samples: int) -> list[Sample]:
    # The synthetic series the live collector writes per scrape (collector/jobs.py).
    return [
        Sample("up", (), 1.0 if up else 0.0),
        Sample("scrape_duration_seconds", (), 0.0),
        Sample("scrape_samples_scraped", (), float(samples)),
    ]


def collect(events: Iterable[AlertEvent]) -> list[FiredAlert]:
    """Alert instances from the engine's transitions, ordered by firing time."""
    fired: list[FiredAlert] = []
    open_: dict[str, int] = {}
    for event in events:
        if event.status == "firing":
            labels = dict(event.labels)
            open_[event.fingerprint] = len(fired)
            fired.append(FiredAlert(labels.get("alertname", ""), labels, event.starts_at, None))
        elif event.fingerprint in open_:
            i = open_.pop(event.fingerprint)
            fired[i] = fired[i]._replace(resolved_at=event.ends_at)
    fired.sort(key=lambda a: (a.fired_at, a.alertname, sorted(a.labels.items())))
    return fired


class _Replayer:
    def __init__(self, recording: Recording, store: Store, *, target: str,
                 ttft_slo: float | None, itl_slo: float | None) -> None:
        self.rec = recording
        self.store = store
        self.target = target
        self.ttft_slo = ttft_slo
        self.itl_slo = itl_slo
        self.deriver = Deriver(target)
        self.configs: dict[str, ModelConfigInfo] = {
            model: parse_model_config(raw) for model, raw in recording.configs.items()
        }
        self.next_scrape = 0
        self.next_probe = 0

    def ingest_until(self, now: float) -> int:
        """Write every scrape and probe line stamped at or before ``now``; returns scrapes."""
        done = 0
        scrapes = self.rec.scrapes
        while self.next_scrape < len(scrapes) and scrapes[self.next_scrape].ts <= now:
            self._scrape(scrapes[self.next_scrape])
            self.next_scrape += 1
            done += 1
        probes = self.rec.probes
        start = self.next_probe
        while self.next_probe < len(probes) and probes[self.next_probe]["ts"] <= now:
            self.next_probe += 1
        runs: dict[tuple[float, str], list[dict[str, Any]]] = {}
        for item in probes[start:self.next_probe]:
            runs.setdefault((item["ts"], item["model"]), []).append(item)
        for (ts, _), items in runs.items():
            results, samples = probe_run(items, target=self.target, ttft_slo=self.ttft_slo,
                                         itl_slo=self.itl_slo)
            self.store.write_probe_results(results)
            self.store.write(self.target, ts, samples)
        return done

    def _scrape(self, scrape: Scrape) -> None:
        families: list[MetricFamily] = []
        up = True
        if scrape.prom is not None:
            try:
                families = parse(scrape.prom.read_bytes())
            except ParseError as exc:
                log.warning("replay: %s: unparsable, counted as a failed scrape: %s",
                            scrape.prom, exc)
                up = False
        raw_count = sum(len(f.samples) for f in families)
        if scrape.stats is not None:
            try:
                stats = json.loads(scrape.stats.read_text(encoding="utf-8"))
                families.extend(stats_families(stats))
            except (ValueError, TypeError, AttributeError) as exc:
                log.warning("replay: %s: unreadable statistics, skipped: %s", scrape.stats, exc)
        snap = Snapshot(self.target, scrape.ts, tuple(families))
        raw = list(snap.samples())
        derived = self.deriver.derive(snap, self.configs)
        samples = raw + derived
        if scrape.prom is not None:
            samples += _up(up, raw_count)
        self.store.write(self.target, scrape.ts, samples)


def replay(
    directory: str | Path,
    rules: Sequence[Rule],
    *,
    target: str = DEFAULT_TARGET,
    eval_interval: float | None = None,
    ttft_slo: float | None = None,
    itl_slo: float | None = None,
    scratch: bool = True,
    memory: bool = True,
    progress: Callable[[int, int], None] | None = None,
) -> Outcome:
    """Replay a recording through ``rules`` (see the module docstring).

    ``scratch``: the throwaway store has no journal and no fsync (it is deleted at the end
    whatever happens; ``False`` gives the live store's WAL and fsyncs, same results, slower).
    ``memory``: its time series are held in memory (``store.memory``) rather than in SQLite
    tables; same results, much faster (``False`` reads them back through SQL as ``serve``
    does).
    ``progress(done, total)`` is called after each evaluation."""
    try:  # the SLOs the probe runs are judged against, checked as the live probe's config is
        ProbeConfig(name="replay", model="replay", target=target, ttft_slo=ttft_slo,
                    itl_slo=itl_slo)
    except ValidationError as exc:
        raise ReplayError("; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}"
                                    for e in exc.errors())) from None
    recording = load_recording(directory)
    times = [s.ts for s in recording.scrapes]
    # Probe lines after the last scrape (or all of them, without scrapes) are evaluated at
    # their own times: otherwise nothing would ever ingest them.
    times += sorted({p["ts"] for p in recording.probes if not times or p["ts"] > times[-1]})
    start, end = times[0], times[-1]
    if eval_interval is not None:
        if not eval_interval > 0:
            raise ReplayError(f"eval interval must be positive, got {eval_interval!r}")
        steps = math.floor((end - start) / eval_interval + 1e-9)
        times = [start + i * eval_interval for i in range(steps + 1)]
    with tempfile.TemporaryDirectory(prefix="tritonwatch-replay-") as tmp:
        series = MemorySeries() if memory else None
        store = open_store(f"sqlite:///{tmp}/replay.db", batch_rows=1_000_000,
                           scratch=scratch, timeseries=series, sink=series)
        try:
            store.migrations.apply()
            for model, raw in recording.configs.items():
                store.put_model_config(target, model, raw, start)
            engine = Engine(
                rules, store, persist=False, clock=lambda: start,
                eval_interval=eval_interval or _typical_gap(times),
            )
            replayer = _Replayer(recording, store, target=target, ttft_slo=ttft_slo,
                                 itl_slo=itl_slo)
            events: list[AlertEvent] = []
            scrapes = 0
            for i, now in enumerate(times, 1):
                scrapes += replayer.ingest_until(now)
                store.flush()
                events += engine.evaluate(now)
                if progress is not None:
                    progress(i, len(times))
            return Outcome(collect(events), start, end, len(times), scrapes,
                           dict(engine.failures))
        finally:
            store.close()


def backtest(
    store: Store, rules: Sequence[Rule], *, start: float, end: float, step: float,
    progress: Callable[[int, int], None] | None = None, held: bool = True,
) -> Outcome:
    """Evaluate ``rules`` every ``step`` seconds over ``[start, end]`` of ``store``'s history,
    without reading or writing alert state; ``progress(done, total)`` after each step.

    ``held``: the samples the rules read are read from the store once (in 6-hour spans) and
    held in memory (``Store.held``), same results, faster; ``False`` reads every window from
    the store at every step."""
    if not step > 0:
        raise ReplayError(f"step must be positive, got {step!r}")
    if end < start:
        raise ReplayError(f"--from ({start}) is after --to ({end})")
    engine = Engine(rules, store, eval_interval=step, persist=False, clock=lambda: start)
    events: list[AlertEvent] = []
    n = math.floor((end - start) / step + 1e-9) + 1
    with store.held() if held else contextlib.nullcontext():
        for i in range(n):
            events += engine.evaluate(start + i * step)
            if progress is not None:
                progress(i + 1, n)
    return Outcome(collect(events), start, end, n, 0, dict(engine.failures))


def _typical_gap(times: Sequence[float]) -> float:
    gaps = sorted(b - a for a, b in pairwise(times) if b > a)
    return gaps[len(gaps) // 2] if gaps else 15.0



def recordings_in(paths: Sequence[str | Path]) -> list[tuple[Path, str | None]]:
    """The recordings ``paths`` name, each with its target name: a path holding scrapes or
    probes.jsonl is one recording (target: None, the caller's); a directory without any whose
    subdirectories are recordings is a fleet, one target per subdirectory, named after it."""
    out: list[tuple[Path, str | None]] = []
    for raw in paths:
        root = Path(raw)
        if not root.is_dir():
            raise ReplayError(f"{root}: not a directory")
        own = any(p.suffix in (".prom", ".json") or p.name == "probes.jsonl"
                  for p in root.iterdir() if p.is_file())
        subs = sorted(p for p in root.iterdir() if p.is_dir() and p.name != "config")
        if own or not subs:
            out.append((root, None))
        else:
            out.extend((sub, sub.name) for sub in subs)
    return out
