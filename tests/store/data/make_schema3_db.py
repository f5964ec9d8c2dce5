"""Writes ``schema3.db``: a SQLite store made by tritonwatch of schema version 3 (raw chunks).

Run with the code of that version on the path (what made the committed file: main at
5259a96, before chunks were compressed), from the repository root::

    git worktree add /tmp/tw3 5259a96
    PYTHONPATH=/tmp/tw3 python tests/store/data/make_schema3_db.py tests/store/data/schema3.db

It holds three series over three hours: hours compacted into raw hour chunks, chunks moved
from the log but not compacted, and rows still in the log; values include +Inf, -Inf, -0.0
and a counter reset.  ``tests/store/test_codec.py`` upgrades a copy and reads it back.
"""

from __future__ import annotations

import sys

from tritonwatch.schemas.samples import Sample, make_labels
from tritonwatch.store import open_store

T = 1_700_002_800  # an hour boundary (s)


def value(i: int, k: int) -> float:
    if i == 0:  # a counter with a reset at k = 300
        return float(k * 7 if k < 300 else (k - 300) * 7)
    if i == 1:  # a gauge with specials
        # +Inf and -Inf in different hours: together, their sum is NaN, which SQLite
        # stores as NULL, and the rollup fails on its NOT NULL column (a bug of its own).
        return {5: float("inf"), 300: float("-inf"), 7: -0.0}.get(k, 0.25 * (k % 40))
    return 1e9 + k * 0.125


def main(path: str) -> None:
    store = open_store(f"sqlite:///{path}")
    store.migrations.apply()
    for k in range(3 * 240):  # three hours at 15 s
        store.write("t", T + k * 15, [Sample("x", make_labels({"i": str(i)}), value(i, k))
                                      for i in range(3)])
        if k % 20 == 19:
            store.flush()
            if k < 2 * 240 + 100:
                # Maintenance as serve runs it: the first two hours end up compacted.
                store.maintenance.rollup(T + k * 15)
    store.flush()
    store.close()
    import sqlite3

    conn = sqlite3.connect(path)
    conn.execute("VACUUM")
    conn.close()


if __name__ == "__main__":
    main(sys.argv[1])
