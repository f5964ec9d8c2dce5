"""A day of realistic Triton samples as columns, for ``bench.storage`` and the codec tests.

The series and their shapes come from ``tests.payloads.triton_payload`` (counters, gauges,
summaries with NaN quantiles while idle, the TTFT histogram, TRT-LLM gauges), one payload per
scrape so gauges change every scrape.  On top of it, what real servers do and the generator
does not:

* traffic varies: a counter's increase per scrape is its generated rate times a daily cycle
  and per-scrape noise (a Poisson-like integer for integral counters), not a constant;
* scrape timestamps jitter by a few milliseconds around the interval, as a scraper's do;
* the server restarts once (counters start again from zero, gauges go on);
* one model is unloaded for two hours (its series absent: a Prometheus scraper writes stale
  markers, tritonwatch writes nothing).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from tests.payloads import triton_payload

DAY_MS = 86_400_000


@dataclass
class Day:
    """``values[k, j]``: series ``j`` at scrape ``k`` (NaN: absent or NaN).  ``present[k, j]``
    says whether the series was exposed at all (False while its model was unloaded)."""

    name: str
    interval_s: int
    keys: list[tuple[str, dict[str, str]]]  # (name, labels) per series
    types: list[str]  # counter, gauge, summary, histogram (the family's TYPE)
    ts_ms: npt.NDArray[np.int64]
    values: npt.NDArray[np.float64]
    present: npt.NDArray[np.bool_]

    @property
    def samples(self) -> int:
        """Samples exposed (NaN values included, absent series not)."""
        return int(self.present.sum())

    @property
    def stored_samples(self) -> int:
        """Samples a store that skips NaN keeps (tritonwatch)."""
        return int((self.present & ~np.isnan(self.values)).sum())


def _parse(text: str) -> tuple[list[str], list[str], list[float]]:
    heads, types, values = [], [], []
    typ = "untyped"
    for line in text.splitlines():
        if not line:
            continue
        if line[0] == "#":
            if line.startswith("# TYPE "):
                typ = line.rsplit(" ", 1)[1]
            continue
        head, _, value = line.rpartition(" ")
        heads.append(head)
        types.append(typ)
        values.append(float(value))
    return heads, types, values


def _labels(head: str) -> tuple[str, dict[str, str]]:
    name, _, rest = head.partition("{")
    labels: dict[str, str] = {}
    for part in rest.rstrip("}").split('",') if rest else []:
        k, _, v = part.partition('="')
        labels[k] = v.rstrip('"')
    return name, labels


def _is_cumulative(head: str, typ: str) -> bool:
    if typ == "counter":
        return True
    if typ in ("summary", "histogram"):
        return "quantile=" not in head
    return False


def make_day(
    name: str, *, models: int, gpus: int, trtllm: bool, interval_s: int, seed: int,
    start_ms: int, hours: float = 24.0,
) -> Day:
    """``hours`` of scrapes of one simulated server from ``start_ms``."""
    steps = int(hours * 3600 / interval_s)
    rng = np.random.default_rng(seed)
    first = _parse(triton_payload(models=models, gpus=gpus, trtllm=trtllm, seed=seed, step=0))
    heads, types = first[0], first[1]
    index = {h: j for j, h in enumerate(heads)}
    n = len(heads)
    raw = np.full((steps, n), np.nan)
    for k in range(steps):
        hs, _, vs = _parse(triton_payload(models=models, gpus=gpus, trtllm=trtllm, seed=seed,
                                          step=k))
        for h, v in zip(hs, vs, strict=True):
            raw[k, index[h]] = v
    cumulative = np.array([_is_cumulative(h, t) for h, t in zip(heads, types, strict=True)])
    with np.errstate(invalid="ignore"):
        integral = (raw[0] == np.floor(raw[0])) | np.isnan(raw[0])
    values = raw.copy()
    # Counters: the generated per-scrape rate, times a daily cycle and noise.
    rate = np.nan_to_num(raw[1] - raw[0]) if steps > 1 else np.zeros(n)
    hour = (np.arange(steps) * interval_s / 3600.0 + 9.0) % 24
    cycle = 0.35 + 0.65 * np.clip(np.sin((hour - 6) / 24 * 2 * math.pi) + 0.3, 0, None)
    mean = cycle[:, None] * rate[None, :]
    inc = np.where(integral, rng.poisson(np.clip(mean, 0, None)).astype(np.float64),
                   mean * rng.uniform(0.8, 1.2, size=mean.shape))
    restart = steps * 13 // 24
    inc[restart] = 0.0
    level = np.cumsum(inc, axis=0)
    base = np.where(np.isnan(raw[0]), 0.0, raw[0])
    level[:restart] += base
    level[restart:] -= level[restart]  # the restart: counters from zero again
    values[:, cumulative] = level[:, cumulative]
    # Histogram buckets and summary sums/counts keep their structure: derived from the
    # generated ratios of each to its count would be more faithful, but the codecs only see
    # one series at a time, and each is a counter with a realistic increase pattern.
    present = np.ones((steps, n), bool)
    unloaded = f'model="{_labels(heads[0])[1].get("model", "")}"'
    gone = [j for j, h in enumerate(heads) if unloaded in h]
    lo, hi = steps * 4 // 24, steps * 6 // 24
    present[lo:hi, gone] = False
    values[~present] = np.nan
    jitter = rng.integers(-8, 9, size=steps)
    ts = start_ms + np.arange(steps, dtype=np.int64) * interval_s * 1000 + jitter
    return Day(name, interval_s, [_labels(h) for h in heads], types, ts, values, present)


def small_day(start_ms: int, hours: float = 24.0) -> Day:
    """A 116-series target scraped every 30 s (2 models, 1 GPU)."""
    return make_day("116 series @ 30 s", models=2, gpus=1, trtllm=False, interval_s=30, seed=3,
                    start_ms=start_ms, hours=hours)


def fleet_day(start_ms: int, hours: float = 24.0) -> Day:
    """A 566-series target scraped every 15 s (the fleet benchmark's shape: 7 models, 2 GPUs,
    TRT-LLM)."""
    return make_day("566 series @ 15 s", models=7, gpus=2, trtllm=True, interval_s=15, seed=5,
                    start_ms=start_ms, hours=hours)
