"""Triton over gRPC: decoupled streaming (one response per token) and plain infer.

Streaming uses one ``tritonclient.grpc`` client and one bidirectional stream per session, kept
open across requests.  The callback runs on the stream's reader thread; it stamps the arrival
time first, then inspects the response.  Triton's empty final response
(``enable_empty_final_response``) only ends the request — it is not a token.
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
from tritonwatch.schemas.probes import InferInput, ProbeConfig

_NP_TYPES = {
    "BOOL": np.bool_, "INT8": np.int8, "INT16": np.int16, "INT32": np.int32, "INT64": np.int64,
    "UINT8": np.uint8, "UINT16": np.uint16, "UINT32": np.uint32, "UINT64": np.uint64,
    "FP16": np.float16, "FP32": np.float32, "FP64": np.float64, "BYTES": np.object_,
}


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
        dtype = _NP_TYPES.get(spec.datatype.upper(), np.float32)
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

    def __init__(self, config: ProbeConfig, url: str) -> None:
        self.config = config
        self.url = url.removeprefix("grpc://")
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

    def _stream_inputs(self, prompt: str) -> list[Any]:
        cfg = self.config
        text = grpcclient.InferInput(cfg.input_name, [1], "BYTES")
        text.set_data_from_numpy(np.array([prompt.encode()], dtype=np.object_))
        inputs = [text]
        if cfg.max_tokens_input:
            mt = grpcclient.InferInput(cfg.max_tokens_input, [1], "INT32")
            mt.set_data_from_numpy(np.array([cfg.max_tokens], dtype=np.int32))
            inputs.append(mt)
        if cfg.stream_input:
            st = grpcclient.InferInput(cfg.stream_input, [1], "BOOL")
            st.set_data_from_numpy(np.array([True], dtype=np.bool_))
            inputs.append(st)
        return inputs

    def request(self, prompt: str, request_id: str, rec: Recorder, timeout: float) -> None:
        if self.config.mode == "infer":
            self._infer(request_id, rec, timeout)
            return
        if not self._streaming:
            self._client.start_stream(
                callback=self._on_response, headers=self._headers
            )
            self._streaming = True
        inputs = self._stream_inputs(prompt)
        pending = _Pending(request_id, rec)
        self._pending = pending
        rec.start()
        try:
            self._client.async_stream_infer(
                self.config.model, inputs, model_version=self.config.model_version,
                request_id=request_id, enable_empty_final_response=True,
                parameters=self.config.parameters or None,
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


def _non_empty(value: Any) -> bool:
    return bool(value) if isinstance(value, bytes | str) else True


__all__ = ["GrpcSession"]
