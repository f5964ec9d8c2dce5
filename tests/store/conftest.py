"""Fixtures shared by the store tests."""

from __future__ import annotations

from typing import Any

import pytest

import tritonwatch.store.flush as store_module
from tritonwatch.store.write import resolve_series


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[list[Any]]:
    """Every batch of series keys the store resolves (a spy on ``resolve_series``)."""
    seen: list[list[Any]] = []
    real = resolve_series

    def spy(conn: Any, keys: Any, *, now_ms: int) -> Any:
        keys = list(keys)
        seen.append(keys)
        return real(conn, keys, now_ms=now_ms)

    monkeypatch.setattr(store_module, "resolve_series", spy)
    return seen
