"""Readiness as SLIs through a real tritonserver (its own rig, in EXPLICIT model-control mode):
a model unloaded through the model-control API turns ``triton_model_ready`` to 0 and fires
ModelNotReady; loading it again resolves it; the readiness SLO counts the readings."""

from __future__ import annotations

import asyncio
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


def test_an_unloaded_model_is_not_ready_fires_model_not_ready_and_resolves_on_load(
    tmp_path: Path, store: Store
):
    rig = TritonRig(workdir=tmp_path / "rig",
                    extra_args=("--model-control-mode=explicit", "--load-model=*"))
    with rig, httpx.Client(base_url=rig.http_url, timeout=60) as triton:
        config = Config(targets=(TargetConfig(name="rig", metrics_url=rig.metrics_url,
                                              http_url=rig.http_url),),
                        nvml={"enabled": False})
        now = [time.time()]
        collector = Collector(config, store, clock=lambda: now[0])
        engine = Engine([ModelNotReadyRule(for_s=0.0)], store, eval_interval=15,
                        clock=lambda: now[0])

        def reading() -> list[str]:
            now[0] += 15.0
            asyncio.run(collector.read_api("rig"))
            store.flush()
            return [f"{e.status} {dict(e.labels)['model']}" for e in engine.evaluate(now[0])]

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
        [alert] = [s for s in engine.states() if s.status == "firing"]
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
        status = slo_status(store, Slo.from_spec(spec), now[0])
        assert (status.good, status.total) == (2.0, 3.0)
        server = SloSpec.model_validate({"name": "server-ready", "objective": 99,
                                         "sli": {"kind": "readiness", "server": True}})
        assert slo_status(store, Slo.from_spec(server), now[0]).compliance == 1.0
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
