"""Background traffic for the rig's models, for tests, ``tritonwatch demo`` and benchmarks.

Two kinds of worker threads, each with its own gRPC client:

- ``batcher``: closed-loop batch-1 infers (optionally paced to ``rate`` requests/s in total), so
  Triton's dynamic batcher forms the batches; batch sizes are bounded by ``concurrency``.
- ``llm``: streaming requests to ``fake_llm`` over a gRPC stream, waiting for the final response
  before sending the next (optionally paced to ``llm_rate`` requests/s in total).

Concurrency changes live with :meth:`LoadGenerator.set`. Workers are daemon threads; an error
(including the server going away during a restart) is counted, followed by a short back-off and a
fresh client, never by a crash. A run ends on :meth:`LoadGenerator.stop` or after
``max_duration`` seconds, whichever comes first.
"""

from __future__ import annotations

import collections
import functools
import itertools
import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient

from tritonwatch.collector.grpc_options import channel_args
from tritonwatch.lifecycle import StartStop

log = logging.getLogger(__name__)

KINDS = ("batcher", "llm")


@dataclass
class KindStats:
    sent: int = 0
    ok: int = 0
    failed: int = 0


@dataclass
class LoadStats:
    """A snapshot of the counters; TTFT/ITL are client-side, for the latest LLM requests."""

    batcher: KindStats = field(default_factory=KindStats)
    llm: KindStats = field(default_factory=KindStats)
    llm_ttft_ms: list[float] = field(default_factory=list)
    llm_itl_ms: list[float] = field(default_factory=list)
    last_error: str | None = None


class LoadGenerator(StartStop):
    """Drives ``batcher`` and ``fake_llm`` on a Triton server (normally a :class:`TritonRig`)."""

    def __init__(
        self,
        grpc_url: str,
        *,
        concurrency: int = 4,
        llm_concurrency: int = 0,
        rate: float | None = None,
        llm_rate: float | None = None,
        max_tokens: int | None = None,
        batcher_model: str = "batcher",
        llm_model: str = "fake_llm",
        max_duration: float = 600.0,
        request_timeout: float = 30.0,
        backoff: float = 0.5,
    ) -> None:
        self.grpc_url = grpc_url
        self.batcher_model = batcher_model
        self.llm_model = llm_model
        self.max_tokens = max_tokens
        self.max_duration = max_duration
        self.request_timeout = request_timeout
        self.backoff = backoff
        self._target = {"batcher": concurrency, "llm": llm_concurrency}
        self._rate: dict[str, float | None] = {"batcher": rate, "llm": llm_rate}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: dict[tuple[str, int], threading.Thread] = {}
        self._stats = {k: KindStats() for k in KINDS}
        self._ttft: collections.deque[float] = collections.deque(maxlen=500)
        self._itl: collections.deque[float] = collections.deque(maxlen=2000)
        self._last_error: str | None = None
        self._deadline = 0.0
        self._started = False

    # -- control -------------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return self._started and not self._stop.is_set() and time.monotonic() < self._deadline

    def start(self) -> None:
        with self._lock:
            if self._started:
                return
            self._started = True
            self._stop.clear()
            self._deadline = time.monotonic() + self.max_duration
            self._spawn_locked()

    def set(
        self,
        *,
        concurrency: int | None = None,
        llm_concurrency: int | None = None,
        rate: float | None = None,
        llm_rate: float | None = None,
        max_tokens: int | None = None,
    ) -> None:
        """Change the load live. Surplus workers finish their current request and exit.

        ``rate``/``llm_rate`` of 0 turn pacing off again (closed loop); None leaves them as is.
        """
        with self._lock:
            if concurrency is not None:
                self._target["batcher"] = max(0, concurrency)
            if llm_concurrency is not None:
                self._target["llm"] = max(0, llm_concurrency)
            if rate is not None:
                self._rate["batcher"] = rate or None
            if llm_rate is not None:
                self._rate["llm"] = llm_rate or None
            if max_tokens is not None:
                self.max_tokens = max_tokens
            if self._started and not self._stop.is_set():
                self._spawn_locked()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop every worker and wait for them (each finishes or abandons its request)."""
        self._stop.set()
        with self._lock:
            threads = list(self._threads.values())
            self._started = False
        end = time.monotonic() + timeout
        for t in threads:
            t.join(max(0.0, end - time.monotonic()))
        with self._lock:
            self._threads = {k: t for k, t in self._threads.items() if t.is_alive()}
        if self._threads:
            log.warning("%d load generator threads still busy after stop()", len(self._threads))

    def stats(self) -> LoadStats:
        with self._lock:
            return LoadStats(
                batcher=KindStats(**vars(self._stats["batcher"])),
                llm=KindStats(**vars(self._stats["llm"])),
                llm_ttft_ms=list(self._ttft),
                llm_itl_ms=list(self._itl),
                last_error=self._last_error,
            )

    # -- workers ---------------------------------------------------------------------------------

    def _spawn_locked(self) -> None:
        for kind in KINDS:
            for i in range(self._target[kind]):
                t = self._threads.get((kind, i))
                if t is not None and t.is_alive():
                    continue
                fn = self._batcher_worker if kind == "batcher" else self._llm_worker
                t = threading.Thread(
                    target=fn, args=(i,), name=f"tritonwatch-load-{kind}-{i}", daemon=True
                )
                self._threads[(kind, i)] = t
                t.start()

    def _keep_going(self, kind: str, index: int) -> bool:
        if self._stop.is_set() or time.monotonic() >= self._deadline:
            return False
        with self._lock:
            return index < self._target[kind]

    def _connect(self) -> Any:
        return grpcclient.InferenceServerClient(self.grpc_url, channel_args=channel_args())

    def _first_slot(self, kind: str, index: int) -> float:
        """Paced workers start 1/rate apart, so open-loop traffic arrives evenly spread and not
        in bursts of the worker count (which would form the same batches whatever the model's
        execution time)."""
        with self._lock:
            rate = self._rate[kind]
        return time.monotonic() + (index / rate if rate else 0.0)

    def _pace(self, kind: str, next_start: float) -> float:
        """Sleep until ``next_start`` if this kind is rate-limited; return the next slot."""
        with self._lock:
            rate, workers = self._rate[kind], max(self._target[kind], 1)
        if not rate:
            return time.monotonic()
        now = time.monotonic()
        if next_start > now:
            self._stop.wait(next_start - now)
        # Each worker takes every workers-th slot of the total rate; never bank missed slots.
        return max(next_start, time.monotonic() - 1.0) + workers / rate

    def _count(self, kind: str, outcome: str, error: BaseException | str | None = None) -> None:
        with self._lock:
            stats = self._stats[kind]
            setattr(stats, outcome, getattr(stats, outcome) + 1)
            if error is not None:
                self._last_error = f"{kind}: {error}"

    def _batcher_worker(self, index: int) -> None:
        client: Any = None
        data = np.ones((1, 4), dtype=np.float32)
        next_start = self._first_slot("batcher", index)
        while self._keep_going("batcher", index):
            next_start = self._pace("batcher", next_start)
            if not self._keep_going("batcher", index):
                break
            try:
                if client is None:
                    client = self._connect()
                inp = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
                inp.set_data_from_numpy(data)
                self._count("batcher", "sent")
                client.infer(self.batcher_model, [inp], client_timeout=self.request_timeout)
                self._count("batcher", "ok")
            except Exception as exc:  # server restarts, injected failures, timeouts
                self._count("batcher", "failed", exc)
                _close(client)
                client = None
                self._stop.wait(self.backoff)
        _close(client)

    def _llm_worker(self, index: int) -> None:
        client: Any = None
        responses: queue.Queue[tuple[int, Any, Any]] = queue.Queue()
        seq = 0
        next_start = self._first_slot("llm", index)
        while self._keep_going("llm", index):
            next_start = self._pace("llm", next_start)
            if not self._keep_going("llm", index):
                break
            seq += 1
            try:
                if client is None:
                    client = self._connect()
                    # A queue per stream: late callbacks of a closed stream (e.g. its CANCELLED
                    # error) must not be taken for answers to the next stream's requests.
                    responses = queue.Queue()
                    client.start_stream(callback=functools.partial(_on_response, responses))
                ok, err, broken = self._one_stream_request(client, responses, f"lg-{index}-{seq}")
                if err == "stopped":
                    break  # abandoned because of stop(): neither ok nor failed
                if ok:
                    self._count("llm", "ok")
                else:
                    self._count("llm", "failed", err)
                    # Close the stream after any error: a stopping server answers every request
                    # on an open stream with an error but cannot finish shutting down until the
                    # client closes it. Back off longer when the stream itself broke.
                    _close(client)
                    client = None
                    self._stop.wait(self.backoff if broken else 0.05)
            except Exception as exc:
                self._count("llm", "failed", exc)
                _close(client)
                client = None
                self._stop.wait(self.backoff)
        _close(client)

    def _one_stream_request(
        self, client: Any, responses: queue.Queue[tuple[int, Any, Any]], request_id: str
    ) -> tuple[bool, str | None, bool]:
        """Send one request and wait for its final response: (ok, error, stream broken)."""
        inp = grpcclient.InferInput("text_input", [1], "BYTES")
        inp.set_data_from_numpy(np.array([b"the quick brown fox"], dtype=np.object_))
        inputs = [inp]
        with self._lock:
            max_tokens = self.max_tokens
        if max_tokens is not None:
            mt = grpcclient.InferInput("max_tokens", [1], "INT32")
            mt.set_data_from_numpy(np.array([max_tokens], dtype=np.int32))
            inputs.append(mt)
        self._count("llm", "sent")
        t0 = time.monotonic_ns()
        client.async_stream_infer(
            self.llm_model, inputs, request_id=request_id, enable_empty_final_response=True
        )
        token_times: list[int] = []
        deadline = time.monotonic() + self.request_timeout
        while True:
            if self._stop.is_set():
                return False, "stopped", True
            if time.monotonic() > deadline:
                return False, "timeout", True
            try:
                t_ns, result, error = responses.get(timeout=0.1)
            except queue.Empty:
                continue
            if error is not None:
                # A model's error response has no gRPC status and leaves the stream usable;
                # an RPC failure (status UNAVAILABLE, CANCELLED, ...) ends the stream.
                status = error.status() if hasattr(error, "status") else "unknown"
                return False, str(error), status is not None
            if result.get_response().id != request_id:
                continue  # a late response of an abandoned request
            if result.as_numpy("text_output") is not None:
                token_times.append(t_ns)
            params = result.get_response().parameters
            if "triton_final_response" in params and params["triton_final_response"].bool_param:
                break
        if token_times:
            with self._lock:
                self._ttft.append((token_times[0] - t0) / 1e6)
                self._itl.extend((b - a) / 1e6 for a, b in itertools.pairwise(token_times))
        return True, None, False


def _on_response(q: queue.Queue[tuple[int, Any, Any]], result: Any, error: Any) -> None:
    q.put((time.monotonic_ns(), result, error))


def _close(client: Any) -> None:
    if client is None:
        return
    stream = getattr(client, "_stream", None)
    try:
        # Cancel: a server that is going away may never finish the pending requests.
        client.stop_stream(cancel_requests=True)
    except Exception:
        pass
    # tritonclient (2.73) does not end a cancelled stream's request iterator, whose gRPC thread
    # then waits forever on the request queue: one leaked thread per closed stream. Release it.
    request_queue = getattr(stream, "_request_queue", None)
    if request_queue is not None:
        request_queue.put(None)
    try:
        client.close()
    except Exception:
        pass
