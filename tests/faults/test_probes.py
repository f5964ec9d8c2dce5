"""Issue 19 #15: probes against real models that declare different inputs.

One real tritonserver per module serves tests/fixtures/probe_models: the same small decoupled
Python model (probe_llm.py) behind several declared interfaces — the issue's model (text_input
and an INT32 max_tokens, no stream), a vLLM-like one (sampling_parameters JSON), a
TensorRT-LLM-like batching one, an INT64 one and one with a required input the probe cannot
fill.  Triton itself rejects undeclared inputs and wrong data types or shapes; the model logs
every request's inputs, so the tests also see exactly what was sent.
"""

from __future__ import annotations

import json
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import tritonclient.grpc as grpcclient

from tritonwatch.collector.probes.inputs import ERROR_CODE
from tritonwatch.collector.probes.runner import ProbeRunner
from tritonwatch.rig import TritonRig
from tritonwatch.schemas.probes import ProbeConfig, ProbeResult

pytestmark = pytest.mark.triton

MODELS = Path(__file__).resolve().parents[1] / "fixtures" / "probe_models"
#: A copy of text_max_tokens that one test reloads with another interface.
RELOADED = "reloadable"


@pytest.fixture(scope="module")
def probe_rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonRig]:
    """tritonserver on a model repository built from the fixtures: one model per .pbtxt."""
    repo = tmp_path_factory.mktemp("probe-models")
    configs = {p.stem: p for p in MODELS.glob("*.pbtxt")}
    configs[RELOADED] = MODELS / "text_max_tokens.pbtxt"
    for name, config in configs.items():
        (repo / name / "1").mkdir(parents=True)
        shutil.copyfile(config, repo / name / "config.pbtxt")
        shutil.copyfile(MODELS / "probe_llm.py", repo / name / "1" / "model.py")
    # Explicit model control (every model loaded at start) so a test can reload one.
    rig = TritonRig(
        model_repo=repo, workdir=tmp_path_factory.mktemp("probe-rig"),
        extra_args=("--model-control-mode=explicit", "--load-model=*"),
    )
    rig.start()
    try:
        yield rig
    finally:
        rig.stop()


def _config(rig: TritonRig, protocol: str, model: str, **kw: Any) -> ProbeConfig:
    # A new name per probe: request ids (name + counter) must not repeat within the log.
    return ProbeConfig(
        name=f"in-{protocol}-{uuid.uuid4().hex[:8]}", model=model, protocol=protocol,
        max_tokens=5, timeout=20, interval=30, warmup=0,
        url=rig.grpc_url if protocol == "grpc" else rig.http_url, **kw,
    )


def _run(config: ProbeConfig, n: int = 2) -> list[ProbeResult]:
    runner = ProbeRunner(config, config.url or "")
    try:
        return runner.run(n)
    finally:
        runner.close()


def _received(rig: TritonRig, results: list[ProbeResult]) -> list[dict[str, Any]]:
    """What the model logged for these requests: {input: {dtype, shape, value}} each."""
    ids = {r.request_id for r in results}
    return [e["inputs"] for e in rig.response_log() if e.get("request_id") in ids]


@pytest.mark.parametrize("protocol", ["grpc", "http"])
@pytest.mark.parametrize(("model", "expected"), [
    # The model: no stream input, so none may be sent ("expected 2 inputs but got 3").
    ("text_max_tokens", {"text_input": "object", "max_tokens": "int32"}),
    ("trtllm_like", {"text_input": "object", "max_tokens": "int32", "stream": "bool"}),
    ("int64_stream", {"text_input": "object", "max_tokens": "int64", "stream": "bool"}),
    ("vllm_like", {"text_input": "object", "stream": "bool", "sampling_parameters": "object"}),
])
def test_probe_sends_only_the_declared_inputs_in_their_types(
    probe_rig: TritonRig, protocol: str, model: str, expected: dict[str, str]
) -> None:
    results = _run(_config(probe_rig, protocol, model))
    assert all(r.ok for r in results), [r.error_message for r in results]
    # The model streams max_tokens tokens only when it got max_tokens (and stream) from us.
    assert [r.tokens for r in results] == [5, 5]
    received = _received(probe_rig, results)
    assert len(received) == 2
    for inputs in received:
        assert {name: i["dtype"] for name, i in inputs.items()} == expected
        if "max_tokens" in inputs:
            assert inputs["max_tokens"]["value"] == 5
        if "sampling_parameters" in inputs:
            assert json.loads(inputs["sampling_parameters"]["value"]) == {"max_tokens": 5}
    if model == "trtllm_like":  # a batching model: every input got its batch dimension
        assert all(i["shape"] == [1, 1] for i in received[0].values())
    # Nothing undeclared rode along as a request parameter either (HTTP's generate endpoint
    # turns a body key that names no input into one); "id" is the request id.
    params = [e["parameters"] for e in probe_rig.response_log()
              if e.get("request_id") in {r.request_id for r in results}]
    assert all(set(p) <= {"id"} for p in params), params


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_vllm_sampling_parameters_from_the_probe_parameters(
    probe_rig: TritonRig, protocol: str
) -> None:
    params = {"sampling_parameters": {"temperature": 0, "top_p": 0.9}}
    results = _run(_config(probe_rig, protocol, "vllm_like", parameters=params), 1)
    assert [r.tokens for r in results] == [5]
    [inputs] = _received(probe_rig, results)
    sampling = json.loads(inputs["sampling_parameters"]["value"])
    assert sampling == {"temperature": 0, "top_p": 0.9, "max_tokens": 5}


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_a_required_input_the_probe_cannot_fill_is_a_clear_error(
    probe_rig: TritonRig, protocol: str
) -> None:
    results = _run(_config(probe_rig, protocol, "needs_temperature"))
    for r in results:
        assert (r.ok, r.error_kind, r.error_code) == (False, "protocol", ERROR_CODE)
        message = r.error_message or ""
        assert "model 'needs_temperature'" in message and "temperature (FP32 [1])" in message
    # Nothing reached the model: the probe did not send a request it knew would fail.
    assert _received(probe_rig, results) == []
    # Given a value under `parameters`, the probe fills it (and max_tokens as a UINT32).
    results = _run(_config(probe_rig, protocol, "needs_temperature",
                           parameters={"temperature": 0.25}), 1)
    assert [(r.ok, r.tokens) for r in results] == [(True, 5)]
    [inputs] = _received(probe_rig, results)
    assert inputs["temperature"] == {"dtype": "float32", "shape": [1], "value": 0.25}
    assert inputs["max_tokens"]["dtype"] == "uint32"


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_a_model_reloaded_with_other_inputs_is_read_again_after_the_error(
    probe_rig: TritonRig, protocol: str
) -> None:
    client = grpcclient.InferenceServerClient(probe_rig.grpc_url)
    config = client.get_model_config(RELOADED, as_json=True)["config"]
    probe = _config(probe_rig, protocol, RELOADED)
    runner = ProbeRunner(probe, probe.url or "")
    try:
        [first] = runner.run(1)
        assert first.ok and first.tokens == 5
        # Same model, now with a required stream input: the cached plan leaves it out once,
        # Triton rejects that, and the probe reads the model again instead of failing forever.
        stream = {"name": "stream", "data_type": "TYPE_BOOL", "dims": ["1"]}
        changed = {**config, "input": [*config["input"], stream]}
        client.load_model(RELOADED, config=json.dumps(changed))
        [rejected] = runner.run(1)
        assert (rejected.ok, rejected.error_kind) == (False, "server_error")
        assert "stream" in (rejected.error_message or "")
        [again] = runner.run(1)
        assert again.ok and again.tokens == 5
        [inputs] = _received(probe_rig, [again])
        assert set(inputs) == {"text_input", "max_tokens", "stream"}
    finally:
        runner.close()
        client.load_model(RELOADED, config=json.dumps(config))
        client.close()


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_an_unknown_model_is_a_server_error_naming_it(probe_rig: TritonRig, protocol: str) -> None:
    # The metadata read fails first: classified like any request error, nothing cached.
    results = _run(_config(probe_rig, protocol, "no_such_model"))
    for r in results:
        assert (r.ok, r.error_kind) == (False, "server_error")
        assert "no_such_model" in (r.error_message or "")
