"""A store holding the synthetic fortnight (tests/report/synthetic.py), filled once per module
and copied per test, so tests that write reports into it stay independent."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.report import synthetic as syn
from tritonwatch.store import Store, open_store


@pytest.fixture(scope="session")
def filled_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("fortnight") / "tw.db"
    with open_store(f"sqlite:///{path}") as store:
        store.migrations.apply()
        syn.fill(store)
    return path


@pytest.fixture
def filled_url(filled_db: Path, tmp_path: Path) -> str:
    copy = tmp_path / "tw.db"
    shutil.copy(filled_db, copy)
    return f"sqlite:///{copy}"


@pytest.fixture
def filled(filled_url: str) -> Iterator[Store]:
    store = open_store(filled_url)
    store.migrations.apply()
    yield store
    store.close()
