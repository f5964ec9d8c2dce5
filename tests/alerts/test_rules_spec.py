"""The rules file: validation with key paths, JSON Schema, threshold rules, load_rules, CLI."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
import yaml

from tritonwatch.alerts.rules import SloBurnRule, ThresholdRule, load_rules, render
from tritonwatch.cli import main
from tritonwatch.schemas import rules as rules_spec
from tritonwatch.schemas.config import ConfigError
from tritonwatch.schemas.rules import (
    AvailabilitySli,
    ProbeLatencySli,
    QueueTimeSli,
    RulesFile,
    ThresholdRuleSpec,
    load_rules_file,
    rules_json_schema,
    validate_rules,
)
from tritonwatch.schemas.samples import Sample, make_labels
from tritonwatch.schemas.values import format_duration
from tritonwatch.store import Store

# The module docstring's example, so that the documented example is the one tested.
EXAMPLE = textwrap.dedent(rules_spec.__doc__.split("::\n", 1)[1]) if rules_spec.__doc__ else ""


def errors_of(data: object) -> list[str]:
    with pytest.raises(ConfigError) as err:
        validate_rules(data, "rules.yaml")
    return err.value.errors


def test_the_documented_example_validates_into_frozen_models() -> None:
    rules = validate_rules(yaml.safe_load(EXAMPLE))
    ttft, avail, queue = rules.slos
    assert isinstance(ttft.sli, ProbeLatencySli) and ttft.sli.threshold == 0.8
    assert ttft.window == "28d" and ttft.sli.by == ("model",)
    assert not ttft.alerting.ticket.enabled and ttft.alerting.page.enabled
    assert isinstance(avail.sli, AvailabilitySli) and avail.sli.match == {"region": "eu"}
    assert isinstance(queue.sli, QueueTimeSli) and queue.sli.threshold == 0.05
    (kv,) = rules.alerts
    assert (kv.for_s, kv.keep_firing_for_s, kv.window) == (300.0, 120.0, 600.0)
    assert rules.regressions[0].name == "fill_rate_drop"
    assert rules.defaults.disable == ["target_down"]
    with pytest.raises(ValueError, match="frozen"):
        kv.threshold = 1.0  # type: ignore[misc]


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        pytest.param({"version": 2}, "version: unsupported rules version 2",
                     id="an unknown version is refused"),
        pytest.param({"slos": [{"name": "a", "objective": 100, "sli": {"kind": "success"}}]},
                     "slos[0].objective: Input should be less than 100",
                     id="a 100 percent objective has no budget"),
        pytest.param({"slos": [{"name": "a", "objective": 99, "window": "7d",
                                "sli": {"kind": "success"}}]},
                     "slos[0].window: Input should be '28d' or '30d'",
                     id="only 28 and 30 day windows"),
        pytest.param({"slos": [{"name": "a", "objective": 99, "sli": {"kind": "latency"}}]},
                     "slos[0].sli: Input tag 'latency' found using 'kind' does not match",
                     id="an unknown SLI kind names the sli key"),
        pytest.param({"slos": [{"name": "a", "objective": 99,
                                "sli": {"kind": "queue_time"}}]},
                     "slos[0].sli.queue_time.threshold: Field required",
                     id="queue time needs a threshold"),
        pytest.param({"slos": [{"name": "a", "objective": 99,
                                "sli": {"kind": "ttft", "threshold": "fast"}}]},
                     "slos[0].sli.ttft.threshold: invalid duration 'fast'",
                     id="a bad duration is quoted"),
        pytest.param({"slos": [{"name": "a", "objective": 99,
                                "sli": {"kind": "ttft", "threshold": 1, "by": ["gpu"]}}]},
                     "slos[0]: sli.by ['gpu']: with a threshold",
                     id="probe rows cannot be grouped by arbitrary labels"),
        pytest.param({"slos": [{"name": "a", "objective": 99, "labels": {"severity": "x"},
                                "sli": {"kind": "success"}}]},
                     "slos[0]: labels: `slo` and `severity` are set by the SLO alert",
                     id="the slo and severity labels are reserved"),
        pytest.param({"alerts": [{"name": "x", "series": "s", "op": "=>", "threshold": 1}]},
                     "alerts[0].op: Input should be",
                     id="an unknown operator is refused"),
        pytest.param({"alerts": [{"name": "x", "series": "s", "op": ">", "threshold": 1,
                                  "annotations": {"s": "{value.__class__}"}}]},
                     "alerts[0].annotations: template '{value.__class__}': unknown field",
                     id="templates cannot reach into objects"),
        pytest.param({"alerts": [{"name": "x", "series": "s", "op": ">", "threshold": 1,
                                  "labels": {"bad-name": "v"}}]},
                     "alerts[0].labels: label name 'bad-name'",
                     id="label names are Prometheus label names"),
        pytest.param({"alerts": [{"name": "x", "series": "s", "op": ">", "threshold": 1,
                                  "severity": "page"}]},
                     "alerts[0].severity: Extra inputs are not permitted",
                     id="unknown keys are errors"),
        pytest.param({"slos": [{"name": "x", "objective": 99, "sli": {"kind": "success"}}],
                      "alerts": [{"name": "x", "series": "s", "op": ">", "threshold": 1}]},
                     "(top level): alerts[0]: name 'x' is already used by slos[0]",
                     id="rule names are unique across sections"),
        pytest.param({"alerts": [{"name": "target_down", "series": "up", "op": "<",
                                  "threshold": 1}]},
                     "(top level): alerts[0]: name 'target_down' is already used by a built-in",
                     id="a built-in rule name cannot be reused"),
        pytest.param({"defaults": {"disable": ["nope"]}},
                     "defaults.disable: unknown built-in rule 'nope'",
                     id="the defaults section is validated too"),
        pytest.param([1, 2], "(top level): expected a mapping, got list",
                     id="the file must be a mapping"),
    ],
)
def test_errors_name_their_key_path(data: object, expected: str) -> None:
    found = errors_of(data)
    assert any(e.startswith(expected) for e in found), found


def test_every_error_is_reported_not_only_the_first() -> None:
    found = errors_of({"slos": [{"name": "a", "objective": 120, "sli": {"kind": "success"}}],
                       "alerts": [{"name": "b", "series": "s", "op": "?", "threshold": 1}]})
    assert [e.split(":")[0] for e in found] == ["slos[0].objective", "alerts[0].op"]


def test_an_unreadable_or_invalid_yaml_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read file"):
        load_rules_file(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("slos: [\n")
    with pytest.raises(ConfigError, match="invalid YAML"):
        load_rules_file(bad)
    assert load_rules_file(None) == RulesFile()


def test_json_schema_documents_every_field_and_accepts_the_example() -> None:
    jsonschema = pytest.importorskip("jsonschema")
    schema = rules_json_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.validate(yaml.safe_load(EXAMPLE), schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"slos": [{"name": "a", "objective": 99, "sli": {"kind": "x"}}]},
                            schema)
    for name in ("SloSpec", "ThresholdRuleSpec", "ProbeLatencySli", "QueueTimeSli",
                 "SloAlerting", "SeverityAlerting"):
        props = schema["$defs"][name]["properties"]
        undocumented = [k for k, v in props.items() if not v.get("description")]
        assert not undocumented, (name, undocumented)
    assert "for" in schema["$defs"]["ThresholdRuleSpec"]["properties"]  # the alias, not for_s


# --- threshold rules -------------------------------------------------------------------------

NOW = 1_800_000_000.0


def kv(store: Store, model: str, values: list[float], gpu: str = "0") -> None:
    labels = make_labels({"model": model, "version": "1", "gpu": gpu})
    for i, v in enumerate(values):
        store.write("t", NOW - (len(values) - 1 - i) * 60, [
            Sample("sli:kv_cache_utilization", labels, v)])
    store.flush()


def rule(**kw: object) -> ThresholdRule:
    data = {"name": "KV", "series": "sli:kv_cache_utilization", "op": ">", "threshold": 0.9,
            "window": "5m", **kw}
    return ThresholdRule(ThresholdRuleSpec.model_validate(data))


@pytest.mark.parametrize(
    ("agg", "op", "fires", "value"),
    [
        pytest.param("avg", ">", True, 0.91, id="the average over the window exceeds 0.9"),
        pytest.param("min", ">", False, 0.8, id="the minimum does not"),
        pytest.param("max", ">=", True, 1.0, id="the maximum reaches it"),
        pytest.param("last", "<", True, 0.85, id="the last value is below it"),
        pytest.param("sum", ">", True, 5.46, id="the sum is far above it"),
    ],
)
def test_threshold_rule_aggregates_over_its_window(
    store: Store, agg: str, op: str, fires: bool, value: float
) -> None:
    # A point a minute for 10 minutes; the 5 m window (both ends inclusive) holds the last 6.
    kv(store, "llm", [0.1, 0.1, 0.1, 0.1, 0.96, 0.8, 1.0, 0.95, 0.9, 0.85])
    found = rule(agg=agg, op=op).evaluate(store, NOW)
    assert bool(found) is fires
    if fires:
        assert found[0].value == pytest.approx(value)


def test_threshold_rule_labels_are_stable_and_annotations_rendered(store: Store) -> None:
    kv(store, "llm", [0.95, 0.96])
    kv(store, "small", [0.2, 0.2])
    r = rule(labels={"severity": "warning"},
             annotations={"summary": "KV {value:.0%} on {labels[model]} ({labels[nope]})",
                          "limit": "{threshold}"})
    (c,) = r.evaluate(store, NOW)
    assert dict(c.labels) == {"alertname": "KV", "severity": "warning", "model": "llm",
                              "version": "1", "gpu": "0", "target": "t"}
    ann = dict(c.annotations)
    assert ann["summary"] == "KV 96% on llm ()" and ann["limit"] == "0.9"
    assert ann["value"] == "0.955"
    kv(store, "llm", [0.99], gpu="0")  # a new value changes annotations, not labels
    (later,) = r.evaluate(store, NOW)
    assert later.labels == c.labels and later.annotations != c.annotations


def test_threshold_rule_by_groups_series(store: Store) -> None:
    kv(store, "llm", [1.0, 1.0], gpu="0")
    kv(store, "llm", [0.7, 0.7], gpu="1")
    (c,) = rule(by=["model"], threshold=0.8).evaluate(store, NOW)
    assert dict(c.labels) == {"alertname": "KV", "model": "llm"}
    assert c.value == pytest.approx(0.85)
    assert rule(by=["model"], threshold=0.86).evaluate(store, NOW) == []
    assert rule(match={"model": "other"}).evaluate(store, NOW) == []


def test_render_and_format_duration() -> None:
    assert render("{value:.1f} {labels[a]}{labels[b]}", value=2.25, threshold=1,
                  labels={"a": "x"}) == "2.2 x"
    assert [format_duration(s) for s in (0.5, 45, 300, 3600, 5400, 259200)] == [
        "500ms", "45s", "5m", "1h", "90m", "3d"
    ]


# --- load_rules and the CLI ------------------------------------------------------------------


def test_load_rules_builds_every_kind_of_rule(tmp_path: Path) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text(EXAMPLE)
    rules = load_rules(path)
    names = [r.name for r in rules]
    assert names[:4] == ["llm-ttft", "triton-availability", "queue", "KVCacheNearlyFull"]
    assert isinstance(rules[0], SloBurnRule) and isinstance(rules[3], ThresholdRule)
    assert "fill_rate_drop" in names
    assert "target_down" not in names  # disabled in the file
    kvrule = rules[3]
    assert (kvrule.for_s, kvrule.keep_firing_for_s) == (300.0, 120.0)
    defaults_only = [r.name for r in load_rules(None)]
    assert "target_down" in defaults_only and "llm-ttft" not in defaults_only


def test_check_rules_prints_every_error_with_its_key_path(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("slos:\n  - {name: a, objective: 101, sli: {kind: success}}\n"
                   "alerts:\n  - {name: b, series: s, op: '?', threshold: 1}\n")
    assert main(["check-rules", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "2 error(s)" in err and "slos[0].objective:" in err and "alerts[0].op:" in err
    good = tmp_path / "good.yaml"
    good.write_text(EXAMPLE + "  \n")
    assert main(["check-rules", str(good)]) == 0
    assert "OK (3 SLO(s), 1 threshold rule(s), 1 regression rule(s)" in capsys.readouterr().out


def test_check_rules_warns_about_tiers_that_can_never_fire(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "low.yaml"
    path.write_text("slos:\n  - {name: low, objective: 90, sli: {kind: success}}\n")
    assert main(["check-rules", str(path)]) == 0
    err = capsys.readouterr().err
    assert "warning: slos[0]" in err and "page-1h" in err and "never fire" in err


def test_rules_schema_prints_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["rules-schema"]) == 0
    schema = json.loads(capsys.readouterr().out)
    assert schema["title"] == "Tritonwatch rules file"
    assert set(schema["properties"]) == {"version", "slos", "alerts", "regressions", "defaults"}
