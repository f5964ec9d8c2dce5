"""HTTP probes: Triton ``generate_stream`` (SSE), Triton plain infer, OpenAI-compatible streams.

One ``httpx.Client`` per session, with a single kept-alive connection (a new connection per
request pushed p99 TTFT up by ~13 ms in GenAI-Perf comparisons).  The body is read as the
socket delivers it; each read is stamped with ``time.monotonic_ns()`` before it is parsed, and
every Server-Sent Event completed by that read carries that stamp.

A Triton ``generate_stream`` body holds one JSON key per input the model declares
(collector.probes.inputs), planned from the model's metadata and configuration.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import httpx

from tritonwatch.collector.probes.base import ProbeFailure, Recorder
from tritonwatch.collector.probes.inputs import (
    PlanCache,
    RequestPlan,
    parse_model_inputs,
    plan_request,
)
from tritonwatch.collector.scrape import redact_url
from tritonwatch.schemas.probes import ErrorKind, ProbeConfig

#: Largest model metadata or configuration answer read (bytes).
MAX_METADATA_BYTES = 1 << 20


class SSEParser:
    """Incremental Server-Sent Events parser: feed bytes, get each event's ``data`` text."""

    def __init__(self) -> None:
        self._buf = b""

    def feed(self, chunk: bytes) -> Iterator[str]:
        self._buf += chunk
        while True:
            # Events end with a blank line; servers use \n\n or \r\n\r\n.
            idx_n = self._buf.find(b"\n\n")
            idx_r = self._buf.find(b"\r\n\r\n")
            if idx_n < 0 and idx_r < 0:
                return
            if idx_r >= 0 and (idx_n < 0 or idx_r < idx_n):
                raw, self._buf = self._buf[:idx_r], self._buf[idx_r + 4 :]
            else:
                raw, self._buf = self._buf[:idx_n], self._buf[idx_n + 2 :]
            data = [
                line[5:].removeprefix(b" ")
                for line in raw.replace(b"\r\n", b"\n").split(b"\n")
                if line.startswith(b"data:")
            ]
            if data:
                yield b"\n".join(data).decode("utf-8", errors="replace")

    @property
    def pending(self) -> bool:
        return bool(self._buf.strip())


def _error_text(body: bytes) -> str:
    text = body.decode("utf-8", errors="replace").strip()
    for candidate in (text, *SSEParser().feed(body + b"\n\n")):
        try:
            data = json.loads(candidate)
        except ValueError:
            continue
        if isinstance(data, dict):
            err = data.get("error")
            if isinstance(err, dict):
                return str(err.get("message") or err)
            if err:
                return str(err)
    return text[:500] or "(empty body)"


class HttpSession:
    """Triton HTTP: ``/v2/models/M/generate_stream`` (stream) or ``/v2/models/M/infer``."""

    def __init__(self, config: ProbeConfig, url: str, plans: PlanCache | None = None) -> None:
        self.config = config
        self.base = url.rstrip("/")
        self._plans = plans if plans is not None else PlanCache()
        self._client = httpx.Client(
            headers=config.headers,
            timeout=httpx.Timeout(config.timeout),
            limits=httpx.Limits(max_connections=1, max_keepalive_connections=1),
        )

    def _model_path(self) -> str:
        cfg = self.config
        version = f"/versions/{cfg.model_version}" if cfg.model_version else ""
        return f"{self.base}/v2/models/{cfg.model}{version}"

    def _body(self, prompt: str, request_id: str) -> dict[str, Any]:
        cfg = self.config
        if cfg.mode == "infer":
            return {
                "id": request_id,
                "inputs": [
                    {"name": i.name, "datatype": i.datatype.upper(), "shape": list(i.shape),
                     "data": [i.value] * _numel(i.shape)}
                    for i in cfg.infer_inputs
                ],
                **({"parameters": cfg.parameters} if cfg.parameters else {}),
            }
        return self._plans.get(self._load_plan).http_body(prompt, request_id)

    def _load_plan(self) -> RequestPlan:
        path = self._model_path()
        metadata = _get_json(self._client, path, self.config.timeout)
        config = _get_json(self._client, path + "/config", self.config.timeout)
        return plan_request(self.config, parse_model_inputs(self.config.model, metadata, config))

    def request(self, prompt: str, request_id: str, rec: Recorder, timeout: float) -> None:
        cfg = self.config
        path = "/infer" if cfg.mode == "infer" else "/generate_stream"
        _stream_post(
            self._client, self._model_path() + path, self._body(prompt, request_id), rec,
            timeout, self._on_event if cfg.mode == "stream" else None, end_marker=None,
        )

    def _on_event(self, data: str, t_ns: int, rec: Recorder) -> bool:
        event = _event_object(data)
        if "error" in event:
            kind: ErrorKind = "truncated_stream" if rec.token_ns else "server_error"
            raise ProbeFailure(kind, str(event["error"]))
        out = event.get(self.config.output_name)
        if isinstance(out, list):
            out = "".join(str(x) for x in out)
        if out:
            rec.token(t_ns, out)
        return False

    def close(self) -> None:
        self._client.close()


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= max(d, 1)
    return n


def _transport_failure(exc: httpx.HTTPError, *, post: bool, stream: bool = False) -> ProbeFailure:
    """The classified failure for an HTTP error of the metadata GET or of the probe's POST.

    They differ on purpose: on the POST a connect timeout is a connect failure, not a slow
    answer; a ``stream`` cut short is truncated_stream; another HTTP error is a protocol failure
    there, a connect failure on the GET.
    """
    if isinstance(exc, httpx.ConnectError):
        return ProbeFailure("connect", str(exc) or type(exc).__name__)
    if post and isinstance(exc, httpx.ConnectTimeout):
        return ProbeFailure("connect", f"connect timed out: {exc}")
    if isinstance(exc, httpx.TimeoutException):
        return ProbeFailure("timeout", f"{type(exc).__name__}: {exc}")
    if post and isinstance(exc, httpx.RemoteProtocolError | httpx.ReadError):
        kind: ErrorKind = "truncated_stream" if stream else "connect"
        return ProbeFailure(kind, f"connection closed: {exc}")
    return ProbeFailure("protocol" if post else "connect", f"{type(exc).__name__}: {exc}")


def _get_json(client: httpx.Client, url: str, timeout: float) -> dict[str, Any]:
    """GET a JSON object of at most MAX_METADATA_BYTES; ProbeFailure (classified) otherwise."""
    try:
        with client.stream("GET", url, timeout=timeout) as resp:
            body = b""
            for chunk in resp.iter_bytes():
                body += chunk
                if len(body) > MAX_METADATA_BYTES:
                    raise ProbeFailure(
                        "protocol", f"{redact_url(url)}: answer exceeds {MAX_METADATA_BYTES} bytes"
                    )
            if resp.status_code >= 400:
                raise ProbeFailure("server_error", _error_text(body), str(resp.status_code))
    except httpx.HTTPError as exc:
        raise _transport_failure(exc, post=False) from None
    try:
        data = json.loads(body)
    except ValueError:
        data = None
    if not isinstance(data, dict):
        raise ProbeFailure(
            "protocol", f"{redact_url(url)}: answer is not a JSON object: {body[:200]!r}"
        )
    return data


def _event_object(data: str) -> dict[str, Any]:
    """One server-sent event's data as the JSON object both protocols send."""
    try:
        event = json.loads(data)
    except ValueError:
        raise ProbeFailure("protocol", f"event is not JSON: {data[:200]!r}") from None
    if not isinstance(event, dict):
        raise ProbeFailure("protocol", f"event is not an object: {data[:200]!r}")
    return event


def _stream_post(
    client: httpx.Client,
    url: str,
    body: dict[str, Any],
    rec: Recorder,
    timeout: float,
    on_event: Any,
    *,
    end_marker: str | None,
) -> None:
    """POST ``body``; with ``on_event`` read the answer as SSE, else as one response.

    ``on_event(data, t_ns, rec)`` returns True on the stream's end marker.  Without an
    ``end_marker`` the stream is complete when the server ends the body cleanly.
    """
    deadline_ns = time.monotonic_ns() + int(timeout * 1e9)
    payload = json.dumps(body).encode()
    headers = {"content-type": "application/json"}
    if on_event is not None:
        headers["accept"] = "text/event-stream"
    ended = False
    try:
        rec.start()
        with client.stream("POST", url, content=payload, headers=headers) as resp:
            if resp.status_code >= 400:
                raise ProbeFailure(
                    "server_error", _error_text(resp.read()), str(resp.status_code)
                )
            if on_event is None:
                resp.read()
                rec.end_ns = time.monotonic_ns()
                return
            parser = SSEParser()
            for chunk in resp.iter_bytes():
                t_ns = time.monotonic_ns()
                for data in parser.feed(chunk):
                    if end_marker is not None and data.strip() == end_marker:
                        ended = True
                        continue
                    if on_event(data, t_ns, rec):
                        ended = True
                if t_ns > deadline_ns:
                    raise ProbeFailure("timeout", f"stream still open after {timeout:g}s")
            if end_marker is None:
                ended = not parser.pending
    except httpx.HTTPError as exc:
        raise _transport_failure(exc, post=True, stream=on_event is not None) from None
    if not ended:
        raise ProbeFailure("truncated_stream", "stream ended without its end marker")
    if not rec.token_ns:
        raise ProbeFailure("empty_stream", "stream ended without any token")


class OpenAISession:
    """OpenAI-compatible ``/v1/chat/completions`` or ``/v1/completions`` with ``stream: true``."""

    def __init__(self, config: ProbeConfig, url: str) -> None:
        self.config = config
        self.base = url.rstrip("/").removesuffix("/v1")
        self._client = httpx.Client(
            headers=config.headers,
            timeout=httpx.Timeout(config.timeout),
            limits=httpx.Limits(max_connections=1, max_keepalive_connections=1),
        )

    def request(self, prompt: str, request_id: str, rec: Recorder, timeout: float) -> None:
        cfg = self.config
        body: dict[str, Any] = {"model": cfg.model, "max_tokens": cfg.max_tokens, "stream": True}
        if cfg.openai_endpoint == "chat":
            body["messages"] = [{"role": "user", "content": prompt}]
            url = f"{self.base}/v1/chat/completions"
        else:
            body["prompt"] = prompt
            url = f"{self.base}/v1/completions"
        body.update(cfg.parameters)
        _stream_post(self._client, url, body, rec, timeout, self._on_event, end_marker="[DONE]")

    def _on_event(self, data: str, t_ns: int, rec: Recorder) -> bool:
        event = _event_object(data)
        if event.get("error"):
            kind: ErrorKind = "truncated_stream" if rec.token_ns else "server_error"
            raise ProbeFailure(kind, _error_text(data.encode()))
        for choice in event.get("choices") or ():
            text = (choice.get("delta") or {}).get("content") or choice.get("text")
            if text:
                rec.token(t_ns, text)
                break
        return False

    def close(self) -> None:
        self._client.close()
