"""The catalog of built-in rules (alerts/builtin_rules.yaml) is the one source of their names,
thresholds and documentation: the README table, the names a rules file may give, and what each
``defaults.overrides`` key sets are checked against it."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml
from pydantic import TypeAdapter, ValidationError

from tritonwatch.alerts.builtin import CATALOG_FILE, Catalog, catalog
from tritonwatch.alerts.capacity import KvCacheSaturationRule
from tritonwatch.alerts.defaults import default_rules, readme_table
from tritonwatch.alerts.detect import RegressionRule
from tritonwatch.schemas.regressions import DEFAULT_RULE_NAMES, DefaultOverride, RegressionSpec

README = Path(__file__).parents[2] / "README.md"


def test_readme_table_is_the_catalog_rendered() -> None:
    section = README.read_text(encoding="utf-8").split("## Built-in alerts", 1)[1]
    section = section.split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    assert "\n".join(rows) == readme_table(), (
        "README's built-in rules table differs from alerts/builtin_rules.yaml; print the rows "
        "with: python -c 'from tritonwatch.alerts.defaults import readme_table; "
        "print(readme_table())'")


def test_rule_names_a_rules_file_may_give_are_the_catalog_s() -> None:
    assert tuple(r.name for r in catalog().rules) == DEFAULT_RULE_NAMES
    assert [r.name for r in default_rules(None)] == list(DEFAULT_RULE_NAMES)


def test_alertnames_severities_and_timings_come_from_the_catalog() -> None:
    for built, entry in zip(default_rules(None), catalog().rules, strict=True):
        assert (built.for_s, built.keep_firing_for_s) == (entry.for_s, entry.keep_firing_for_s)
        if isinstance(built, RegressionRule):
            assert built.alertname == entry.alertname
            assert built.spec.labels == {"alertname": entry.alertname,
                                         "severity": entry.severity}
        else:
            assert (getattr(built, "alertname"), getattr(built, "severity")) == (  # noqa: B009
                entry.alertname, entry.severity)


def test_every_override_key_sets_a_parameter_the_rule_has() -> None:
    cat = catalog()
    for built, entry in zip(default_rules(None), cat.rules, strict=True):
        if isinstance(built, RegressionRule):
            mapping, fields = cat.regression_defaults.overridable, set(RegressionSpec.model_fields)
        else:
            assert dataclasses.is_dataclass(built)
            mapping, fields = entry.overridable, {f.name for f in dataclasses.fields(built)}
        for key, param in mapping.items():
            assert key in DefaultOverride.model_fields, (entry.name, key)
            assert param in fields, (entry.name, param)


def test_a_misspelt_or_mistyped_parameter_is_an_error() -> None:
    build = TypeAdapter(KvCacheSaturationRule).validate_python
    good = {"name": "kv_cache_saturation", "alertname": "KVCacheSaturation",
            "severity": "warning", "for_s": 600.0, "keep_firing_for_s": 300.0,
            "threshold": 0.9, "window": "2m"}
    assert build(good).window == 120.0
    with pytest.raises(ValidationError, match="threshhold"):
        build({**good, "threshhold": 0.95})
    with pytest.raises(ValidationError, match="window"):
        build({**good, "window": "two minutes"})


def test_the_catalog_rejects_unknown_keys() -> None:
    raw = yaml.safe_load(CATALOG_FILE.read_text(encoding="utf-8"))
    Catalog.model_validate(raw)
    raw["rules"][0]["thresholds"] = 0.5  # not a key of a rule
    with pytest.raises(ValidationError, match="thresholds"):
        Catalog.model_validate(raw)
