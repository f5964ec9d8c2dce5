"""The API's read pool: bounded threads, a bounded queue, an immediate refusal beyond."""

from __future__ import annotations

import asyncio
import threading

import pytest
from prometheus_client import CollectorRegistry

from tritonwatch.api.pool import Busy, ReadPool


def test_reads_beyond_workers_and_queue_are_refused_at_once() -> None:
    release = threading.Event()
    running = 0
    peak = 0
    lock = threading.Lock()

    def blocked_read(i: int) -> int:
        nonlocal running, peak
        with lock:
            running += 1
            peak = max(peak, running)
        release.wait(30)
        with lock:
            running -= 1
        return i

    async def scenario() -> tuple[list[int | BaseException], int]:
        registry = CollectorRegistry()
        pool = ReadPool(2, 3, registry=registry)
        tasks = [asyncio.create_task(pool.run(blocked_read, i)) for i in range(10)]
        await asyncio.sleep(0)  # every task reaches its admission check
        for _ in range(3000):  # up to 30 s for both threads to start
            if sum(t.done() for t in tasks) == 5 and peak == 2:
                break
            await asyncio.sleep(0.01)
        in_flight = pool.in_flight
        release.set()
        results = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 30)
        assert registry.get_sample_value("tritonwatch_api_reads_refused_total") == 5.0
        return results, in_flight

    results, in_flight = asyncio.run(scenario())
    assert in_flight == 5 and peak == 2
    assert results[:5] == [0, 1, 2, 3, 4]
    assert all(isinstance(r, Busy) for r in results[5:])
    assert "api.read_workers" in str(results[5])


def test_errors_of_the_read_reach_the_caller_and_free_the_place() -> None:
    def failing() -> None:
        raise ConnectionError("database gone")

    async def scenario() -> int:
        pool = ReadPool(1, 0)
        for _ in range(3):  # a failed read does not keep its place
            with pytest.raises(ConnectionError, match="database gone"):
                await pool.run(failing)
        return pool.in_flight

    assert asyncio.run(scenario()) == 0


def test_pool_sizes_are_checked() -> None:
    with pytest.raises(ValueError, match="workers"):
        ReadPool(0, 1)
