"""Writes ``schema5.db``: a SQLite store made by tritonwatch of schema version 5 (compressed
chunks holding their own timestamps, rollup chunks of pcodec columns).

Run with the code of that version on the path (what made the committed file: main at
b697fc3, before timestamp columns were shared), from the repository root::

    git worktree add /tmp/tw5 b697fc3
    PYTHONPATH=/tmp/tw5 python tests/store/data/make_schema5_db.py tests/store/data/schema5.db

It holds four series of one target over 14 hours at 60 s: two 6 h spans compacted, hours
compacted, and rows still in the log, with rollups; values include +Inf, -Inf, -0.0, a stale
marker and a counter reset.  ``tests/faults/test_storage_disk.py`` upgrades a copy and reads
it back.
"""

from __future__ import annotations

import struct
import sys

from tritonwatch.schemas.samples import Sample, make_labels
from tritonwatch.store import open_store

T = 1_700_006_400  # a 6 h span boundary (s)
HOURS = 14
STALE: float = struct.unpack("<d", struct.pack("<Q", 0x7FF0000000000002))[0]


def value(i: int, k: int) -> float:
    if i == 0:  # a counter with a reset at k = 400
        return float(k * 7 if k < 400 else (k - 400) * 7)
    if i == 1:  # a gauge with specials, +Inf and -Inf in one 5 m bucket
        return {5: float("inf"), 6: float("-inf"), 7: -0.0, 500: STALE}.get(k, 0.25 * (k % 40))
    return 1e9 + k * 0.125 * i


def main(path: str) -> None:
    store = open_store(f"sqlite:///{path}")
    store.migrations.apply()
    for k in range(HOURS * 60):
        store.write("t", T + k * 60, [Sample("x", make_labels({"i": str(i)}), value(i, k))
                                      for i in range(4)])
        if k % 5 == 4:
            store.flush()
            store.maintenance.rollup(T + k * 60)
    store.flush()
    store.close()
    import sqlite3

    conn = sqlite3.connect(path)
    conn.execute("VACUUM")
    conn.close()


if __name__ == "__main__":
    main(sys.argv[1])
