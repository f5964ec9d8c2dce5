"""Regression rules and the built-in defaults switch, as they appear in the rules file.  No I/O.

A regression rule compares a **recent window** of one series with what a **baseline** expects
at the recent load (a model of the series against ``load_series``, fitted on the baseline) and
fires when the series moved in the bad ``direction`` by at least ``min_effect`` (relative)
*and* the move is statistically clear (robust z of the recent residual against the baseline's
residuals and their MAD at least ``z_threshold``, Mann-Whitney p at most ``alpha``).  The
detectors live in ``alerts/detect.py``.

Example (YAML)::

    regressions:
      - name: fill_rate_drop
        series: sli:batch_fill_rate
        match: {model: resnet}
        direction: down
        baseline: week_ago          # falls back to trailing without week-old history
        recent_window: 15m
        baseline_window: 4h
        min_effect: 0.2
        for: 5m
        keep_firing_for: 10m

    defaults:
      enabled: true
      disable: [gpu_idle_while_queued]
      overrides:
        kv_cache_saturation: {threshold: 0.95, for: 15m}
"""

from __future__ import annotations

from typing import Literal

from pydantic import (
    Field,
    field_validator,
    model_validator,
)

from tritonwatch.schemas.values import Duration, FrozenAliased, PositiveDuration

#: Names of the built-in rules of ``alerts/defaults.py`` (what ``disable`` and ``overrides``
#: may name).  Kept here so that the rules file is validated without importing the engine.
DEFAULT_RULE_NAMES: tuple[str, ...] = (
    "batch_fill_rate_regression",
    "kv_cache_saturation",
    "kv_cache_exhaustion_forecast",
    "kv_cache_regression",
    "gpu_utilization_regression",
    "gpu_efficiency_regression",
    "gpu_idle_while_queued",
    "ttft_regression",
    "itl_regression",
    "failure_ratio_spike",
    "target_down",
)

_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_.:\-]*$"

#: ``min_effect`` of the built-in regression rules (``alerts/defaults.py`` builds them from
#: this): three quarters of the smallest regression they are to catch (20 %), so that noise in
#: the recent median (a few per cent) does not hide one that size.
BUILTIN_REGRESSIONS: dict[str, float] = {
    "batch_fill_rate_regression": 0.15,
    "kv_cache_regression": 0.15,
    "gpu_utilization_regression": 0.15,
    "gpu_efficiency_regression": 0.15,
    "ttft_regression": 0.15,
    "itl_regression": 0.15,
}


def _unknown(name: str) -> str:
    return f"unknown built-in rule {name!r}; known: {', '.join(DEFAULT_RULE_NAMES)}"


class RegressionSpec(FrozenAliased):
    """A regression rule: a series that moved against its baseline at comparable load."""

    name: str = Field(min_length=1, max_length=200, pattern=_NAME_PATTERN)
    """Unique rule name; the ``rule`` label, and the ``alertname`` unless ``labels`` sets one."""
    series: str = Field(min_length=1)
    """The series to watch, e.g. ``sli:batch_fill_rate`` or ``probe:ttft_seconds``."""
    match: dict[str, str] = Field(default_factory=dict)
    """Label equality filter on the series (``""`` matches an absent label)."""
    by: tuple[str, ...] = ("model", "version")
    """Labels that, with the target, identify one alert instance; series that share them (e.g.
    one per ``gpu_uuid``) are averaged together."""
    direction: Literal["up", "down"]
    """The bad direction: ``up`` for latency, ``down`` for fill rate or utilization."""
    baseline: Literal["trailing", "week_ago"] = "trailing"
    """``trailing``: the ``baseline_window`` just before the recent window.  ``week_ago``: the
    same hours one week earlier (recent window ± half the baseline window); falls back to
    ``trailing`` when there is no week-old history."""
    recent_window: PositiveDuration = 900.0
    """How much recent data is judged (default 15 m)."""
    baseline_window: PositiveDuration = 4 * 3600.0
    """How much data makes the baseline (default 4 h)."""
    step: PositiveDuration = 60.0
    """Points are first averaged into buckets of this size (default 1 m), which tames scrape
    noise and autocorrelation; statistics are computed over the bucket values."""
    min_effect: float = Field(default=0.2, gt=0)
    """Minimum relative change of the median (0.2 = 20 %) in the bad direction."""
    z_threshold: float = Field(default=4.0, gt=0)
    """Minimum robust z: (recent median - baseline median) / standard error of the recent
    median, with sigma = 1.4826 * MAD of the baseline."""
    alpha: float = Field(default=1e-3, gt=0, lt=1)
    """Largest one-sided Mann-Whitney U p-value (recent buckets vs baseline buckets)."""
    min_points: int = Field(default=5, ge=3)
    """Fewer bucket values than this in either window: no verdict."""
    min_baseline: float = Field(default=0.0, ge=0)
    """Skip when the baseline median (absolute) is at or below this (e.g. near-zero series)."""
    load_series: str | tuple[str, ...] | None = ("sli:request_rate", "sli:failure_rate")
    """Series measuring load for the same target and model (a name or a list of names, summed
    over all their series): the baseline's model of ``series`` against it predicts the series
    at the recent load; ``null``: no model, the recent median is compared with the baseline's
    as they are.  The default is every request that arrived, successes and failures alike: a
    failed request also took a queue slot, KV-cache blocks and GPU time, so successes alone
    under-count load exactly when failures spike, and a KV cache or GPU then looks busier
    "per request" than it is."""
    load_fallback: str | tuple[str, ...] | None = None
    """The load to model against instead, for an instance whose ``load_series`` has no data in
    either window (a model whose server does not export it): e.g. the built-in KV-cache rule
    models against requests in flight (TensorRT-LLM's active requests) and falls back to the
    request rate for a backend without that gauge.  The annotations say which one a verdict
    used; ``null``: no fallback (such an instance is judged without a load model)."""
    elasticity: tuple[float, float] | None = None
    """The range the load response may take: the slope of log ``series`` on log load (0: does
    not follow load; 1: proportional to it).  The fitted slope and its confidence interval
    are clipped to it; ``null``: unbounded (the interval alone decides how far the model may
    extrapolate)."""
    load_tolerance: float | None = Field(default=None, gt=0)
    """Deprecated and ignored: the load model replaced the comparable-load guard.  Accepted so
    that older rules files still load."""
    related: tuple[str, ...] | None = None
    """Series of the same model quoted in the annotations ("what moved with it"); ``null``
    picks a set that suits ``series``."""
    for_s: Duration = Field(default=300.0, alias="for")
    """The condition must hold this long before the alert fires."""
    keep_firing_for_s: Duration = Field(default=600.0, alias="keep_firing_for")
    """The alert keeps firing this long after the condition was last true."""
    labels: dict[str, str] = Field(default_factory=dict)
    """Extra labels (e.g. ``severity``)."""
    annotations: dict[str, str] = Field(default_factory=dict)
    """Extra annotations (e.g. ``runbook_url``)."""

    @model_validator(mode="after")
    def _check(self) -> RegressionSpec:
        if self.baseline == "week_ago" and self.baseline_window > 7 * 86400:
            raise ValueError("baseline_window must not exceed a week with baseline week_ago")
        if self.step * self.min_points > self.recent_window:
            raise ValueError(
                f"recent_window holds fewer than min_points={self.min_points} steps of "
                f"{self.step:g} s"
            )
        if self.elasticity is not None and not self.elasticity[0] <= self.elasticity[1]:
            raise ValueError(f"elasticity: low ({self.elasticity[0]:g}) is above high "
                             f"({self.elasticity[1]:g})")
        return self


class DefaultOverride(FrozenAliased):
    """Per-rule adjustments of a built-in rule; unset fields keep the built-in value.

    ``threshold`` means: the utilization for ``kv_cache_saturation``, the predicted level for
    ``kv_cache_exhaustion_forecast``, the failure ratio for ``failure_ratio_spike``, the GPU
    utilization below which a GPU is idle for ``gpu_idle_while_queued``; unused elsewhere.
    """

    threshold: float | None = Field(default=None, gt=0)
    """Level that trips the rule (see above)."""
    min_effect: float | None = Field(default=None, gt=0)
    """Regression rules: minimum relative change."""
    z_threshold: float | None = Field(default=None, gt=0)
    """Regression rules: minimum robust z."""
    baseline: Literal["trailing", "week_ago"] | None = None
    """Regression rules: baseline choice."""
    recent_window: PositiveDuration | None = None
    """Regression rules: recent window; forecast: regression window."""
    baseline_window: PositiveDuration | None = None
    """Regression rules: baseline window."""
    load_tolerance: float | None = Field(default=None, gt=0)
    """Deprecated and ignored (regression rules judge at the same load now)."""
    min_traffic: float | None = Field(default=None, ge=0)
    """``failure_ratio_spike``: minimum requests/s for a verdict."""
    horizon: PositiveDuration | None = None
    """``kv_cache_exhaustion_forecast``: how far ahead exhaustion is predicted."""
    for_s: Duration | None = Field(default=None, alias="for")
    """Pending time before firing."""
    keep_firing_for_s: Duration | None = Field(default=None, alias="keep_firing_for")
    """Firing time after the condition was last true."""


class DefaultsSpec(FrozenAliased):
    """The built-in rules that run with no rules file (``alerts/defaults.py``)."""

    enabled: bool = True
    """``false`` turns every built-in rule off."""
    disable: list[str] = Field(default_factory=list)
    """Built-in rules to turn off, by name."""
    overrides: dict[str, DefaultOverride] = Field(default_factory=dict)
    """Per-rule threshold and timing overrides, by built-in rule name."""

    @field_validator("disable")
    @classmethod
    def _known_disable(cls, names: list[str]) -> list[str]:
        for n in names:
            if n not in DEFAULT_RULE_NAMES:
                raise ValueError(_unknown(n))
        return names

    @field_validator("overrides")
    @classmethod
    def _known_overrides(cls, value: dict[str, DefaultOverride]) -> dict[str, DefaultOverride]:
        for n in value:
            if n not in DEFAULT_RULE_NAMES:
                raise ValueError(_unknown(n))
        return value
