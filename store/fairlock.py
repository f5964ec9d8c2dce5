"""A lock that hands itself to its waiters in the order they came: the store's write gate.

Maintenance (the hourly move of the log, rollups, compaction) runs as a long series of short
write transactions, each inside the store's flush lock, so that a flush or another writer of
the process waiting for that lock gets its turn between two of them.  With a plain
``threading.Lock`` it often did not: the maintenance thread releases the lock and takes it
again at once, still holding the GIL, before the woken waiter runs; the waiter finds the lock
taken and sleeps again.  Measured at 1,000 targets: flushes waited through most of a
98-second move (their next runs skipped as "still running") and an alert evaluation's save,
which on SQLite polls for the database's write lock instead, gave up after the busy timeout.
Here each acquirer takes a ticket and the lock goes to the lowest ticket waiting.
"""

from __future__ import annotations

import threading
from types import TracebackType


class FairLock:
    """A non-reentrant lock granted first come, first served (a ticket lock)."""

    __slots__ = ("_cond", "_next", "_serving")

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._next = 0  # the ticket the next acquirer takes
        self._serving = 0  # the ticket that holds the lock, or may take it now

    def acquire(self, blocking: bool = True) -> bool:
        """Wait for the lock (after everyone who asked before); ``blocking=False`` takes it
        only if it is free and nobody is waiting for it."""
        with self._cond:
            if not blocking:
                if self._next != self._serving:
                    return False
                self._next += 1
                return True
            ticket = self._next
            self._next += 1
            while self._serving != ticket:
                self._cond.wait()
            return True

    def release(self) -> None:
        with self._cond:
            if self._next == self._serving:
                raise RuntimeError("release of an unlocked FairLock")
            self._serving += 1
            self._cond.notify_all()

    def locked(self) -> bool:
        with self._cond:
            return self._next != self._serving

    def waiting(self) -> int:
        """Acquirers waiting for the lock (not counting its holder)."""
        with self._cond:
            return max(0, self._next - self._serving - 1)

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()
