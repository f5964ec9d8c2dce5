"""Triton over gRPC: decoupled streaming (one response per token) and plain infer.

Streaming uses one ``tritonclient.grpc`` client and one bidirectional stream per session, kept
open across requests.  Its requests carry only the inputs the model declares (planned by
collector.probes.inputs from the model's metadata and configuration).  The callback runs on
the stream's reader thread; it stamps the arrival time first, then inspects the response.
Triton's empty final response (``enable_empty_final_response``) only ends the request — it is
not a token.
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tritonwatch.collector.grpc_options import channel_args
from tritonwatch.collector.probes.base import ProbeFailure, Recorder
from tritonwatch.collector.probes.inputs import (
    NP_TYPES,
    PlanCache,
    RequestPlan,
    parse_model_inputs,
    plan_request,
)
from tritonwatch.schemas.probes import InferInput, ProbeConfig


def _classify(exc: InferenceServerException, tokens: int) -> ProbeFailure:
    status = exc.status()
    message = str(exc.message() or exc)
    code = str(status) if status else None
    if status is None:
        # A model's error response: the stream itself is fine.
        return ProbeFailure("truncated_stream" if tokens else "server_error", message)
    text = f"{status} {message}".lower()
    if "deadline" in text:
        return ProbeFailure("timeout", message, code)
    if "unavailable" in text and ("connect" in text or "refused" in text or "dns" in text):
        return ProbeFailure("connect", message, code)
    if "unavailable" in text or "cancelled" in text:
        return ProbeFailure("truncated_stream" if tokens else "connect", message, code)
    return ProbeFailure("truncated_stream" if tokens else "server_error", message, code)


def _infer_inputs(specs: tuple[InferInput, ...]) -> list[Any]:
    inputs = []
    for spec in specs:
        dtype = NP_TYPES.get(spec.datatype.upper(), np.float32)
        value: Any = spec.value.encode() if isinstance(spec.value, str) else spec.value
        data: Any = np.full(spec.shape, value, dtype=dtype)
        inp = grpcclient.InferInput(spec.name, list(spec.shape), spec.datatype.upper())
        inp.set_data_from_numpy(data)
        inputs.append(inp)
    return inputs


class _Pending:
    __slots__ = ("done", "error", "rec", "request_id")

    def __init__(self, request_id: str, rec: Recorder) -> None:
        self.request_id = request_id
        self.rec = rec
        self.done = threading.Event()
        self.error: InferenceServerException | None = None


class GrpcSession:
    """One gRPC client (one HTTP/2 connection) with one open stream."""

    def __init__(self, config: ProbeConfig, url: str, plans: PlanCache | None = None) -> None:
        self.config = config
        self.url = url.removeprefix("grpc://")
        self._plans = plans if plans is not None else PlanCache()
        self._plan: RequestPlan | None = None
        self._constants: list[Any] = []  # the plan's constant inputs, built once per plan
        self._client: Any = grpcclient.InferenceServerClient(self.url, channel_args=channel_args())
        self._pending: _Pending | None = None
        self._stream_error: InferenceServerException | None = None
        self._streaming = False
        headers = dict(config.headers) or None
        self._headers = headers
        self._infer_inputs = _infer_inputs(config.infer_inputs) if config.mode == "infer" else []

    # The reader thread calls this for every response and for stream errors.
    def _on_response(self, result: Any, error: InferenceServerException | None) -> None:
        t_ns = time.monotonic_ns()
        pending = self._pending
        if pending is None:
            if error is not None:
                self._stream_error = error  # e.g. the stream failed to connect
            return
        if error is not None:
            pending.error = error
            pending.done.set()
            return
        response = result.get_response()
        if response.id != pending.request_id:
            return  # a late answer to an abandoned request
        out = result.as_numpy(self.config.output_name)
        if out is not None and out.size and any(_non_empty(v) for v in out.reshape(-1)):
            pending.rec.token(t_ns, out.reshape(-1)[0])
        final = response.parameters.get("triton_final_response")
        if final is not None and final.bool_param:
            pending.rec.end_ns = t_ns
            pending.done.set()

    def _load_plan(self) -> RequestPlan:
        cfg = self.config
        try:
            metadata = self._client.get_model_metadata(
                cfg.model, cfg.model_version, headers=self._headers, as_json=True,
                client_timeout=cfg.timeout,
            )
            config = self._client.get_model_config(
                cfg.model, cfg.model_version, headers=self._headers, as_json=True,
                client_timeout=cfg.timeout,
            )
        except InferenceServerException as exc:
            raise _classify(exc, 0) from None
        return plan_request(cfg, parse_model_inputs(cfg.model, metadata, config))

    def _stream_inputs(self, prompt: str) -> tuple[list[Any], RequestPlan]:
        plan = self._plans.get(self._load_plan)
        if plan is not self._plan:
            self._plan, self._constants = plan, []
            for spec in plan.inputs:
                if not spec.is_prompt:
                    self._constants.append(_tensor(spec.name, spec.datatype, spec.array("")))
        [text] = [s for s in plan.inputs if s.is_prompt]
        return [_tensor(text.name, "BYTES", text.array(prompt)), *self._constants], plan

    def request(self, prompt: str, request_id: str, rec: Recorder, timeout: float) -> None:
        if self.config.mode == "infer":
            self._infer(request_id, rec, timeout)
            return
        # Before the stream opens: a model the probe cannot feed costs no stream.
        inputs, plan = self._stream_inputs(prompt)
        if not self._streaming:
            self._client.start_stream(
                callback=self._on_response, headers=self._headers
            )
            self._streaming = True
        pending = _Pending(request_id, rec)
        self._pending = pending
        rec.start()
        try:
            self._client.async_stream_infer(
                self.config.model, inputs, model_version=self.config.model_version,
                request_id=request_id, enable_empty_final_response=True,
                parameters=dict(plan.parameters) or None,
            )
        except InferenceServerException as exc:
            # The stream broke before this request: the callback got the reason.
            self._pending = None
            raise _classify(self._stream_error or exc, 0) from None
        finished = pending.done.wait(timeout)
        self._pending = None
        if not finished:
            raise ProbeFailure("timeout", f"no final response within {timeout:g}s")
        if pending.error is not None:
            raise _classify(pending.error, len(rec.token_ns))
        if not rec.token_ns:
            raise ProbeFailure("empty_stream", "final response without any token")

    def _infer(self, request_id: str, rec: Recorder, timeout: float) -> None:
        rec.start()
        try:
            self._client.infer(
                self.config.model, self._infer_inputs, model_version=self.config.model_version,
                request_id=request_id, client_timeout=timeout, headers=self._headers,
                parameters=self.config.parameters or None,
            )
        except InferenceServerException as exc:
            raise _classify(exc, 0) from None
        rec.end_ns = time.monotonic_ns()

    def close(self) -> None:
        client, self._client = self._client, None
        if client is None:
            return
        stream = getattr(client, "_stream", None)
        if self._streaming:
            with contextlib.suppress(Exception):
                client.stop_stream(cancel_requests=True)
        # tritonclient does not end a cancelled stream's request iterator: its gRPC thread
        # would wait forever on the queue (one leaked thread per closed stream).
        request_queue = getattr(stream, "_request_queue", None)
        if request_queue is not None:
            request_queue.put(None)
        with contextlib.suppress(Exception):
            client.close()


def _tensor(name: str, datatype: str, data: np.ndarray) -> Any:
    tensor = grpcclient.InferInput(name, list(data.shape), datatype)
    tensor.set_data_from_numpy(data)
    return tensor


def _non_empty(value: Any) -> bool:
    return bool(value) if isinstance(value, bytes | str) else True


__all__ = ["GrpcSession"]
