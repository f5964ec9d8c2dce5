"""Model-config and statistics JSON from real captures (HTTP numbers, gRPC uint64 strings)."""

import json
from pathlib import Path

import pytest

from tritonwatch.collector.triton import (
    TritonApi,
    TritonApiError,
    parse_model_config,
    stats_families,
)
from tritonwatch.rig import TritonRig
from tritonwatch.schemas.samples import label_value

RIG = Path(__file__).parent.parent / "fixtures" / "rig"


def load(name):
    return json.loads((RIG / name).read_text())


@pytest.mark.parametrize("name", ["config-batcher-http.json", "config-batcher-grpc.json"])
def test_batcher_config_from_http_and_grpc_json(name):
    info = parse_model_config(load(name))
    assert info.name == "batcher"
    assert info.max_batch_size == 16
    assert info.preferred_batch_sizes == (4, 8)
    assert info.max_queue_delay_us == 20000  # a uint64 string in the gRPC capture
    assert info.instance_count == 1 and info.instance_kinds == ("KIND_CPU",)
    assert not info.decoupled and info.backend == "python"


def test_decoupled_llm_config():
    info = parse_model_config(load("config-fake_llm-http.json"))
    assert info.decoupled and info.max_batch_size == 0
    assert info.max_queue_delay_us is None  # no dynamic batcher: fill rate is N/A anyway


def flatten(families):
    return {(s.name, s.labels): s.value for f in families for s in f.samples}


def test_stats_http_and_grpc_give_the_same_counters():
    http = flatten(stats_families(load("stats-http.json")))
    grpc = flatten(stats_families(load("stats-grpc.json")))
    assert set(http) == set(grpc)  # same shape, whatever the JSON number encoding
    assert all(isinstance(v, float) for v in grpc.values())


def test_stats_counters_match_the_json():
    raw = load("stats-grpc.json")
    (batcher,) = [m for m in raw["model_stats"] if m["name"] == "batcher"]
    samples = flatten(stats_families(raw))
    base = (("model", "batcher"), ("version", "1"))
    assert samples[("triton_stats_inference_count", base)] == int(batcher["inference_count"])
    assert samples[("triton_stats_execution_count", base)] == int(batcher["execution_count"])
    queue_ns = int(batcher["inference_stats"]["queue"]["ns"])
    assert samples[("triton_stats_queue_ns", base)] == queue_ns
    # batch_stats: executions of each size are compute_infer.count (no top-level count key).
    executions = {
        label_value(labels, "batch_size"): value
        for (name, labels), value in samples.items()
        if name == "triton_stats_batch_executions" and label_value(labels, "model") == "batcher"
    }
    assert executions == {
        str(b["batch_size"]): int(b["compute_infer"]["count"]) for b in batcher["batch_stats"]
    }
    # The sum of size * executions equals inference_count: the exact fill-rate numerator.
    total = sum(int(size) * count for size, count in executions.items())
    assert total == int(batcher["inference_count"])


def test_missing_fields_count_as_zero():
    families = stats_families({"model_stats": [{"name": "m", "version": "1",
                                                 "inference_stats": {"fail": {}}}]})
    values = flatten(families)
    assert values[("triton_stats_fail_count", (("model", "m"), ("version", "1")))] == 0.0


def test_unreachable_api_is_a_clear_error(down_url):
    api = TritonApi("t9", http_url=down_url.removesuffix("/metrics"), grpc_url=None, timeout=1)
    # The first call of a reading is the server's health API (readiness is an SLI).
    with pytest.raises(TritonApiError, match=r"Triton API of 't9': is_server_live: .*refused"):
        api.read_blocking(0.0)


@pytest.mark.triton
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_live_read_from_the_rig(triton_rig, protocol):
    urls = {"http_url": triton_rig.http_url, "grpc_url": None} if protocol == "http" else \
        {"http_url": None, "grpc_url": triton_rig.grpc_url}
    reading = TritonApi("rig", **urls).read_blocking(123.0)
    assert reading.configs["batcher"].max_batch_size == 16
    assert reading.configs["fake_llm"].decoupled
    assert reading.stats.ts == 123.0
    names = {f.name for f in reading.stats.families}
    assert {"triton_stats_inference_count", "triton_stats_execution_count"} <= names


class FakeClient:
    """tritonclient's surface as TritonApi uses it, with a model unloaded mid-reading."""

    def __init__(self, index, configs, stats):
        self.index = index
        self.configs = configs
        self.stats = stats
        self.calls = []

    def is_server_live(self, **kwargs):
        self.calls.append("live")
        return True

    def is_server_ready(self, **kwargs):
        self.calls.append("ready")
        return True

    def get_model_repository_index(self, **kwargs):
        self.calls.append("index")
        return self.index

    def get_model_config(self, name, **kwargs):
        self.calls.append(f"config:{name}")
        if name not in self.configs:
            raise RuntimeError(f"[404] Request for unknown model: '{name}' is not found")
        return self.configs[name]

    def get_inference_statistics(self, **kwargs):
        self.calls.append("stats")
        return self.stats

    def close(self):
        pass


def test_explicit_mode_reads_only_ready_models_and_skips_one_unloaded_meanwhile(monkeypatch):
    client = FakeClient(
        index=[
            {"name": "batcher", "version": "1", "state": "READY"},
            {"name": "fake_llm"},  # EXPLICIT mode: in the repository, not loaded, no state
            {"name": "old", "version": "1", "state": "UNAVAILABLE", "reason": "unloaded"},
            {"name": "gone", "version": "1", "state": "READY"},  # unloaded after the index
        ],
        configs={"batcher": load("config-batcher-http.json")},
        stats=load("stats-http.json"),
    )
    api = TritonApi("t", http_url="http://127.0.0.1:1", grpc_url=None)
    monkeypatch.setattr(api, "_connect", lambda: client)
    reading = api.read_blocking(5.0)
    assert list(reading.configs) == ["batcher"] and list(reading.raw_configs) == ["batcher"]
    assert reading.configs["batcher"].max_batch_size == 16
    assert reading.stats.ts == 5.0 and reading.stats.families
    assert client.calls == ["live", "ready", "index", "config:batcher", "config:gone", "stats"]


@pytest.mark.triton
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_live_read_in_explicit_model_control_mode(tmp_path, protocol):
    # A second server: only `batcher` is loaded; `fake_llm` is in the repository index without
    # a state, and asking for its config is a 404 that used to fail the whole reading.
    rig = TritonRig(workdir=tmp_path, extra_args=("--model-control-mode=explicit",
                                                   "--load-model=batcher"))
    rig.models = ["batcher"]
    rig.start()
    try:
        api = TritonApi("rig", http_url=rig.http_url, grpc_url=None) if protocol == "http" \
            else TritonApi("rig", http_url=None, grpc_url=rig.grpc_url)
        reading = api.read_blocking(1.0)
    finally:
        rig.stop()
    assert list(reading.configs) == ["batcher"]
    assert reading.configs["batcher"].max_batch_size == 16
    assert "triton_stats_inference_count" in {f.name for f in reading.stats.families}
