"""Importing Sloth prometheus/v1 and OpenSLO v1 SLO specs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tritonwatch.alerts.importers import import_openslo, import_slo_file, import_sloth, to_yaml
from tritonwatch.cli import main
from tritonwatch.schemas.config import ConfigError
from tritonwatch.schemas.rules import (
    AvailabilitySli,
    ProbeLatencySli,
    ProbeSuccessSli,
    validate_rules,
)

SLOTH = """
version: "prometheus/v1"
service: "triton"
labels:
  owner: "ml-platform"
slos:
  - name: "requests-availability"
    objective: 99.9
    description: "Triton answers inference requests."
    labels: {tier: "1"}
    sli:
      events:
        error_query: >
          sum(rate(nv_inference_request_failure{model="resnet",version="1"}[{{.window}}]))
        total_query: |
          sum(rate(nv_inference_request_success{model="resnet",version="1"}[{{.window}}]))
          + sum(rate(nv_inference_request_failure{model="resnet",version="1"}[{{.window}}]))
    alerting:
      name: TritonHighErrorRate
      labels: {category: availability}
      annotations: {summary: "High error rate on resnet"}
      page_alert:
        labels: {routing_key: ml-pager}
      ticket_alert:
        disable: true
  - name: "ttft"
    objective: 99
    sli:
      events:
        error_query: >
          sum(rate(tritonwatch_probe_ttft_seconds_count{probe="llm"}[{{.window}}]))
          - sum(rate(tritonwatch_probe_ttft_seconds_bucket{probe="llm",le="0.5"}[{{.window}}]))
        total_query: sum(rate(tritonwatch_probe_ttft_seconds_count{probe="llm"}[{{.window}}]))
"""

OPENSLO = """
apiVersion: openslo/v1
kind: SLI
metadata: {name: probe-success}
spec:
  ratioMetric:
    counter: true
    bad:
      metricSource:
        type: Prometheus
        spec: {query: 'sum(tritonwatch_probe_errors_total{model="llama"})'}
    total:
      metricSource:
        type: Prometheus
        spec: {query: 'sum(tritonwatch_probe_requests_total{model="llama"})'}
---
apiVersion: openslo/v1
kind: SLO
metadata:
  name: triton-availability
  displayName: Triton availability
  labels: {team: [ml, infra]}
spec:
  service: triton
  indicator:
    metadata: {name: availability}
    spec:
      ratioMetric:
        counter: true
        good:
          metricSource:
            type: Prometheus
            spec: {query: 'sum(nv_inference_request_success{model="bert"})'}
        total:
          metricSource:
            type: Prometheus
            spec:
              query: >
                sum(nv_inference_request_success{model="bert"})
                + sum(nv_inference_request_failure{model="bert"})
  timeWindow:
    - duration: 4w
      isRolling: true
  budgetingMethod: Occurrences
  objectives:
    - displayName: good
      target: 0.995
  alertPolicies: [fast-burn]
---
apiVersion: openslo/v1
kind: SLO
metadata: {name: probe-success}
spec:
  indicatorRef: probe-success
  timeWindow: [{duration: 30d, isRolling: true}]
  budgetingMethod: Occurrences
  objectives: [{targetPercent: 99.5}]
"""


def test_sloth_spec_maps_objective_labels_alerting_and_recognised_slis() -> None:
    imported = import_sloth(yaml.safe_load(SLOTH))
    avail, ttft = imported.slos
    assert avail.name == "triton-requests-availability"
    assert (avail.objective, avail.window) == (99.9, "30d")
    assert avail.labels == {"owner": "ml-platform", "tier": "1", "service": "triton"}
    assert isinstance(avail.sli, AvailabilitySli)
    assert (avail.sli.model, avail.sli.version, avail.sli.match) == ("resnet", "1", {})
    assert avail.alerting.name == "TritonHighErrorRate"
    assert avail.alerting.labels == {"category": "availability"}
    assert avail.alerting.page.labels == {"routing_key": "ml-pager"}
    assert avail.alerting.page.enabled and not avail.alerting.ticket.enabled
    assert isinstance(ttft.sli, ProbeLatencySli)
    assert (ttft.sli.kind, ttft.sli.threshold, ttft.sli.probe) == ("ttft", 0.5, "llm")
    assert import_sloth(yaml.safe_load(SLOTH), window="28d").slos[0].window == "28d"


def events(error_query: str, total_query: str) -> dict[str, Any]:
    """A sloth ``events`` SLI."""
    return {"events": {"error_query": error_query, "total_query": total_query}}


@pytest.mark.parametrize(
    ("sli", "expected"),
    [
        pytest.param({"raw": {"error_ratio_query": "sum(rate(http_errors[5m]))"}},
                     "slos[0].sli.raw.error_ratio_query: cannot translate this query",
                     id="an arbitrary query is refused naming the field"),
        pytest.param(events('sum(nv_inference_request_failure{model=~"a.*"})',
                            "sum(nv_inference_request_success)"),
                     "slos[0].sli.events.error_query: matcher 'model=~\"a.*\"': only equality",
                     id="a regex matcher cannot be translated"),
        pytest.param({"plugin": {"id": "sloth-common/kubernetes/apiserver/availability"}},
                     "slos[0].sli.plugin: SLI plugins cannot be translated",
                     id="plugins are refused"),
        pytest.param(events("sum(nv_inference_request_failure)", "sum(up)"),
                     "slos[0].sli.events.error_query: cannot translate",
                     id="a total from another metric is refused"),
        # Matchers that would be lost in translation.
        pytest.param(events(
            'sum(rate(nv_inference_request_failure{model="m", reason="REJECTED"}[{{.window}}]))',
            'sum(rate(nv_inference_request_success{model="m"}[{{.window}}])) + '
            'sum(rate(nv_inference_request_failure{model="m"}[{{.window}}]))'),
            "slos[0].sli.events.error_query: matcher reason='REJECTED': the availability SLI "
            "counts failures of every reason", id="a reason filter is refused, not dropped"),
        pytest.param(events(
            'sum(rate(tritonwatch_probe_ttft_seconds_count{model="m"}[5m])) - '
            'sum(rate(tritonwatch_probe_ttft_seconds_bucket{model="m",le="0.5"}[5m]))',
            'sum(rate(tritonwatch_probe_ttft_seconds_count{model="m",job="tw"}[5m]))'),
            "slos[0].sli.events.total_query: matcher job='tw': only probe, model matchers",
            id="an unknown matcher of a probe query is refused where it is"),
        pytest.param(events('sum(tritonwatch_probe_errors_total{model="m",kind="timeout"})',
                            'sum(tritonwatch_probe_requests_total{model="m"})'),
                     "slos[0].sli.events.error_query: matcher kind='timeout'",
                     id="the probe errors' kind is refused"),
        pytest.param(events('sum(nv_inference_request_failure{model="a"})',
                            'sum(nv_inference_request_success{model="b"})'),
                     "slos[0].sli.events.total_query: matcher model='b' contradicts model='a'",
                     id="contradicting matchers are refused"),
    ],
)
def test_sloth_slis_that_cannot_be_executed_are_refused(sli: dict[str, Any], expected: str) -> None:
    doc = {"version": "prometheus/v1", "service": "s",
           "slos": [{"name": "x", "objective": 99, "sli": sli}]}
    with pytest.raises(ConfigError) as err:
        import_sloth(doc)
    assert any(e.startswith(expected) for e in err.value.errors), err.value.errors


def test_sloth_raw_ratio_queries_translate_like_events() -> None:
    # docs/rules.md: a raw error_ratio_query over recognised metrics translates.
    doc = {"version": "prometheus/v1", "service": "s", "slos": [{
        "name": "x", "objective": 99.9, "sli": {"raw": {"error_ratio_query": (
            'sum(rate(nv_inference_request_failure{model="m",region="eu"}[{{.window}}])) / '
            '(sum(rate(nv_inference_request_success{model="m",region="eu"}[{{.window}}])) + '
            'sum(rate(nv_inference_request_failure{model="m",region="eu"}[{{.window}}])))'
        )}}}]}
    (slo,) = import_sloth(doc).slos
    assert isinstance(slo.sli, AvailabilitySli)
    assert (slo.sli.model, slo.sli.match) == ("m", {"region": "eu"})


def test_sloth_objective_errors_keep_their_key_path() -> None:
    doc = {"version": "prometheus/v1", "service": "s", "slos": [{
        "name": "x", "objective": 100,
        "sli": {"events": {"error_query": "sum(nv_inference_request_failure)",
                           "total_query": "sum(nv_inference_request_success)"}}}]}
    with pytest.raises(ConfigError) as err:
        import_sloth(doc)
    assert err.value.errors[0].startswith("slos[0].objective: Input should be less than 100")


def test_openslo_documents_map_window_target_labels_and_indicator_refs() -> None:
    imported = import_openslo(yaml.safe_load_all(OPENSLO))
    avail, probe = imported.slos
    assert (avail.name, avail.objective, avail.window) == ("triton-availability", 99.5, "28d")
    assert avail.labels == {"team": "ml,infra", "service": "triton"}
    assert avail.description == "Triton availability"
    assert isinstance(avail.sli, AvailabilitySli) and avail.sli.model == "bert"
    assert isinstance(probe.sli, ProbeSuccessSli) and probe.sli.model == "llama"
    assert (probe.objective, probe.window) == (99.5, "30d")
    assert any("alertPolicies" in n for n in imported.notes)


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        pytest.param({"budgetingMethod": "Timeslices"}, "[0].spec.budgetingMethod: 'Timeslices'",
                     id="time-slice budgeting is refused"),
        pytest.param({"timeWindow": [{"duration": "7d", "isRolling": True}]},
                     "[0].spec.timeWindow[0].duration: '7d': only 28d (4w) and 30d",
                     id="a 7 day window is refused"),
        pytest.param({"timeWindow": [{"duration": "1M", "calendar": {"startTime": "x"}}]},
                     "[0].spec.timeWindow[0]: only rolling windows",
                     id="calendar windows are refused"),
        pytest.param({"indicator": {"spec": {"thresholdMetric": {}}}},
                     "[0].spec.indicator.spec.thresholdMetric: only ratioMetric",
                     id="threshold metrics are refused"),
        pytest.param({"objectives": [{"target": 0.9}, {"target": 0.99}]},
                     "[0].spec.objectives: exactly one objective",
                     id="composite objectives are refused"),
    ],
)
def test_openslo_fields_that_do_not_map_are_refused_by_path(
    change: dict[str, Any], expected: str
) -> None:
    docs = list(yaml.safe_load_all(OPENSLO))
    slo = docs[1]
    slo["spec"] = {**slo["spec"], **change}
    with pytest.raises(ConfigError) as err:
        import_openslo([slo])
    assert any(e.startswith(expected) for e in err.value.errors), err.value.errors


def test_imported_yaml_is_a_valid_rules_file_that_round_trips() -> None:
    imported = import_sloth(yaml.safe_load(SLOTH))
    text = to_yaml(imported.slos)
    rules = validate_rules(yaml.safe_load(text))
    assert rules.slos == imported.slos


def test_import_slo_command_detects_the_format(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sloth, openslo, other = tmp_path / "a.yaml", tmp_path / "b.yaml", tmp_path / "c.yaml"
    sloth.write_text(SLOTH)
    openslo.write_text(OPENSLO)
    other.write_text("apiVersion: pyrra.dev/v1alpha1\nkind: ServiceLevelObjective\n")
    assert main(["import-slo", str(sloth), "--window", "28d"]) == 0
    out = yaml.safe_load(capsys.readouterr().out)
    assert out["version"] == 1 and [s["window"] for s in out["slos"]] == ["28d", "28d"]
    assert main(["import-slo", str(openslo)]) == 0
    captured = capsys.readouterr()
    assert [s["name"] for s in yaml.safe_load(captured.out)["slos"]] == [
        "triton-availability", "probe-success"
    ]
    assert "note:" in captured.err
    assert main(["import-slo", str(other)]) == 2
    assert "neither a Sloth" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="cannot read file"):
        import_slo_file(tmp_path / "missing.yaml")
