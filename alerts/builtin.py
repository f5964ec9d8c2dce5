"""The catalog of built-in rules, ``alerts/builtin_rules.yaml``: read and validated once, and the
README table of the built-ins rendered from it.  The rules themselves are built from it by
``alerts/defaults.py``."""

from __future__ import annotations

import functools
import string
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field

from tritonwatch.schemas.values import Duration, format_duration

CATALOG_FILE = Path(__file__).with_name("builtin_rules.yaml")

#: A parameter's value in the catalog: validated by the rule class (or RegressionSpec) it sets.
Param = float | str | list[str] | list[float]


class _Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)


class RuleDoc(_Strict):
    """A rule's row of the README table; ``{param:fmt}`` is replaced by the rule's value."""

    flags: str
    thresholds: str


class CatalogEntry(_Strict):
    """One built-in rule of the catalog."""

    name: str
    alertname: str
    severity: Literal["warning", "critical"]
    for_s: Duration = Field(alias="for")
    keep_firing_for_s: Duration = Field(alias="keep_firing_for")
    #: The fields of the rule's class (a threshold or forecast rule).
    params: dict[str, Param] = Field(default_factory=dict)
    #: A regression rule: its RegressionSpec, on top of ``regression_defaults.spec``.
    regression: dict[str, Param] | None = None
    #: ``defaults.overrides`` key -> the parameter it sets.
    overridable: dict[str, str] = Field(default_factory=dict)
    doc: RuleDoc


class RegressionDefaults(_Strict):
    """What every built-in regression rule shares."""

    spec: dict[str, Param]
    overridable: dict[str, str]


class Catalog(_Strict):
    version: Literal[1]
    regression_defaults: RegressionDefaults
    rules: list[CatalogEntry]

    def rule(self, name: str) -> CatalogEntry:
        (found,) = (r for r in self.rules if r.name == name)
        return found


@functools.cache
def catalog() -> Catalog:
    """The built-in rules of ``alerts/builtin_rules.yaml`` (read once)."""
    return Catalog.model_validate(yaml.safe_load(CATALOG_FILE.read_text(encoding="utf-8")))


def _pct(value: float) -> str:
    return f"{value * 100:g} %"


_FORMATS: dict[str, Callable[[float], str]] = {
    "dur": format_duration,
    "pct": _pct,
    "pts": lambda v: f"{v * 100:g}",
}


class _DocFormatter(string.Formatter):
    def format_field(self, value: Any, format_spec: str) -> str:
        fmt = _FORMATS.get(format_spec)
        return fmt(value) if fmt is not None else super().format_field(value, format_spec)


def render_doc(template: str, params: Mapping[str, object]) -> str:
    """``template`` (a :class:`RuleDoc` field) with the rule's values filled in."""
    return _DocFormatter().vformat(" ".join(template.split()), (), params)


def readme_row(rule: CatalogEntry, params: Mapping[str, object]) -> str:
    """The README table row of ``rule``, built with the values ``params`` (its class's fields
    or its RegressionSpec's, as built)."""
    timing = " / ".join(format_duration(s) if s else "0"  # not "0ms"
                        for s in (rule.for_s, rule.keep_firing_for_s))
    return (f"| `{rule.name}` ({rule.alertname}) | {render_doc(rule.doc.flags, params)} | "
            f"{render_doc(rule.doc.thresholds, params)} | {timing} |")
