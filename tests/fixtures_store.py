"""The default ``store`` fixture: a real embedded SQLite store in the test's tmp_path.

Test modules that need both backends (the store contract suite, the engine tests) define their
own ``store`` fixture, which takes precedence over this one.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from store import Store, open_store


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = open_store(f"sqlite:///{tmp_path}/tw.db")
    s.create_schema()
    yield s
    s.close()
