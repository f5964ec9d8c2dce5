"""What every probe session shares: the timestamp recorder and error classification.

A session stamps ``time.monotonic_ns()`` at the point each response arrives — in the gRPC
stream's reader-thread callback, right after the HTTP client returned the bytes holding an SSE
event — and hands the stamps to a :class:`Recorder`, which turns them into a
:class:`~schemas.probes.ProbeResult`.  Errors are raised as :class:`ProbeFailure` carrying
their class (``schemas.probes.ErrorKind``), code and message.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from itertools import pairwise
from typing import Protocol

from tritonwatch.schemas.probes import ErrorKind, ProbeConfig, ProbeResult


class ProbeFailure(Exception):
    """A classified probe error."""

    def __init__(self, kind: ErrorKind, message: str, code: str | None = None) -> None:
        super().__init__(f"{kind}: {message}" + (f" ({code})" if code else ""))
        self.kind: ErrorKind = kind
        self.message = message
        self.code = code


class Recorder:
    """Arrival times of one request's responses, all on the monotonic nanosecond clock."""

    __slots__ = ("end_ns", "t0_ns", "texts", "token_ns", "wall0")

    def __init__(self) -> None:
        self.wall0 = time.time()
        self.t0_ns = time.monotonic_ns()
        self.token_ns: list[int] = []
        # The raw text of each streamed chunk, kept only for a configured tokenizer; decoded
        # after the request, so the arrival callbacks stay as short as possible.
        self.texts: list[object] = []
        self.end_ns: int | None = None  # arrival of a non-token final answer (infer mode)

    def token(self, t_ns: int, text: object) -> None:
        """A streamed chunk with text arrived at ``t_ns`` (stamped by the caller on arrival)."""
        self.token_ns.append(t_ns)
        self.texts.append(text)

    def output_text(self) -> str:
        return "".join(
            t.decode("utf-8", "replace") if isinstance(t, bytes) else str(t) for t in self.texts
        )

    def start(self) -> None:
        """Stamp the send time; call right before the request leaves."""
        self.wall0 = time.time()
        self.t0_ns = time.monotonic_ns()

    def result(
        self, config: ProbeConfig, target: str, request_id: str,
        count_tokens: Callable[[str], int] | None = None,
    ) -> ProbeResult:
        """The timings of a request that finished (tokens, or one plain response).

        Output tokens are the streamed chunks, or what ``count_tokens`` (a configured
        tokenizer) makes of the whole output text.  ITL stays the mean gap between chunks
        (what was observed); TPOT divides by the token count, as GenAI-Perf does.
        """
        toks = self.token_ns
        if not toks:
            end = self.end_ns if self.end_ns is not None else time.monotonic_ns()
            return ProbeResult(
                probe=config.name, target=target, model=config.model, protocol=config.protocol,
                ts=self.wall0, ok=True, e2e_s=(end - self.t0_ns) / 1e9,
                request_id=request_id, t0_ns=self.t0_ns,
            )
        ttft = (toks[0] - self.t0_ns) / 1e9
        e2e = (toks[-1] - self.t0_ns) / 1e9
        gaps = tuple((b - a) / 1e9 for a, b in pairwise(toks))
        itl = (toks[-1] - toks[0]) / 1e9 / len(gaps) if gaps else None
        tokens = len(toks)
        if count_tokens is not None and self.texts:
            tokens = max(1, count_tokens(self.output_text()))
        tpot = (e2e - ttft) / (tokens - 1) if tokens > 1 else None
        return ProbeResult(
            probe=config.name, target=target, model=config.model, protocol=config.protocol,
            ts=self.wall0, ok=True, tokens=tokens, ttft_s=ttft, itl_s=itl, tpot_s=tpot,
            e2e_s=e2e, gaps_s=gaps, request_id=request_id, t0_ns=self.t0_ns,
        )

    def failure(
        self, config: ProbeConfig, target: str, request_id: str, exc: ProbeFailure
    ) -> ProbeResult:
        toks = self.token_ns
        return ProbeResult(
            probe=config.name, target=target, model=config.model, protocol=config.protocol,
            ts=self.wall0, ok=False, tokens=len(toks),
            ttft_s=(toks[0] - self.t0_ns) / 1e9 if toks else None,
            error_kind=exc.kind, error_code=exc.code, error_message=exc.message[:1000],
            request_id=request_id, t0_ns=self.t0_ns,
        )


class Session(Protocol):
    """One connection (and, for gRPC, one stream) of a probe.  Not thread-safe: one user."""

    def request(self, prompt: str, request_id: str, rec: Recorder, timeout: float) -> None:
        """Send one request and stamp its responses into ``rec``; raise ProbeFailure."""
        ...

    def close(self) -> None: ...
