"""One target's collector-side state: its deriver, shape, last scrape, configs and labels.

Everything a target's jobs (scrape, statistics API, GPU join) keep between runs lives here;
the jobs themselves are in :mod:`collector.jobs`.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from tritonwatch.collector.derive import Deriver
from tritonwatch.collector.gpu import EMPTY_PLAN, TritonGpuPlan, TritonReading
from tritonwatch.collector.limits import check_shape
from tritonwatch.collector.shape import Shape, Values
from tritonwatch.collector.triton import TritonApi
from tritonwatch.schemas.config import Config, ScrapeLimits, TargetConfig
from tritonwatch.schemas.samples import Labels, Sample
from tritonwatch.schemas.triton import ModelConfigInfo

#: The shortest ``max_gap_s`` a target's deriver gets (seconds).
MIN_MAX_GAP_S = 300.0
#: How many scheduled reads a counter baseline may miss and still give a rate.
MAX_GAP_INTERVALS = 4.0


def deriver_max_gap(scrape_interval: float, api_interval: float | None = None) -> float:
    """``max_gap_s`` for a target read every ``scrape_interval`` (and ``api_interval``).

    A baseline is too old for a rate only after several missed reads of the slowest source, so
    a target scraped every 5 minutes still gets rates (a fixed 300 s never would).
    """
    slowest = max(scrape_interval, api_interval or 0.0)
    return max(MIN_MAX_GAP_S, MAX_GAP_INTERVALS * slowest)


def with_target_labels(samples: Iterable[Sample], extra: Mapping[str, str]) -> list[Sample]:
    return [Sample(s.name, add_labels(s.labels, extra), s.value) for s in samples]


def add_labels(labels: Labels, extra: Mapping[str, str]) -> Labels:
    # Labels the exposition already carries win over configured target labels, so a
    # configured `model` label can never hide the model that Triton reported.
    names = {k for k, _ in labels}
    add = tuple((k, v) for k, v in extra.items() if k not in names)
    return tuple(sorted(labels + add)) if add else labels


class TargetState:
    def __init__(self, target: TargetConfig, config: Config | None = None) -> None:
        self.config = target
        self.limits: ScrapeLimits = (config or Config()).limits_for(target)
        # The last shape checked against the label and sample limits, and what it broke: a
        # shape's structure never changes, so an unchanged payload is not checked again.
        self._limit_check: tuple[Shape, str | None] | None = None
        has_api = bool(target.http_url or target.grpc_url)
        if config is not None:
            scrape_interval = config.interval_for(target)
            api_interval = config.scrape.api_interval if has_api else None
        else:  # no global config: only the target's own interval is known
            scrape_interval, api_interval = target.scrape_interval or 0.0, None
        self.deriver = Deriver(
            target.name, max_gap_s=deriver_max_gap(scrape_interval, api_interval)
        )
        # The scrape and the API job of this target derive in worker threads; the deriver is
        # not thread-safe, so they take turns.
        self.derive_lock = threading.Lock()
        overrides = {
            model: ModelConfigInfo(name=model, max_batch_size=size)
            for model, size in target.max_batch_size.items()
        }
        self.overrides = overrides
        self.configs: dict[str, ModelConfigInfo] = dict(overrides)
        self.api = (
            TritonApi(target.name, http_url=target.http_url, grpc_url=target.grpc_url,
                      headers=target.headers, expected_models=target.expected_models)
            if target.http_url or target.grpc_url else None
        )
        # The shape the next payload is read against (collector.shape).
        self.shape: Shape | None = None
        # The last good scrape, column-wise (no per-sample objects kept), as one attribute:
        # the GPU join reads it in one worker thread while a scrape may be replacing it in
        # another.
        # Its derived SLIs travel in the same tuple, so the join never pairs one scrape's values
        # with another's SLIs.
        # The derived SLIs are a window over the lists and the array handed to the store
        # (SampleWindow), or a list.
        self.last_scrape: tuple[Shape, Values, Sequence[Sample]] | None = None
        # derived_series()'s last answer: the derived series' names and own labels (without the
        # target's labels), kept while equal.
        self._derived: tuple[list[str], list[Labels]] = ([], [])
        # What the GPU join reads from a payload of the shape, found once per shape (only the
        # nvml job, one run at a time, touches it).
        self._gpu_plan: tuple[Shape | None, TritonGpuPlan] = (None, EMPTY_PLAN)
        # The shape's label tuples with the target's labels added, built once per shape.
        self._labeled: tuple[Shape | None, list[Labels]] = (None, [])
        # stored_series()'s last answer: (shape, names, labels); the derived names and labels
        # are their tail (not kept twice).
        self._stored: tuple[Shape, list[str], list[Labels]] | None = None
        # Model configs as last written to the store: only changed ones are written again.
        self.written_configs: dict[str, dict[str, Any]] = {}

    @property
    def latest(self) -> list[Sample]:
        """The derived SLIs of the last successful scrape (built on demand), for display."""
        last = self.last_scrape
        return [] if last is None else list(last[2])

    def derived_series(self, names: list[str], labels: list[Labels]
                       ) -> tuple[list[str], list[Labels]]:
        """``(names, labels)``, or the equal lists of the last call (one pair kept per
        target, not one per scrape)."""
        if (names, labels) != self._derived:
            self._derived = (names, labels)
        return self._derived

    @property
    def latest_raw(self) -> list[Sample]:
        """The raw samples of the last successful scrape, built on demand: one object per
        series, so not for anything that runs every interval (the GPU join uses
        ``gpu_reading``)."""
        last = self.last_scrape
        if last is None:
            return []  # never scraped, or down since (forget_scrape)
        shape, values, _ = last
        return shape.samples(values)

    def gpu_reading(self) -> TritonReading:
        """The last successful scrape as the GPU join reads it: its values, through a plan
        built once per shape, and its derived SLIs.  Empty while there is none."""
        last = self.last_scrape  # read once: a scrape may replace it meanwhile
        if last is None:
            return TritonReading(EMPTY_PLAN, np.empty(0, np.float64), [])
        shape, values, derived = last
        cached, plan = self._gpu_plan
        if cached is not shape:  # a new structure: the old plan (and shape) is dropped
            plan = TritonGpuPlan(shape.names, shape.labels)
            self._gpu_plan = (shape, plan)
        return TritonReading(plan, values, derived)

    def limit_violation(self, shape: Shape) -> str | None:
        """Why ``shape`` breaks the target's limits, or None (checked once per shape)."""
        checked = self._limit_check
        if checked is not None and checked[0] is shape:
            return checked[1]
        reason = check_shape(shape, self.limits)
        self._limit_check = (shape, reason)
        return reason

    def forget_scrape(self) -> None:
        """The target is down: its last scrape no longer describes it."""
        self.last_scrape = None
        # The shape stays: when the target comes back, its first payload can still match it.

    def shape_labels(self, shape: Shape) -> list[Labels]:
        """The label tuples to store for ``shape``'s series (with the target's labels)."""
        extra = self.config.labels
        if not extra:
            return shape.labels
        cached_shape, labeled = self._labeled
        if cached_shape is not shape:
            labeled = [add_labels(labels, extra) for labels in shape.labels]
            self._labeled = (shape, labeled)
        return labeled

    def stored_series(
        self, shape: Shape, names: list[str], labels: list[Labels]
    ) -> tuple[list[str], list[Labels]]:
        """The name and label lists to store: ``shape``'s series, then ``names``/``labels``
        (the derived ones).

        The same list objects as the last scrape's while nothing changed, so that the buffer
        holds one copy per target rather than one per buffered scrape, and the store
        recognises the unchanged layout by identity.
        """
        cached = self._stored
        if cached is not None and cached[0] is shape:
            _, stored_names, stored_labels = cached
            n = len(shape)
            if (len(stored_names) == n + len(names) and stored_names[n:] == names
                    and stored_labels[n:] == labels):
                return stored_names, stored_labels
        stored_names, stored_labels = shape.names + names, self.shape_labels(shape) + labels
        self._stored = (shape, stored_names, stored_labels)
        return stored_names, stored_labels

    def set_configs(self, configs: Mapping[str, ModelConfigInfo]) -> None:
        merged = dict(configs)
        merged.update(self.overrides)  # an explicit max_batch_size in the config file wins
        self.configs = merged
