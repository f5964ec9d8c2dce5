"""The rig itself: a real tritonserver with the fake LLM and the dynamic-batching model."""

from __future__ import annotations

import json
import queue
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from prometheus_client.parser import text_string_to_metric_families

from tritonwatch.loadgen import LoadGenerator
from tritonwatch.rig import TritonRig

pytestmark = pytest.mark.triton


@dataclass
class StreamResult:
    request_id: str
    sent_ns: int
    token_ns: list[int] = field(default_factory=list)
    tokens: list[str] = field(default_factory=list)
    final: bool = False
    errors: list[str] = field(default_factory=list)

    @property
    def ttft_ms(self) -> float:
        return (self.token_ns[0] - self.sent_ns) / 1e6


def stream_one(rig: TritonRig, max_tokens: int | None = None, timeout: float = 20) -> StreamResult:
    """One fake_llm request over a gRPC stream, timed on CLOCK_MONOTONIC."""
    responses: queue.Queue[tuple[int, Any, Any]] = queue.Queue()
    client = grpcclient.InferenceServerClient(rig.grpc_url)
    try:
        client.start_stream(
            callback=lambda result, error: responses.put((time.monotonic_ns(), result, error))
        )
        text = grpcclient.InferInput("text_input", [1], "BYTES")
        text.set_data_from_numpy(np.array([b"hello rig"], dtype=np.object_))
        inputs = [text]
        if max_tokens is not None:
            mt = grpcclient.InferInput("max_tokens", [1], "INT32")
            mt.set_data_from_numpy(np.array([max_tokens], dtype=np.int32))
            inputs.append(mt)
        res = StreamResult(request_id=uuid.uuid4().hex, sent_ns=time.monotonic_ns())
        client.async_stream_infer(
            "fake_llm", inputs, request_id=res.request_id, enable_empty_final_response=True
        )
        deadline = time.monotonic() + timeout
        while not res.final and not res.errors and time.monotonic() < deadline:
            try:
                t_ns, result, error = responses.get(timeout=0.5)
            except queue.Empty:
                continue
            if error is not None:
                res.errors.append(str(error))
                break
            out = result.as_numpy("text_output")
            if out is not None:
                res.token_ns.append(t_ns)
                res.tokens.append(out.reshape(-1)[0].decode())
            res.final = result.get_response().parameters["triton_final_response"].bool_param
        return res
    finally:
        client.stop_stream(cancel_requests=False)
        client.close()


def scrape(rig: TritonRig) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """/metrics as {family: {sorted label items: value}} (no histograms or summaries here)."""
    text = httpx.get(rig.metrics_url, timeout=5).text
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for fam in text_string_to_metric_families(text):
        # Keyed by family: prometheus_client renames counter samples to <name>_total.
        for s in fam.samples:
            out.setdefault(fam.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def by_label(samples: dict[tuple[tuple[str, str], ...], float], label: str) -> dict[str, float]:
    return {dict(k)[label]: v for k, v in samples.items()}


def batch_counts(rig: TritonRig) -> dict[int, int]:
    client = grpcclient.InferenceServerClient(rig.grpc_url)
    try:
        stats = client.get_inference_statistics("batcher", as_json=True)
    finally:
        client.close()
    # gRPC -> JSON renders uint64 as strings.
    return {
        int(b["batch_size"]): int(b["compute_infer"]["count"])
        for b in stats["model_stats"][0].get("batch_stats", [])
    }


def test_server_and_models_ready(triton_rig: TritonRig) -> None:
    assert httpx.get(f"{triton_rig.http_url}/v2/health/ready").status_code == 200
    for model in ("batcher", "fake_llm"):
        assert httpx.get(f"{triton_rig.http_url}/v2/models/{model}/ready").status_code == 200
    client = grpcclient.InferenceServerClient(triton_rig.grpc_url)
    try:
        assert client.is_server_ready()
        config = client.get_model_config("batcher", as_json=True)["config"]
    finally:
        client.close()
    assert int(config["max_batch_size"]) == 16
    assert config["dynamic_batching"]["preferred_batch_size"] == [4, 8]
    ports = {triton_rig.http_port, triton_rig.grpc_port, triton_rig.metrics_port}
    assert len(ports) == 3
    assert triton_rig.last_start_seconds is not None


def test_grpc_stream_tokens_and_live_ttft(
    triton_rig: TritonRig, rig_control: Callable[..., dict[str, Any]]
) -> None:
    rig_control(tokens=6, ttft_ms=40, itl_ms=5)
    triton_rig.clear_response_log()
    fast = stream_one(triton_rig)
    assert not fast.errors
    assert fast.final
    assert fast.tokens == [f" tok{i}" for i in range(6)]
    # Loose bounds: a 2-core machine under a parallel test run can add tens of ms.
    assert 38 <= fast.ttft_ms < 40 + 250

    # The model's send times share the client's clock (CLOCK_MONOTONIC): each token was sent
    # after the request and received after it was sent.
    # The model writes each line just after sending its response, so the final line may land
    # after the client has the final response: wait for it (10 s at most).
    deadline = time.monotonic() + 10
    while True:
        log = [r for r in triton_rig.response_log() if r["request_id"] == fast.request_id]
        if len(log) >= 7 or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert [r["index"] for r in log] == list(range(7))
    assert [r["final"] for r in log] == [False] * 6 + [True]
    assert fast.sent_ns < log[0]["t_ns"] <= fast.token_ns[0]

    rig_control(ttft_ms=300)
    slow = stream_one(triton_rig, max_tokens=3)
    assert not slow.errors
    assert len(slow.tokens) == 3  # max_tokens input overrides the control file
    assert slow.ttft_ms >= 295  # the control file is read per request: live


def test_grpc_stream_injected_failure(
    triton_rig: TritonRig, rig_control: Callable[..., dict[str, Any]]
) -> None:
    rig_control(fail=True, ttft_ms=0)
    res = stream_one(triton_rig)
    assert res.errors and "injected failure" in res.errors[0]
    assert not res.tokens

    rig_control(fail=False, fail_after_tokens=2)
    res = stream_one(triton_rig, max_tokens=5)
    assert len(res.tokens) == 2
    assert res.errors and "after 2 tokens" in res.errors[0]


def test_generate_stream_sse(triton_rig: TritonRig) -> None:
    url = f"{triton_rig.http_url}/v2/models/fake_llm/generate_stream"
    body = {"text_input": "hello rig", "max_tokens": 4, "stream": True}
    events = []
    with httpx.stream("POST", url, json=body, timeout=20) as resp:
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        for line in resp.iter_lines():
            if line.startswith("data:"):
                events.append(json.loads(line[len("data:") :]))
    assert [e["text_output"] for e in events] == [" tok0", " tok1", " tok2", " tok3"]
    assert all(e["model_name"] == "fake_llm" for e in events)

    # Non-streaming generate: one response with the whole text.
    url = f"{triton_rig.http_url}/v2/models/fake_llm/generate"
    resp = httpx.post(url, json={"text_input": "hi", "max_tokens": 3, "stream": False}, timeout=20)
    assert resp.status_code == 200
    assert resp.json()["text_output"] == " tok0 tok1 tok2"


def test_generate_stream_sse_error(
    triton_rig: TritonRig, rig_control: Callable[..., dict[str, Any]]
) -> None:
    rig_control(fail=True, ttft_ms=0)
    url = f"{triton_rig.http_url}/v2/models/fake_llm/generate_stream"
    with httpx.stream("POST", url, json={"text_input": "x"}, timeout=20) as resp:
        lines = [line for line in resp.iter_lines() if line.startswith("data:")]
    assert resp.status_code == 400
    assert "injected failure" in json.loads(lines[0][len("data:") :])["error"]


def test_batcher_forms_batches_and_concurrency_shrinks_them(
    triton_rig: TritonRig, rig_load: Callable[..., LoadGenerator]
) -> None:
    before = batch_counts(triton_rig)
    gen = rig_load(concurrency=8)
    time.sleep(1.5)
    during = batch_counts(triton_rig)
    assert gen.stats().batcher.ok > 0
    grown = {bs: n - before.get(bs, 0) for bs, n in during.items() if bs > 1}
    assert sum(grown.values()) > 0, f"no batch > 1 formed: {during}"

    # One client at a time: the dynamic batcher can only form batches of 1.  Surplus workers
    # finish their request and exit: wait until no batch > 1 formed for 0.5 s (a fixed 0.5 s
    # wait lost that race on a busy machine), within a bound.
    gen.set(concurrency=1)
    settled = batch_counts(triton_rig)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        time.sleep(0.5)
        now = batch_counts(triton_rig)
        if {bs: n for bs, n in now.items() if bs > 1} == {
            bs: n for bs, n in settled.items() if bs > 1
        }:
            break
        settled = now
    time.sleep(1.0)
    after = batch_counts(triton_rig)
    assert after.get(1, 0) > settled.get(1, 0)
    assert all(after[bs] == settled.get(bs, 0) for bs in after if bs > 1), (settled, after)
    stats = gen.stats()
    assert stats.batcher.failed == 0, stats.last_error


def test_trt_llm_metric_families(
    triton_rig: TritonRig,
    rig_control: Callable[..., dict[str, Any]],
    rig_load: Callable[..., LoadGenerator],
) -> None:
    metrics = scrape(triton_rig)
    for family, label in [
        ("nv_trt_llm_kv_cache_block_metrics", "kv_cache_block_type"),
        ("nv_trt_llm_request_metrics", "request_type"),
        ("nv_trt_llm_inflight_batcher_metrics", "inflight_batcher_specific_metric"),
        ("nv_trt_llm_general_metrics", "general_type"),
    ]:
        assert family in metrics, family
        for labels in metrics[family]:
            assert dict(labels)["model"] == "fake_llm"
            assert dict(labels)["version"] == "1"
            assert label in dict(labels)

    rig_control(kv_used_fraction=0.8, kv_max_blocks=500)
    deadline = time.monotonic() + 30  # a bound, left as soon as the gauges moved
    while True:
        kv = by_label(
            scrape(triton_rig)["nv_trt_llm_kv_cache_block_metrics"], "kv_cache_block_type"
        )
        if (kv["max"] == 500 and kv["used"] >= 400) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert kv["max"] == 500
    assert kv["used"] + kv["free"] == kv["max"]
    assert kv["fraction"] == pytest.approx(kv["used"] / kv["max"])
    assert kv["fraction"] == pytest.approx(0.8, abs=0.05)

    # Live requests show up as active/scheduled and take KV blocks of their own.
    rig_control(ttft_ms=100, itl_ms=20, tokens=50)
    rig_load(concurrency=0, llm_concurrency=3)
    deadline = time.monotonic() + 30
    while True:
        metrics = scrape(triton_rig)
        req = by_label(metrics["nv_trt_llm_request_metrics"], "request_type")
        if req["active"] >= 2 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    kv = by_label(metrics["nv_trt_llm_kv_cache_block_metrics"], "kv_cache_block_type")
    assert req["active"] >= 2
    assert req["scheduled"] == min(req["active"], req["max"])
    assert req["waiting"] == req["active"] - req["scheduled"]
    assert kv["used"] > 400
    assert kv["used"] + kv["free"] == kv["max"]
    general = by_label(metrics["nv_trt_llm_general_metrics"], "general_type")
    assert general["iteration_counter"] > 0
    assert general["timestamp"] > 1.6e15  # microseconds since the epoch


def test_restart_keeps_ports_and_resets_counters(
    triton_rig: TritonRig, rig_load: Callable[..., LoadGenerator]
) -> None:
    client = grpcclient.InferenceServerClient(triton_rig.grpc_url)
    try:
        inp = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
        inp.set_data_from_numpy(np.ones((1, 4), dtype=np.float32))
        out = client.infer("batcher", [inp]).as_numpy("OUTPUT0")
    finally:
        client.close()
    assert out.tolist() == [[2.0] * 4]
    counts = by_label(scrape(triton_rig)["nv_inference_count"], "model")
    assert counts["batcher"] > 0

    ports = (triton_rig.http_port, triton_rig.grpc_port, triton_rig.metrics_port)
    pid = triton_rig.pid
    triton_rig.restart()
    assert (triton_rig.http_port, triton_rig.grpc_port, triton_rig.metrics_port) == ports
    assert triton_rig.pid != pid
    counts = by_label(scrape(triton_rig)["nv_inference_count"], "model")
    assert counts == {"batcher": 0, "fake_llm": 0}

    # Traffic survives a restart: the load generator counts errors and reconnects.
    gen = rig_load(concurrency=2, llm_concurrency=1)
    deadline = time.monotonic() + 30
    while gen.stats().llm.ok < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    triton_rig.restart()
    before = gen.stats()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        after = gen.stats()
        if after.batcher.ok > before.batcher.ok and after.llm.ok > before.llm.ok:
            break
        time.sleep(0.1)
    assert after.batcher.ok > before.batcher.ok, after
    assert after.llm.ok > before.llm.ok, after
    assert gen.running


def test_the_models_read_the_control_file_with_the_same_code() -> None:
    # Each model must carry its own copy of the reader (Triton loads model.py standalone): the
    # copies may not drift apart.
    import ast

    from tritonwatch.rig import DEFAULT_MODEL_REPO

    def control_class(model: str) -> str:
        tree = ast.parse((DEFAULT_MODEL_REPO / model / "1" / "model.py").read_text())
        (node,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "_Control"]
        return ast.dump(node)

    assert control_class("batcher") == control_class("fake_llm")


def test_control_defaults_match_the_models(triton_rig: TritonRig) -> None:
    # The models cannot import product code, so their DEFAULTS are copies: keep them in step.
    import ast

    from tritonwatch.rig import CONTROL_DEFAULTS

    merged: dict[str, Any] = {}
    for model in ("batcher", "fake_llm"):
        path = triton_rig.model_repo / model / "1" / "model.py"
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", "") == "DEFAULTS":
                assert node.value is not None
                merged.update(ast.literal_eval(node.value))
    assert merged == CONTROL_DEFAULTS
    assert triton_rig.read_control() == CONTROL_DEFAULTS
