"""Synthetic LLM probes: their configuration and the result of one probe request.  No I/O.

A probe sends requests to a model like a user would and times every response where it arrives
(``time.monotonic_ns()``).  Definitions (as GenAI-Perf states them):

- **TTFT**: first token's arrival - request sent.
- **ITL** of a request: the mean gap between consecutive tokens after the first,
  ``(t_last - t_first) / (tokens - 1)``; every single gap is kept too (``gaps_s``) so reports
  can also pool them across requests.
- **TPOT**: ``(e2e - TTFT) / (tokens - 1)``; equal to ITL here because e2e ends at the last
  token (Triton's empty final response is neither a token nor the end of the output).
- **e2e**: last token's arrival - request sent (non-streaming: the response's arrival).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from tritonwatch.schemas.values import (
    Frozen,
    check_headers,
    host_port,
    http_url,
    parse_duration,
)

Protocol = Literal["grpc", "http", "openai"]
Mode = Literal["stream", "infer"]
OpenAIEndpoint = Literal["chat", "completions"]

#: Error classes, in the order they are checked.
ErrorKind = Literal[
    "connect",  # no connection (refused, DNS, unreachable, TLS)
    "timeout",  # no complete answer before the probe's timeout
    "server_error",  # the server answered with an error (HTTP status, gRPC status, model error)
    "empty_stream",  # the stream ended without a single token
    "truncated_stream",  # tokens came, then an error or the stream ended without its end marker
    "protocol",  # an answer we could not understand
]
ERROR_KINDS: tuple[ErrorKind, ...] = (
    "connect", "timeout", "server_error", "empty_stream", "truncated_stream", "protocol",
)

#: A mix of short and long prompts, used when a probe configures none.
DEFAULT_PROMPTS: tuple[str, ...] = (
    "Hello!",
    "What is the capital of France?",
    "Summarise the following text in two sentences. " + "The quick brown fox jumps over the "
    "lazy dog while the cat watches from the warm windowsill and the rain keeps falling. " * 12,
)


class InferInput(Frozen):
    """One input tensor of a plain (non-streaming) infer probe, filled with one value."""

    name: str = Field(min_length=1)
    datatype: str = "FP32"
    shape: tuple[int, ...] = (1,)
    value: float | int | bool | str = 1.0


class ProbeConfig(Frozen):
    """One synthetic probe (``probes[]`` in ``tritonwatch.yaml``)."""

    # Header values are secrets: keep them out of ValidationError's text.
    model_config = ConfigDict(hide_input_in_errors=True)

    name: str = Field(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9_.:\-]+$")
    """Unique probe name; the ``probe`` label of its series."""
    target: str | None = None
    """A ``targets[].name``; its ``grpc_url``/``http_url`` is used unless ``url`` is set."""
    url: str | None = None
    """Own endpoint: ``host:port`` for grpc, ``http(s)://host:port`` for http and openai."""
    model: str = Field(min_length=1)
    model_version: str = ""
    protocol: Protocol = "grpc"
    mode: Mode = "stream"
    """``stream`` (token timings) or ``infer`` (one plain request, latency only)."""
    openai_endpoint: OpenAIEndpoint = "chat"
    """``/v1/chat/completions`` or ``/v1/completions`` (protocol openai)."""
    input_name: str = "text_input"
    output_name: str = "text_output"
    max_tokens_input: str | None = "max_tokens"
    """Input (tensor or JSON key) carrying ``max_tokens``; null to leave it out."""
    stream_input: str | None = "stream"
    """Boolean input asking the model to stream; null to leave it out."""
    max_tokens: int = Field(default=16, ge=1)
    parameters: dict[str, Any] = Field(default_factory=dict)
    """Extra request parameters (Triton request parameters / JSON body keys)."""
    infer_inputs: tuple[InferInput, ...] = ()
    """Inputs of a ``mode: infer`` probe (non-LLM models)."""
    prompts: tuple[str, ...] = DEFAULT_PROMPTS
    interval: float = Field(default=30.0, gt=0)
    timeout: float = Field(default=30.0, gt=0)
    """Deadline for one request, from sending it to its last response."""
    requests: int = Field(default=1, ge=1)
    """Requests per run (spread over ``concurrency`` connections)."""
    concurrency: int = Field(default=1, ge=1, le=256)
    warmup: int = Field(default=1, ge=0)
    """Requests per new connection that are sent but not measured."""
    labels: dict[str, str] = Field(default_factory=dict)
    headers: dict[str, str] = Field(default_factory=dict)
    """Extra request headers / gRPC metadata; values are never logged and must not contain
    CR, LF or other control characters."""
    tokenizer: str | None = None
    """Path to a local ``tokenizer.json`` (Hugging Face format) to count output tokens with;
    unset, or unavailable at run time: streamed chunks count as tokens."""
    ttft_slo: float | None = Field(default=None, gt=0)
    """TTFT threshold (s): each request counts as a good or bad SLO event."""
    itl_slo: float | None = Field(default=None, gt=0)
    """ITL threshold (s) for SLO events."""

    @field_validator("interval", "timeout", "ttft_slo", "itl_slo", mode="before")
    @classmethod
    def _duration(cls, value: Any) -> Any:
        return None if value is None else parse_duration(value)

    @field_validator("headers")
    @classmethod
    def _headers(cls, value: dict[str, str]) -> dict[str, str]:
        return check_headers(value)

    @field_validator("prompts")
    @classmethod
    def _prompts(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if not value:
            raise ValueError("at least one prompt is needed")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> ProbeConfig:
        if self.target is None and self.url is None:
            raise ValueError("set `target` (a configured target) or `url`")
        if self.url is not None:
            validate_probe_url(self.protocol, self.url)
        if self.protocol == "openai" and self.mode == "infer":
            raise ValueError("protocol openai has no plain infer mode")
        if self.mode == "infer" and not self.infer_inputs:
            raise ValueError("mode infer needs `infer_inputs`")
        if self.timeout > self.interval:
            raise ValueError(
                f"timeout ({self.timeout:g}s) must not exceed interval ({self.interval:g}s)"
            )
        return self


def validate_probe_url(protocol: str, url: str) -> str:
    """``host:port`` for grpc, an http(s) URL otherwise; ValueError quoting ``url``."""
    if protocol == "grpc":
        address = url.removeprefix("grpc://")
        if "://" in address:
            raise ValueError(f"{url!r} is not host:port")
        return host_port(address)
    return http_url(url)


@dataclass(frozen=True, slots=True)
class ProbeResult:
    """The outcome of one probe request.  Durations in seconds; None where not applicable."""

    probe: str
    target: str
    model: str
    protocol: str
    ts: float  # unix seconds when the request was sent
    ok: bool
    tokens: int = 0
    ttft_s: float | None = None
    itl_s: float | None = None  # per-request mean gap (GenAI-Perf ITL)
    tpot_s: float | None = None
    e2e_s: float | None = None
    gaps_s: tuple[float, ...] = ()
    error_kind: ErrorKind | None = None
    error_code: str | None = None
    error_message: str | None = None
    request_id: str = ""
    t0_ns: int = 0  # monotonic send time, for matching against server-side logs

    @property
    def tokens_per_s(self) -> float | None:
        if self.e2e_s is None or self.e2e_s <= 0 or not self.tokens:
            return None
        return self.tokens / self.e2e_s
