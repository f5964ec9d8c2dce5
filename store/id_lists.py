"""``column IN (ids)``: on SQLite with the ids bound as one parameter.

SQLAlchemy expands ``column.in_(ids)`` into one literal per id, rendered into the statement's
text at every execution: the text differs with every list, so neither SQLAlchemy's compiled
cache nor the driver's prepared statements are reused, and a read of one metric across a
fleet (thousands of ids) spent more time rendering and parsing its SQL than finding its rows
(``bench.alerts_eval``: 255k literals rendered per 10 evaluations at 100 targets).  Here the
statement text is the same whatever the ids: SQLite reads them from one JSON array
(``json_each``, built into SQLite since 3.38), which its planner treats as it treats a list of
literals (an ``IN`` probe of the index), and no limit on how many (SQLite binds at most 32,766
parameters).  PostgreSQL keeps the literals (see :func:`in_ids`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import lru_cache
from typing import Any

import numpy as np
import numpy.typing as npt
from sqlalchemy import BigInteger, Connection, bindparam, func, literal_column, select
from sqlalchemy.sql import Executable
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.types import Text


def in_ids(conn: Connection, column: Any, ids: Sequence[int] | npt.NDArray[np.int64]
           ) -> ColumnElement[bool]:
    """``column IN ids`` for ``conn``'s backend (``ids``: ints), the list bound in place.

    PostgreSQL keeps a parameter per id: bound as one ``bigint[]`` (``= ANY``), the statement
    was prepared after five runs (psycopg) and its generic plan cost the server a third more
    CPU per alert evaluation (bench.alerts_eval, 100 targets: 1.35 -> 1.80 s of backend CPU,
    against 0.38 -> 0.25 s saved in this process)."""
    dialect = conn.dialect.name
    options = _BIND[dialect == "postgresql"]
    if dialect == "postgresql":  # its parameters typed as the column, as ``in_(list)`` does
        options = {**options, "type_": column.type}
    return _in(dialect, column, bindparam(None, ids_value(conn, ids), **options))


#: The name of the bound id list in the statements of :func:`prepared`.
IDS = "ids"

# bindparam options of the id list: PostgreSQL's expands to a parameter per id, SQLite's is
# one JSON text.
_BIND: dict[bool, dict[str, Any]] = {True: {"expanding": True}, False: {"type_": Text}}


def ids_param(dialect: str, column: Any) -> ColumnElement[bool]:
    """``column IN :ids`` as :func:`in_ids` renders it on ``dialect``, with the list bound at
    execution (:func:`ids_value`): on PostgreSQL an expanding parameter (SQLAlchemy writes one
    parameter per id into the text at each execution, the same text ``column.in_(list)``
    gives), on SQLite one JSON array."""
    return _in(dialect, column, bindparam(IDS, **_BIND[dialect == "postgresql"]))


def _in(dialect: str, column: Any, param: Any) -> ColumnElement[bool]:
    if dialect == "postgresql":
        return column.in_(param)  # type: ignore[no-any-return]
    listed = select(literal_column("value", BigInteger)).select_from(func.json_each(param))
    return column.in_(listed)  # type: ignore[no-any-return]


def ids_value(conn: Connection, ids: Sequence[int] | npt.NDArray[np.int64]) -> Any:
    """What the id list is bound to for ``ids`` on ``conn``'s backend: the ints on
    PostgreSQL, one JSON array of them on SQLite."""
    values = ids.tolist() if isinstance(ids, np.ndarray) else list(map(int, ids))
    if conn.dialect.name == "postgresql":
        return values
    return "[" + ",".join(map(str, values)) + "]"


@lru_cache(maxsize=64)
def prepared(build: Callable[[str], Executable], dialect: str) -> Executable:
    """The statement ``build`` makes for ``dialect``, built once and reused with bound
    parameters.

    The reads the alert rules issue per batch of series (the sample log's rows and the
    chunks of a window, hundreds a 300-target evaluation) each built their ``select`` anew:
    SQLAlchemy then coerced every clause and computed the statement's cache key again before
    finding its compiled form in the cache, some 0.4 ms of CPU a statement (measured on the
    log's read of 250 series: 2.54 ms built every time, 2.15 reused, 2.10 on the driver's
    cursor).  A statement object is immutable and its cache key memoized, so one is shared
    by every thread."""
    return build(dialect)
