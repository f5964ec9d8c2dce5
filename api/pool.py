"""The API's database reads: a bounded pool of their own, refusing at once when full.

FastAPI runs plain ``def`` routes in AnyIO's shared thread pool (40 threads).  A database that
froze used to take all of them: 45 reads hung, and /healthz and /metrics, waiting for a thread
behind them, timed out, so a probe restarted a process whose only fault was its database.
Here every route is ``async``: /healthz and /metrics answer from memory on the event loop, and
the routes that read the store run their read in :class:`ReadPool`, which holds at most
``workers`` reads in threads and ``queue`` more waiting.  Anything beyond is refused at once
with :class:`Busy` (503), so a stuck database costs a bounded number of threads and requests,
never the process's health answers.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import ParamSpec, TypeVar

import anyio
import anyio.to_thread
from prometheus_client import CollectorRegistry, Counter

P = ParamSpec("P")
T = TypeVar("T")


class Busy(Exception):
    """Every read thread is taken and the queue is full."""


class ReadPool:
    """Runs blocking reads in at most ``workers`` threads, with at most ``queue`` waiting."""

    def __init__(self, workers: int, queue: int, *,
                 registry: CollectorRegistry | None = None) -> None:
        if workers < 1 or queue < 0:
            raise ValueError(f"workers must be >= 1 and queue >= 0, got {workers}, {queue}")
        # A limiter of its own: AnyIO's default one (FastAPI's sync routes, the webhook
        # receiver's writes) and this pool never take threads from each other.
        self._limiter = anyio.CapacityLimiter(workers)
        self.workers = workers
        self.queue = queue
        self._admitted = 0  # running or waiting; only touched on the event loop
        self.refused = Counter(
            "tritonwatch_api_reads_refused", "API reads answered 503 because the read pool "
            "and its queue were full", registry=registry)

    @property
    def in_flight(self) -> int:
        """Reads running or waiting."""
        return self._admitted

    async def run(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """``fn(*args, **kwargs)`` in a read thread; raises Busy when none is free and the
        queue is full.  A caller cancelled meanwhile (the client left) still holds its place
        until ``fn`` returns: a thread cannot be interrupted, and letting a new read in early
        would pile more reads on a stuck database than the bound allows."""
        # Counted here, before the first await: the limiter's own count of waiting tasks
        # grows only once a task has reached it, so two requests could both pass a check
        # made on it.
        if self._admitted >= self.workers + self.queue:
            self.refused.inc()
            raise Busy(f"busy: {self.workers} reads running and {self.queue} waiting "
                       "(api.read_workers, api.read_queue); retry later")
        self._admitted += 1
        try:
            call = functools.partial(fn, *args, **kwargs)
            return await anyio.to_thread.run_sync(call, limiter=self._limiter)
        finally:
            self._admitted -= 1
