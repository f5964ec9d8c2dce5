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

from collections.abc import Sequence
from typing import Any

import numpy as np
from sqlalchemy import BigInteger, Connection, bindparam, func, literal_column, select
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.types import Text


def in_ids(conn: Connection, column: Any, ids: Sequence[int]) -> ColumnElement[bool]:
    """``column IN ids`` for ``conn``'s backend (``ids``: ints)."""
    values = ids.tolist() if isinstance(ids, np.ndarray) else list(map(int, ids))
    if conn.dialect.name == "postgresql":
        # PostgreSQL keeps the list of literals: bound as one ``bigint[]`` (``= ANY``), the
        # statement was prepared after five runs (psycopg) and its generic plan cost the
        # server a third more CPU per alert evaluation (bench.alerts_eval, 100 targets:
        # 1.35 -> 1.80 s of backend CPU, against 0.38 -> 0.25 s saved in this process).
        return column.in_(values)  # type: ignore[no-any-return]
    text = "[" + ",".join(map(str, values)) + "]"
    listed = select(literal_column("value", BigInteger)).select_from(
        func.json_each(bindparam(None, text, type_=Text)))
    return column.in_(listed)  # type: ignore[no-any-return]
