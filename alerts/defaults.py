"""Built-in alert rules: what Tritonwatch flags with no rules file at all.

Declared in ``alerts/builtin_rules.yaml`` (names, alertnames, severities, thresholds, timings,
which ``defaults.overrides`` keys each takes, and their README row); built here.  The rules:
regressions (``alerts/detect.py``), KV cache and idle GPUs (``alerts/capacity.py``), failure
spikes and targets down (``alerts/availability.py``).

``DefaultsSpec`` turns all of them off (``enabled: false``), some (``disable``), or adjusts them
(``overrides``).  Labels are ``alertname``, ``rule``, ``target``, ``model``/``version``
(``probe`` for probe rules, ``gpu_uuid`` for GPU rules, ``reason`` for failures) and
``severity``; every number is in the annotations.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping

from pydantic import TypeAdapter

from tritonwatch.alerts.availability import FailureRatioSpikeRule, TargetDownRule
from tritonwatch.alerts.baseline import SharedLoads
from tritonwatch.alerts.builtin import CatalogEntry, catalog, readme_row
from tritonwatch.alerts.capacity import (
    GpuIdleWhileQueuedRule,
    KvCacheForecastRule,
    KvCacheSaturationRule,
)
from tritonwatch.alerts.detect import RegressionRule
from tritonwatch.alerts.model import Rule
from tritonwatch.schemas.regressions import DefaultOverride, DefaultsSpec, RegressionSpec

#: The class of each built-in rule that is not a regression, by name: built from the catalog's
#: ``params`` by pydantic, which checks every field's type.
_BUILDERS: dict[str, Callable[[object], Rule]] = {
    "kv_cache_saturation": TypeAdapter(KvCacheSaturationRule).validate_python,
    "kv_cache_exhaustion_forecast": TypeAdapter(KvCacheForecastRule).validate_python,
    "gpu_idle_while_queued": TypeAdapter(GpuIdleWhileQueuedRule).validate_python,
    "failure_ratio_spike": TypeAdapter(FailureRatioSpikeRule).validate_python,
    "target_down": TypeAdapter(TargetDownRule).validate_python,
}


def _overridden(
    o: DefaultOverride | None, mapping: Mapping[str, str], timing: tuple[str, str]
) -> dict[str, object]:
    """The values ``o`` sets, by the parameter they set (``mapping``: override key ->
    parameter; ``timing``: the parameters ``for`` and ``keep_firing_for`` set)."""
    if o is None:
        return {}
    given = o.model_dump(exclude_none=True, by_alias=False)
    out = {dst: given[src] for src, dst in mapping.items() if src in given}
    for src, dst in zip(("for_s", "keep_firing_for_s"), timing, strict=True):
        if src in given:
            out[dst] = given[src]
    return out


def _regression_spec(name: str, o: DefaultOverride | None) -> RegressionSpec:
    """The RegressionSpec of the built-in regression rule ``name``, adjusted by ``o``."""
    cat = catalog()
    rule = cat.rule(name)
    assert rule.regression is not None, f"{name} is not a regression rule"
    return RegressionSpec.model_validate({
        **cat.regression_defaults.spec,
        "name": name,
        "for": rule.for_s,
        "keep_firing_for": rule.keep_firing_for_s,
        "labels": {"alertname": rule.alertname, "severity": rule.severity},
        **rule.regression,
        **_overridden(o, cat.regression_defaults.overridable, ("for", "keep_firing_for")),
    })


def _build(
    rule: CatalogEntry, o: DefaultOverride | None, loads: SharedLoads
) -> Rule:
    if rule.regression is not None:
        return RegressionRule(_regression_spec(rule.name, o), alertname=rule.alertname,
                              shared_loads=loads)
    return _BUILDERS[rule.name]({
        "name": rule.name, "alertname": rule.alertname, "severity": rule.severity,
        "for_s": rule.for_s, "keep_firing_for_s": rule.keep_firing_for_s,
        **rule.params,
        **_overridden(o, rule.overridable, ("for_s", "keep_firing_for_s")),
    })


def watch_targets(rules: Iterable[Rule], targets: Iterable[str]) -> None:
    """Limit every :class:`TargetDownRule` of ``rules`` to the configured ``targets``."""
    names = frozenset(targets)
    for rule in rules:
        if isinstance(rule, TargetDownRule):
            rule.targets = names


def default_rules(
    spec: DefaultsSpec | None = None, loads: SharedLoads | None = None
) -> list[Rule]:
    """The built-in rules (all of them for ``None``), minus those ``spec`` disables.

    The regression rules share their load histories through ``loads`` (one per rules file,
    so a file's own regressions share them too; a new one when ``None``): all five weigh load
    by request rate over the same windows, and five copies of it held about 13 MB each at
    1,000 targets of 7 models."""
    spec = spec or DefaultsSpec()
    if not spec.enabled:
        return []
    if loads is None:
        loads = {}
    return [_build(r, spec.overrides.get(r.name), loads) for r in catalog().rules
            if r.name not in spec.disable]


@functools.cache
def readme_table() -> str:
    """The rows of the README's table of built-in rules, from the catalog and the values the
    rules are built with (``python -c "from tritonwatch.alerts.defaults import readme_table;
    print(readme_table())"`` prints them)."""
    rows = []
    for built, rule in zip(default_rules(None), catalog().rules, strict=True):
        params = vars(built.spec) if isinstance(built, RegressionRule) else vars(built)
        rows.append(readme_row(rule, params))
    return "\n".join(rows)
