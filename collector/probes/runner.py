"""Run a probe: warm, kept-alive sessions; ``requests`` spread over ``concurrency`` workers.

A :class:`ProbeRunner` keeps one session per concurrency slot between runs, so a scheduled
probe measures a warm connection like a busy client would, not a TCP/HTTP/2 handshake.  A new
session first sends ``warmup`` unmeasured requests.  A session that saw an error is closed
and replaced (a timed-out gRPC stream still has the old request in flight).  Triton stream
probes read the model's declared inputs (collector.probes.inputs) once per probe, and again
after any failed request.
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Callable

from tritonwatch.collector.probes.base import ProbeFailure, Recorder, Session
from tritonwatch.collector.probes.http_sse import HttpSession, OpenAISession
from tritonwatch.collector.probes.inputs import PlanCache
from tritonwatch.collector.probes.tokenizer import load_token_counter
from tritonwatch.schemas.config import Config
from tritonwatch.schemas.probes import ProbeConfig, ProbeResult

log = logging.getLogger(__name__)

OnResult = Callable[[ProbeResult], None]


def make_session(config: ProbeConfig, url: str, plans: PlanCache | None = None) -> Session:
    """A new session; ``plans`` shares the model's request plan between a probe's sessions."""
    if config.protocol == "grpc":
        # Imported on first use: tritonclient.grpc costs ~11 MB of RSS (see grpc_options).
        from tritonwatch.collector.probes.grpc_stream import GrpcSession

        return GrpcSession(config, url, plans)
    if config.protocol == "http":
        return HttpSession(config, url, plans)
    return OpenAISession(config, url)


def resolve_url(probe: ProbeConfig, config: Config | None = None) -> tuple[str, str]:
    """(target name, URL) of a probe: its own ``url`` or its target's endpoint."""
    if probe.url is not None:
        return probe.target or f"probe:{probe.name}", probe.url
    if config is None:
        raise ValueError(f"probe {probe.name!r} references a target but no config was given")
    for tc in config.targets:
        if tc.name == probe.target:
            url = tc.grpc_url if probe.protocol == "grpc" else tc.http_url
            if url is None:
                raise ValueError(f"target {tc.name!r} has no {probe.protocol} endpoint")
            return tc.name, url
    raise ValueError(f"probe {probe.name!r}: unknown target {probe.target!r}")


class ProbeRunner:
    """Owns the sessions of one probe.  ``run()`` may be called repeatedly, not concurrently."""

    def __init__(self, config: ProbeConfig, url: str, target: str | None = None) -> None:
        self.config = config
        self.url = url
        self.target = target or f"probe:{config.name}"
        self._sessions: list[Session | None] = [None] * config.concurrency
        self._ids = itertools.count()
        self._prompts = itertools.cycle(config.prompts)
        self._lock = threading.Lock()
        self._run_lock = threading.Lock()
        self._count_tokens = load_token_counter(config.tokenizer, config.name)
        # The model's inputs, read by the first session that needs them; read again after
        # any failed request (the model may have been reloaded with other inputs).
        self._plans = PlanCache()

    def _next(self) -> tuple[str, str]:
        with self._lock:
            return next(self._prompts), f"tw-{self.config.name}-{next(self._ids)}"

    def _one(self, session: Session) -> ProbeResult:
        prompt, request_id = self._next()
        rec = Recorder()
        try:
            session.request(prompt, request_id, rec, self.config.timeout)
        except ProbeFailure as exc:
            self._plans.invalidate()
            return rec.failure(self.config, self.target, request_id, exc)
        except Exception as exc:  # a client library bug must not kill the probe
            log.debug("probe %s: unexpected error", self.config.name, exc_info=True)
            self._plans.invalidate()
            failure = ProbeFailure("protocol", f"{type(exc).__name__}: {exc}")
            return rec.failure(self.config, self.target, request_id, failure)
        return rec.result(self.config, self.target, request_id, self._count_tokens)

    def _session(self, slot: int) -> Session:
        session = self._sessions[slot]
        if session is not None:
            return session
        session = make_session(self.config, self.url, self._plans)
        for _ in range(self.config.warmup):
            result = self._one(session)
            if not result.ok:
                # Start the measured request on a fresh session; a down server only costs
                # one failed warm-up.
                _close(session)
                session = make_session(self.config, self.url, self._plans)
                break
        self._sessions[slot] = session
        return session

    def _worker(self, slot: int, todo: itertools.count[int], n: int, sink: OnResult) -> None:
        while next(todo) < n:
            session = self._session(slot)
            result = self._one(session)
            if not result.ok:
                _close(session)
                self._sessions[slot] = None
            sink(result)

    def run(self, requests: int | None = None, on_result: OnResult | None = None
            ) -> list[ProbeResult]:
        """Send ``requests`` (default: the probe's) measured requests; return their results."""
        n = self.config.requests if requests is None else requests
        results: list[ProbeResult] = []
        results_lock = threading.Lock()

        def sink(result: ProbeResult) -> None:
            with results_lock:
                results.append(result)
            if on_result is not None:
                on_result(result)

        with self._run_lock:
            todo = itertools.count()
            workers = min(self.config.concurrency, n)
            if workers <= 1:
                self._worker(0, todo, n, sink)
            else:
                threads = [
                    threading.Thread(target=self._worker, args=(i, todo, n, sink),
                                     name=f"tw-probe-{self.config.name}-{i}", daemon=True)
                    for i in range(workers)
                ]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
        return results

    def close(self) -> None:
        with self._run_lock:
            for i, session in enumerate(self._sessions):
                if session is not None:
                    _close(session)
                self._sessions[i] = None


def _close(session: Session) -> None:
    try:
        session.close()
    except Exception:  # closing a broken connection may fail again; nothing to do about it
        log.debug("closing a probe session failed", exc_info=True)
