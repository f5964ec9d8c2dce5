"""``Buffer``: what a store holds unwritten, of one kind (scrapes, health rows, probe rows).

The store keeps three, all alike: writes append under a lock and never touch the database; a
flush takes everything out (:meth:`Buffer.flushing`), and if it fails with StoreError puts it
back in front of anything buffered meanwhile, oldest first, so the next flush retries it; a
shutdown that cannot flush takes everything out to save elsewhere (:meth:`Buffer.drain`) and a
later start puts it back (:meth:`Buffer.restore`).  A bound in weight (samples, rows) keeps an
outage from growing it without end: the oldest entries beyond it are dropped, and ``on_drop``
is told how much.  A closed buffer refuses writes with a StoreError naming the store.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Generic, TypeVar

from tritonwatch.store.errors import StoreError

T = TypeVar("T")


def _one(_item: object) -> int:
    return 1


class Buffer(Generic[T]):
    """A bounded FIFO of ``T`` with put-back, drain and restore; thread-safe.

    ``lock`` may be shared between buffers, so that one ``with lock:`` reads all of them at
    once (:meth:`drain_locked`).  ``weight`` is what the bound counts (1 per entry by default);
    ``on_drop(weight)`` is called, under the lock, after the bound dropped old entries.  The
    newest entry is never dropped, whatever its weight.
    """

    def __init__(
        self,
        *,
        owner: str,
        bound: int,
        lock: threading.Lock,
        weight: Callable[[T], int] = _one,
        on_drop: Callable[[int], None] | None = None,
    ) -> None:
        self._owner = owner  # the redacted URL, for the "closed" error
        self._bound = bound
        self._lock = lock
        self._weight = weight
        self._on_drop = on_drop
        self._items: deque[T] = deque()
        self._total = 0
        #: Weight a flush took out and has not settled: what a drain cannot save if that flush
        #: never ends.
        self._in_flight = 0
        self._closed = False

    @property
    def total(self) -> int:
        """The weight buffered (samples, rows), not counting a flush in progress."""
        with self._lock:
            return self._total

    @property
    def in_flight(self) -> int:
        with self._lock:
            return self._in_flight

    def close(self) -> None:
        """Refuse writes from now on (:meth:`check_open`, :meth:`add`)."""
        self._closed = True

    def check_open(self) -> None:
        """Raise StoreError if the store is closed."""
        if self._closed:
            raise StoreError(f"{self._owner}: store is closed", url=self._owner)

    def add(self, items: Iterable[T]) -> int:
        """Append ``items``, dropping the oldest beyond the bound; returns the weight now
        buffered."""
        self.check_open()
        with self._lock:
            for item in items:
                self._items.append(item)
                self._total += self._weight(item)
            self._trim_locked()
            return self._total

    @contextmanager
    def flushing(self) -> Iterator[list[T]]:
        """Take everything buffered for a flush to write.

        If the body raises StoreError the entries go back in front of anything buffered since,
        oldest first (the bound applies); either way they stop counting as in flight.
        """
        with self._lock:
            taken, self._items = list(self._items), deque()
            self._in_flight, self._total = self._total, 0
        try:
            yield taken
        except StoreError:
            self._put_back(taken)
            raise
        finally:
            with self._lock:
                self._in_flight = 0

    def drain_locked(self) -> tuple[list[T], int]:
        """Take everything buffered out, with the weight in flight; the caller holds the lock."""
        taken, self._items, self._total = list(self._items), deque(), 0
        return taken, self._in_flight

    def restore(self, items: Iterable[T]) -> None:
        """Buffer what :meth:`drain_locked` took, oldest first, ahead of anything buffered since
        (the bound applies)."""
        self.check_open()
        self._put_back(list(items))

    def _put_back(self, items: list[T]) -> None:
        with self._lock:
            ahead = deque(items)
            ahead.extend(self._items)
            self._items = ahead
            self._total += sum(map(self._weight, items))
            self._trim_locked()

    def _trim_locked(self) -> None:
        dropped = 0
        while self._total > self._bound and len(self._items) > 1:
            w = self._weight(self._items.popleft())
            self._total -= w
            dropped += w
        if dropped and self._on_drop is not None:
            self._on_drop(dropped)
