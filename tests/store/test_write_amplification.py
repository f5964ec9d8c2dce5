"""SQLite settings that bound the bytes written per sample (``bench/storage.py`` measures them)."""

from __future__ import annotations

from pathlib import Path

from tests.store_sql import raw_engine
from tritonwatch.store import open_store
from tritonwatch.store.engine import SQLITE_WAL_CHECKPOINT_PAGES


def test_sqlite_checkpoints_its_wal_every_40_mb_not_4(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'tw.db'}")
    try:
        store.migrations.apply()
        with raw_engine(store).connect() as conn:
            pages = conn.exec_driver_sql("PRAGMA wal_autocheckpoint").scalar_one()
            mode = conn.exec_driver_sql("PRAGMA journal_mode").scalar_one()
        assert (mode, pages) == ("wal", SQLITE_WAL_CHECKPOINT_PAGES)
        assert SQLITE_WAL_CHECKPOINT_PAGES * 4096 >= 40_000_000
    finally:
        store.close()
