"""Raw SQL on a store's database, for tests only.

The store hands out no engine: SQL stays inside ``store/``, which shares it through the
package-private ``store.store.engine_of``.  Tests reach it here, and only to do what no public
method may: corrupt or inspect stored rows, drive ``store.maintenance`` / ``store.samplelog``
functions one step at a time, count statements, or hold connections.
"""

from __future__ import annotations

from sqlalchemy import Engine

from tritonwatch.store import Store
from tritonwatch.store.store import engine_of


def raw_engine(store: Store) -> Engine:
    """``store``'s own SQLAlchemy engine (its pool, its connections)."""
    return engine_of(store)
