"""The store: the only package that issues SQL.

Typical use (see ``store.store`` for the write path and its guarantees)::

    from tritonwatch.store import open_store
    store = open_store("sqlite:///tritonwatch-data/tw.db")
    store.migrations.apply()
    store.write(target, ts, samples); store.flush()
    store.read(Query("nv_inference_count", start=t0, end=t1, match={"model": "resnet"}))
"""

from tritonwatch.store.errors import QueryError, StoreError, WriterLockHeld
from tritonwatch.store.query import Agg
from tritonwatch.store.reads import Query
from tritonwatch.store.store import Pending, Store, open_store
from tritonwatch.store.values import SeriesColumns, SeriesData, SeriesKey, SeriesSums

__all__ = [
    "Agg",
    "Pending",
    "Query",
    "QueryError",
    "SeriesColumns",
    "SeriesData",
    "SeriesKey",
    "SeriesSums",
    "Store",
    "StoreError",
    "WriterLockHeld",
    "open_store",
]
