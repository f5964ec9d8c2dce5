"""``with thing:`` for what the wiring starts and stops (the Triton rig, the load generator):
started on entering the block, stopped however it ends."""

from __future__ import annotations

from types import TracebackType
from typing import Self


class StartStop:
    """Mixin: ``__enter__`` calls ``start()``, ``__exit__`` calls ``stop()``."""

    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
