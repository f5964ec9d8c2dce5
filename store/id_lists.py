"""``column IN (ids)`` with the ids bound as one parameter.

SQLAlchemy expands ``column.in_(ids)`` into one literal per id, rendered into the statement's
text at every execution: the text differs with every list, so neither SQLAlchemy's compiled
cache nor the driver's prepared statements are reused, and a read of one metric across a
fleet (thousands of ids) spent more time rendering and parsing its SQL than finding its rows
(``bench.alerts_eval``: 255k literals rendered per 10 evaluations at 100 targets).  Here the
statement text is the same whatever the ids: SQLite reads them from one JSON array
(``json_each``, built into SQLite since 3.38), which its planner treats as it treats a list of
literals (an ``IN`` probe of the index); PostgreSQL takes one ``bigint[]`` (``= ANY``, which it
plans as it plans ``IN``).  No limit on how many ids either way (SQLite binds at most 32,766
parameters).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from sqlalchemy import BigInteger, Connection, any_, bindparam, func, literal_column, select
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.types import ARRAY, Text


def in_ids(conn: Connection, column: Any, ids: Sequence[int]) -> ColumnElement[bool]:
    """``column IN ids`` for ``conn``'s backend, ``ids`` (ints) bound as one parameter."""
    values = ids.tolist() if isinstance(ids, np.ndarray) else list(map(int, ids))
    if conn.dialect.name == "postgresql":
        return column == any_(bindparam(None, values, type_=ARRAY(BigInteger)))  # type: ignore[no-any-return]
    text = "[" + ",".join(map(str, values)) + "]"
    listed = select(literal_column("value", BigInteger)).select_from(
        func.json_each(bindparam(None, text, type_=Text)))
    return column.in_(listed)  # type: ignore[no-any-return]
