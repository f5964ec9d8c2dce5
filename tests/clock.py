"""A clock the test sets by hand, for code that takes ``clock: Callable[[], float]`` (the
collector, the NVML collector, the log-line limiter): time moves only when the test assigns
``now``, so nothing depends on how fast the machine is."""

from __future__ import annotations


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now
