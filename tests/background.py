"""A scenario that runs beside the rest of the suite.

Some checks are long by definition and cheap in CPU: a receiver that must stay down for ten
minutes of wall time while serve keeps scraping two targets.  Run in line, such a test adds its
whole length to the suite; started when collection ends (tests/conftest.py) and checked by its
test at the very end, it overlaps the other tests and costs next to nothing.  The scenario is
real all the same: real processes, real wall time.  Run alone, its test simply waits for it.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: The scenarios of the collected test modules, by the name of the test that checks each.
REGISTRY: dict[str, Background] = {}


def background(test: str, scenario: Callable[[Path, threading.Event], Any]) -> Background:
    """Registers ``scenario`` as the background run that the test named ``test`` checks."""
    bg = REGISTRY[test] = Background(test, scenario)
    return bg


class Background:
    """One scenario on a thread of its own, with its own temporary directory."""

    def __init__(self, name: str, scenario: Callable[[Path, threading.Event], Any]) -> None:
        self.name = name
        self._scenario = scenario
        self._cancel = threading.Event()
        self._thread: threading.Thread | None = None
        self._result: Any = None
        self._error: BaseException | None = None
        self.root: Path | None = None

    @property
    def started(self) -> bool:
        return self._thread is not None

    def start(self) -> None:
        if self._thread is not None:
            return
        self.root = Path(tempfile.mkdtemp(prefix=f"tw-{self.name}-"))
        self._thread = threading.Thread(target=self._run, name=f"background-{self.name}",
                                        daemon=True)
        self._thread.start()

    def _run(self) -> None:
        assert self.root is not None
        try:
            self._result = self._scenario(self.root, self._cancel)
        except BaseException as exc:  # handed to the test that asks for the result
            self._error = exc

    def result(self, timeout: float) -> Any:
        """The scenario's return value; its exception re-raised; AssertionError on timeout."""
        self.start()
        assert self._thread is not None
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise AssertionError(f"background scenario {self.name} still running after "
                                 f"{timeout:g} s (its files: {self.root})")
        if self._error is not None:
            raise self._error
        return self._result

    def cancel(self, timeout: float) -> None:
        """Ends a scenario the session did not wait for (a run stopped early), then removes its
        files.  The scenario sees the event and cuts its waits short."""
        if self._thread is None:
            return
        self._cancel.set()
        self._thread.join(timeout)
        if not self._thread.is_alive() and self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)
