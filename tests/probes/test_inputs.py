"""Planning a stream probe's inputs from a model's metadata and configuration (no server).

The metadata and configuration below are shaped as Triton returns them: HTTP JSON (integer
shapes, ``optional: false`` spelled out) and gRPC JSON (int64 as strings, defaults left out,
the configuration wrapped in ``{"config": ...}``).  tests/faults/test_probes.py sends the
planned requests to real models.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from tritonwatch.collector.probes.base import ProbeFailure
from tritonwatch.collector.probes.inputs import (
    ERROR_CODE,
    ModelInputs,
    PlanCache,
    RequestPlan,
    parse_model_inputs,
    plan_request,
)
from tritonwatch.schemas.probes import ProbeConfig


def _cfg(**kw: Any) -> ProbeConfig:
    kw.setdefault("max_tokens", 7)
    return ProbeConfig(name="p", url="127.0.0.1:1", model="m", **kw)


def _http(*inputs: tuple[str, str, list[int], bool], batch: bool = False) -> ModelInputs:
    """HTTP-style metadata and config for (name, TYPE_x, dims, optional) inputs."""
    meta = {"name": "m", "inputs": [
        {"name": n, "datatype": t.removeprefix("TYPE_").replace("STRING", "BYTES"),
         "shape": ([-1] if batch else []) + dims}
        for n, t, dims, _ in inputs
    ]}
    config = {"name": "m", "max_batch_size": 8 if batch else 0, "input": [
        {"name": n, "data_type": t, "dims": dims, "optional": opt} for n, t, dims, opt in inputs
    ]}
    return parse_model_inputs("m", meta, config)


def _sent(plan: RequestPlan) -> dict[str, tuple[str, tuple[int, ...], Any]]:
    return {i.name: (i.datatype, i.shape, i.value) for i in plan.inputs}


TEXT = ("text_input", "TYPE_STRING", [1], False)


def test_grpc_json_metadata_and_wrapped_config_are_read() -> None:
    meta = {"name": "ensemble", "inputs": [
        {"name": "text_input", "datatype": "BYTES", "shape": ["-1", "-1"]},
        {"name": "stream", "datatype": "BOOL", "shape": ["-1", "1"]},
    ]}
    config = {"config": {"max_batch_size": 64, "input": [
        {"name": "text_input", "data_type": "TYPE_STRING", "dims": ["-1"]},
        {"name": "stream", "data_type": "TYPE_BOOL", "dims": ["1"], "optional": True},
    ]}}
    declared = parse_model_inputs("ensemble", meta, config)
    assert [(i.name, i.datatype, i.shape, i.optional) for i in declared.inputs] == [
        ("text_input", "BYTES", (-1, -1), False), ("stream", "BOOL", (-1, 1), True),
    ]


def test_only_declared_inputs_are_sent_the_issue_model() -> None:
    # The model of issue 19 #15: no stream input, so none may be sent.
    plan = plan_request(_cfg(), _http(TEXT, ("max_tokens", "TYPE_INT32", [1], False)))
    assert _sent(plan) == {
        "text_input": ("BYTES", (1,), None), "max_tokens": ("INT32", (1,), 7),
    }
    assert plan.http_body("hi", "r1") == {"id": "r1", "text_input": "hi", "max_tokens": 7}


@pytest.mark.parametrize(("dtype", "np_type"), [
    ("TYPE_INT32", np.int32), ("TYPE_UINT32", np.uint32), ("TYPE_INT64", np.int64),
])
def test_max_tokens_goes_in_the_declared_integer_type(dtype: str, np_type: Any) -> None:
    plan = plan_request(_cfg(), _http(TEXT, ("max_tokens", dtype, [1], False)))
    [mt] = [i for i in plan.inputs if i.name == "max_tokens"]
    assert mt.array("").dtype == np_type and mt.array("").tolist() == [7]


def test_trtllm_ensemble_batch_dimension_and_optional_inputs_left_out() -> None:
    declared = _http(
        ("text_input", "TYPE_STRING", [-1], False), ("max_tokens", "TYPE_INT32", [-1], False),
        ("bad_words", "TYPE_STRING", [-1], True), ("end_id", "TYPE_INT32", [1], True),
        ("stream", "TYPE_BOOL", [1], True), batch=True,
    )
    plan = plan_request(_cfg(), declared)
    assert _sent(plan) == {
        "text_input": ("BYTES", (1, 1), None), "max_tokens": ("INT32", (1, 1), 7),
        "stream": ("BOOL", (1, 1), True),
    }
    [text] = [i for i in plan.inputs if i.is_prompt]
    assert text.array("héllo").tolist() == [["héllo".encode()]]


def test_vllm_max_tokens_goes_into_sampling_parameters_merged_with_the_users() -> None:
    declared = _http(
        TEXT, ("stream", "TYPE_BOOL", [1], True),
        ("sampling_parameters", "TYPE_STRING", [1], True),
        ("exclude_input_in_output", "TYPE_BOOL", [1], True),
    )
    plan = plan_request(_cfg(parameters={"sampling_parameters": {"temperature": 0}}), declared)
    sent = _sent(plan)
    assert set(sent) == {"text_input", "stream", "sampling_parameters"}
    assert json.loads(sent["sampling_parameters"][2]) == {"temperature": 0, "max_tokens": 7}
    assert plan.parameters == {}  # consumed, not also sent as a request parameter
    # As JSON text too, and an explicit max_tokens there wins over the probe's.
    plan = plan_request(_cfg(parameters={"sampling_parameters": '{"max_tokens": 3}'}), declared)
    assert json.loads(_sent(plan)["sampling_parameters"][2]) == {"max_tokens": 3}


def test_parameters_naming_an_input_fill_it_others_stay_request_parameters() -> None:
    declared = _http(TEXT, ("max_tokens", "TYPE_INT32", [1], False),
                     ("temperature", "TYPE_FP32", [1], False))
    plan = plan_request(_cfg(parameters={"temperature": 0.5, "priority": 2}), declared)
    assert _sent(plan)["temperature"] == ("FP32", (1,), 0.5)
    assert plan.parameters == {"priority": 2}
    assert plan.http_body("x", "r")["priority"] == 2


def test_a_required_input_the_probe_cannot_fill_names_model_and_input() -> None:
    declared = _http(TEXT, ("max_tokens", "TYPE_INT32", [1], False),
                     ("image", "TYPE_FP32", [3, 224, 224], False))
    with pytest.raises(ProbeFailure) as err:
        plan_request(_cfg(), declared)
    assert (err.value.kind, err.value.code) == ("protocol", ERROR_CODE)
    assert "model 'm'" in err.value.message and "image (FP32 [3, 224, 224])" in err.value.message
    assert "`parameters`" in err.value.message


def test_a_required_token_limit_under_another_name_gets_a_hint() -> None:
    declared = _http(TEXT, ("max_new_tokens", "TYPE_INT32", [1], False))
    with pytest.raises(ProbeFailure, match="max_tokens_input: max_new_tokens"):
        plan_request(_cfg(), declared)
    plan = plan_request(_cfg(max_tokens_input="max_new_tokens"), declared)
    assert _sent(plan)["max_new_tokens"] == ("INT32", (1,), 7)


def test_max_tokens_input_null_leaves_a_required_max_tokens_unfilled() -> None:
    declared = _http(TEXT, ("max_tokens", "TYPE_INT32", [1], False))
    with pytest.raises(ProbeFailure, match="requires input max_tokens"):
        plan_request(_cfg(max_tokens_input=None), declared)


@pytest.mark.parametrize(("declared", "message"), [
    (_http(("prompt", "TYPE_STRING", [1], False)), "declares no input 'text_input'"),
    (_http(("text_input", "TYPE_INT32", [-1], False)), "is not BYTES"),
])
def test_no_text_input_for_the_prompt(declared: ModelInputs, message: str) -> None:
    with pytest.raises(ProbeFailure, match=message):
        plan_request(_cfg(), declared)


@pytest.mark.parametrize(("dtype", "value"), [
    ("TYPE_INT32", True), ("TYPE_INT32", 1.5), ("TYPE_UINT32", -1), ("TYPE_INT8", 300),
    ("TYPE_BOOL", 1), ("TYPE_FP16", 1e6), ("TYPE_FP32", float("nan")), ("TYPE_FP32", "x"),
])
def test_a_parameter_that_does_not_fit_its_input_is_named(dtype: str, value: Any) -> None:
    declared = _http(TEXT, ("max_tokens", "TYPE_INT32", [1], True), ("knob", dtype, [1], True))
    with pytest.raises(ProbeFailure, match=r"parameters\.knob=.* does not fit input knob"):
        plan_request(_cfg(parameters={"knob": value}), declared)


def test_bytes_parameters_become_text_and_the_prompt_cannot_be_replaced() -> None:
    declared = _http(TEXT, ("stop_words", "TYPE_STRING", [-1], True))
    plan = plan_request(_cfg(parameters={"stop_words": ["</s>"]}), declared)
    assert _sent(plan)["stop_words"] == ("BYTES", (1,), '["</s>"]')
    with pytest.raises(ProbeFailure, match="would replace the prompt"):
        plan_request(_cfg(parameters={"text_input": "x"}), declared)


def test_malformed_or_oversized_metadata_is_a_protocol_error() -> None:
    with pytest.raises(ProbeFailure, match="lists no `inputs`"):
        parse_model_inputs("m", {"error": "x"}, {})
    with pytest.raises(ProbeFailure, match="malformed input"):
        parse_model_inputs("m", {"inputs": [{"name": "a", "shape": ["x"]}]}, {})
    many = {"inputs": [{"name": f"i{n}", "datatype": "BOOL", "shape": [1]} for n in range(300)]}
    with pytest.raises(ProbeFailure, match="300 inputs"):
        parse_model_inputs("m", many, {})
    huge = _http(TEXT, ("max_tokens", "TYPE_INT32", [100000], False))
    with pytest.raises(ProbeFailure, match="more than 4096 elements"):
        plan_request(_cfg(), huge)


def test_plan_cache_loads_once_and_again_after_invalidate() -> None:
    cache = PlanCache()
    loads: list[int] = []
    plan = RequestPlan("m", ())

    def load() -> RequestPlan:
        loads.append(1)
        return plan

    assert cache.get(load) is plan and cache.get(load) is plan and len(loads) == 1
    cache.invalidate()
    assert cache.get(load) is plan and len(loads) == 2

    def broken() -> RequestPlan:
        raise ProbeFailure("connect", "down")

    cache.invalidate()
    with pytest.raises(ProbeFailure):
        cache.get(broken)
    assert cache.get(load) is plan  # a failed load caches nothing
