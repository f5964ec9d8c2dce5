"""Store fixtures.

``store``: a real embedded SQLite store in the test's tmp_path (the default).  ``make_store``
opens stores on *both* backends (``store_url`` is parametrized over SQLite and a real
PostgreSQL); suites that must hold on both (the store contract, the alert engine, late
samples) define ``store`` as ``make_store()``, which takes precedence over the default.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tritonwatch.store import Store, open_store


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = open_store(f"sqlite:///{tmp_path}/tw.db")
    s.migrations.apply()
    yield s
    s.close()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        # A directory that does not exist yet: open_store creates it.
        return f"sqlite:///{tmp_path}/data/tw.db"
    url: str = request.getfixturevalue("postgres_db_url")
    return url


def stores(open_one: Callable[..., Store]) -> Iterator[Callable[..., Store]]:
    """A ``make_store`` fixture's body: ``make(**kwargs)`` opens a store with ``open_one``,
    with its schema, and every store made is closed at the end."""
    opened: list[Store] = []

    def make(**kwargs: Any) -> Store:
        s = open_one(**kwargs)
        s.migrations.apply()
        opened.append(s)
        return s

    yield make
    for s in opened:
        s.close()


@pytest.fixture
def make_store(store_url: str) -> Iterator[Callable[..., Store]]:
    """Opens (and at the end closes) stores on ``store_url``; several share one database."""
    yield from stores(lambda **kwargs: open_store(store_url, **kwargs))
