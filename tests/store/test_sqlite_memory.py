"""SQLite's memory stays bounded however many different statements a connection runs.

Reads of many series are ``series_id IN (...)`` over id chunks, and each chunk length is its
own statement text; the sqlite3 module caches 128 prepared statements per connection.
"""

from __future__ import annotations

import ctypes
import ctypes.util

from sqlalchemy import select

from tests.store_sql import raw_engine
from tritonwatch.schemas import tables as t
from tritonwatch.store import open_store
from tritonwatch.store.engine import SQLITE_CACHED_STATEMENTS


def _sqlite_memory_used() -> int:
    # The library the sqlite3 module runs on (a shared one here: Debian's and pyenv's builds).
    lib = ctypes.CDLL(ctypes.util.find_library("sqlite3") or "libsqlite3.so.0")
    lib.sqlite3_memory_used.restype = ctypes.c_int64
    return int(lib.sqlite3_memory_used())


def test_a_connection_keeps_a_bounded_number_of_prepared_statements(tmp_path) -> None:
    store = open_store(f"sqlite:///{tmp_path}/tw.db")
    store.migrations.apply()
    c = t.sample_chunks.c
    with raw_engine(store).connect() as conn:
        conn.execute(select(c.series_id).where(c.series_id.in_([0])))  # the connection's own
        before = _sqlite_memory_used()
        for n in range(300, 500):  # 200 statements, each of its own length
            conn.execute(select(c.series_id, c.n).where(c.series_id.in_(list(range(n))),
                                                        c.start_ms >= 0)).all()
        grown = _sqlite_memory_used() - before
    store.close()
    # About 40 KB per statement this size: 200 cached would be 8 MB, 16 well under 2 MB.
    assert SQLITE_CACHED_STATEMENTS <= 32
    assert grown < 3 * 2**20, f"SQLite memory grew by {grown / 2**20:.1f} MiB"
