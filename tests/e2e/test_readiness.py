"""Readiness as SLIs through a real tritonserver (its own rig, in EXPLICIT model-control mode):
a model unloaded through the model-control API turns ``triton_model_ready`` to 0 and fires
ModelNotReady; loading it again resolves it; the readiness SLO counts the readings."""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path

import httpx
import pytest

from tritonwatch.alerts.engine import Engine
from tritonwatch.alerts.readiness import ModelNotReadyRule
from tritonwatch.alerts.slo import Slo, slo_status
from tritonwatch.api.exporter import metric_name
from tritonwatch.collector.jobs import Collector
from tritonwatch.collector.triton import readiness_samples
from tritonwatch.rig import TritonRig
from tritonwatch.schemas.config import Config, TargetConfig
from tritonwatch.schemas.rules import SloSpec
from tritonwatch.schemas.samples import Sample, make_labels
from tritonwatch.store import Store

pytestmark = pytest.mark.triton


def latest(collector: Collector, name: str, model: str | None = None) -> list[float]:
    return [v.value for v in collector.latest.values()
            if v.name == name and (model is None or dict(v.labels).get("model") == model)]


class Readings:
    """The rig's API read on a simulated 15 s schedule, then ModelNotReady evaluated."""

    def __init__(self, config: Config, store: Store) -> None:
        self.store = store
        self.now = time.time()
        self.collector = Collector(config, store, clock=lambda: self.now)
        self.engine = Engine([ModelNotReadyRule(for_s=0.0)], store, eval_interval=15,
                             clock=lambda: self.now)

    def __call__(self) -> list[str]:
        """The alert events of the next reading, as "<status> <model>", in engine order."""
        self.now += 15.0
        asyncio.run(self.collector.read_api("rig"))
        self.store.flush()
        return [f"{e.status} {dict(e.labels)['model']}" for e in self.engine.evaluate(self.now)]


def test_an_unloaded_model_is_not_ready_fires_model_not_ready_and_resolves_on_load(
    tmp_path: Path, store: Store
):
    rig = TritonRig(workdir=tmp_path / "rig",
                    extra_args=("--model-control-mode=explicit", "--load-model=*"))
    with rig, httpx.Client(base_url=rig.http_url, timeout=60) as triton:
        config = Config(targets=(TargetConfig(name="rig", metrics_url=rig.metrics_url,
                                              http_url=rig.http_url),),
                        nvml={"enabled": False})
        reading = Readings(config, store)
        collector = reading.collector

        assert reading() == []
        assert latest(collector, "triton_server_live") == [1.0]
        assert latest(collector, "triton_server_ready") == [1.0]
        assert latest(collector, "triton_model_ready", "batcher") == [1.0]
        assert latest(collector, "triton_model_ready", "fake_llm") == [1.0]

        assert triton.post("/v2/repository/models/batcher/unload").status_code == 200
        deadline = time.monotonic() + 60
        while next(m for m in triton.post("/v2/repository/index").json()
                   if m["name"] == "batcher").get("state") != "UNAVAILABLE":
            assert time.monotonic() < deadline, "batcher never unloaded"
            time.sleep(0.2)
        assert reading() == ["firing batcher"]
        assert latest(collector, "triton_model_ready", "batcher") == [0.0]
        assert latest(collector, "triton_model_ready", "fake_llm") == [1.0]
        [alert] = [s for s in reading.engine.states() if s.status == "firing"]
        labels, notes = dict(alert.labels), dict(alert.annotations)
        assert labels == {"alertname": "ModelNotReady", "target": "rig", "model": "batcher",
                          "version": "1", "severity": "critical"}
        assert notes["state"] == "UNAVAILABLE" and notes["reason"] == "unloaded"
        [reason] = [v for v in collector.latest.values() if v.name == "triton_model_ready_reason"]
        assert dict(reason.labels)["reason"] == "unloaded"
        assert metric_name(reason.name) == "tritonwatch_triton_model_ready_reason"

        assert triton.post("/v2/repository/models/batcher/load").status_code == 200
        assert triton.get("/v2/models/batcher/ready").status_code == 200
        assert reading() == ["resolved batcher"]
        assert latest(collector, "triton_model_ready", "batcher") == [1.0]

        # The readiness SLO: three readings of batcher, one of them not ready.
        spec = SloSpec.model_validate({"name": "batcher-ready", "objective": 99,
                                       "sli": {"kind": "readiness", "model": "batcher"}})
        status = slo_status(store, Slo.from_spec(spec), reading.now)
        assert (status.good, status.total) == (2.0, 3.0)
        server = SloSpec.model_validate({"name": "server-ready", "objective": 99,
                                         "sli": {"kind": "readiness", "server": True}})
        assert slo_status(store, Slo.from_spec(server), reading.now).compliance == 1.0
        asyncio.run(collector.close())


def test_readiness_samples_skip_models_never_loaded() -> None:
    index = [
        {"name": "a", "version": "1", "state": "READY", "reason": ""},
        {"name": "b", "version": "2", "state": "UNAVAILABLE", "reason": "unloaded\n\x1b[31m"},
        {"name": "c"},  # EXPLICIT mode: in the repository, never loaded
        {"name": "a", "version": "1", "state": "READY"},  # listed twice: counted once
    ]
    assert readiness_samples(True, False, index) == (
        Sample("triton_server_live", (), 1.0),
        Sample("triton_server_ready", (), 0.0),
        Sample("triton_model_ready", make_labels({"model": "a", "version": "1"}), 1.0),
        Sample("triton_model_ready", make_labels({"model": "b", "version": "2"}), 0.0),
        Sample("triton_model_ready_reason", make_labels(
            {"model": "b", "version": "2", "state": "UNAVAILABLE",
             "reason": "unloaded\\n\\x1b[31m"}), 1.0),
    )


def test_expected_models_never_loaded_fire_model_not_ready_until_loaded(
    tmp_path: Path, store: Store
):
    # EXPLICIT mode with only batcher loaded: fake_llm is in the repository and never loaded
    # (the index lists it without a version), "ghost" is not in the repository at all.
    rig = TritonRig(workdir=tmp_path / "rig",
                    extra_args=("--model-control-mode=explicit", "--load-model=batcher"))
    rig.models = ["batcher"]  # start-up waits for the models it loads, and fake_llm is not
    with rig, httpx.Client(base_url=rig.http_url, timeout=60) as triton:
        listed = {m["name"]: m for m in triton.post("/v2/repository/index").json()}
        assert "version" not in listed["fake_llm"] or not listed["fake_llm"]["version"]
        assert "ghost" not in listed
        config = Config.model_validate({
            "targets": [{"name": "rig", "metrics_url": rig.metrics_url,
                         "http_url": rig.http_url,
                         "expected_models": ["batcher", "fake_llm", "ghost"]}],
            "nvml": {"enabled": False}})
        readings = Readings(config, store)
        collector = readings.collector

        def reading() -> list[str]:
            return sorted(readings())

        assert reading() == ["firing fake_llm", "firing ghost"]
        assert latest(collector, "triton_model_ready", "batcher") == [1.0]
        assert latest(collector, "triton_model_ready", "fake_llm") == [0.0]
        assert latest(collector, "triton_model_ready", "ghost") == [0.0]
        firing = {dict(s.labels)["model"]: s for s in readings.engine.states()
                  if s.status == "firing"}
        assert dict(firing["ghost"].labels) == {
            "alertname": "ModelNotReady", "target": "rig", "model": "ghost", "version": "",
            "severity": "critical"}
        ghost, llm = dict(firing["ghost"].annotations), dict(firing["fake_llm"].annotations)
        assert (ghost["state"], ghost["reason"]) == ("ABSENT", "not loaded")
        assert llm["reason"] == "not loaded"
        assert llm["summary"].startswith("model fake_llm on rig is expected and not loaded")

        assert triton.post("/v2/repository/models/fake_llm/load").status_code == 200
        assert triton.get("/v2/models/fake_llm/ready").status_code == 200
        assert reading() == ["resolved fake_llm"]
        assert latest(collector, "triton_model_ready", "fake_llm") == [1.0]
        # ghost stays firing: it is still expected and still absent.
        assert [dict(s.labels)["model"] for s in readings.engine.states()
                if s.status == "firing"] == ["ghost"]
        asyncio.run(collector.close())


def test_readiness_samples_report_expected_models_not_loaded() -> None:
    index = [
        {"name": "a", "version": "1", "state": "READY"},
        {"name": "c"},  # EXPLICIT mode: never loaded
        {"name": "d", "state": "UNAVAILABLE"},  # listed unavailable without a version
        {"name": "e", "version": "3", "state": "UNAVAILABLE", "reason": "unloaded"},
    ]
    samples = readiness_samples(True, True, index, expected=("a", "c", "d", "e", "z"))
    ready = {dict(s.labels)["model"]: (dict(s.labels)["version"], s.value)
             for s in samples if s.name == "triton_model_ready"}
    assert ready == {"a": ("1", 1.0), "c": ("", 0.0), "d": ("", 0.0), "e": ("3", 0.0),
                     "z": ("", 0.0)}
    reasons = {dict(s.labels)["model"]: (dict(s.labels)["state"], dict(s.labels)["reason"])
               for s in samples if s.name == "triton_model_ready_reason"}
    # e keeps Triton's own reason: it has a version, so its versioned series speaks for it.
    assert reasons == {"c": ("ABSENT", "not loaded"), "d": ("UNAVAILABLE", "not loaded"),
                       "e": ("UNAVAILABLE", "unloaded"), "z": ("ABSENT", "not loaded")}


@pytest.mark.parametrize(("target", "message"), [
    ({"expected_models": ["m"]}, "expected_models needs http_url or grpc_url"),
    ({"http_url": "http://h:8000", "expected_models": ["m", "m"]}, "'m' is listed twice"),
    ({"http_url": "http://h:8000", "expected_models": [""]}, "expected_models[0]"),
])
def test_expected_models_bad_config_names_the_key(target: dict[str, object], message: str
                                                  ) -> None:
    with pytest.raises(ValueError, match=re.escape(message)) as info:
        Config.model_validate({"targets": [{"name": "t", "metrics_url": "http://h:8002/m",
                                            **target}]})
    assert "targets.0" in str(info.value)
