"""Weekly reports kept in the store (``schemas.tables.reports``).

``ReportStore`` borrows a :class:`~store.Store`'s engine like ``store.alerts.AlertStore``.
``insert`` keeps a report unless one of the same week and configuration exists (the unique key
decides, so two processes racing for the same week store it once); ``replace`` (an on-demand
``tritonwatch report``) overwrites it.
"""

from __future__ import annotations

import json
from contextlib import AbstractContextManager
from typing import Any, Literal, NamedTuple

from sqlalchemy import select

from tritonwatch.schemas import tables as t
from tritonwatch.store.engine import transaction
from tritonwatch.store.errors import db_errors
from tritonwatch.store.store import Store, engine_of, write_transaction
from tritonwatch.store.write import dialect_insert

Format = Literal["json", "html", "md"]
_COLUMN = {"json": "json", "html": "html", "md": "markdown"}


class StoredReport(NamedTuple):
    """A kept report without its documents (what a listing shows)."""

    id: int
    week: str
    config_key: str
    timezone: str
    start: float
    end: float
    created_at: float
    summary: dict[str, Any]


class PendingDelivery(NamedTuple):
    """A kept report whose delivery on ``channel`` has not succeeded yet."""

    report_id: int
    week: str
    channel: str
    attempts: int


class ReportStore:
    def __init__(self, store: Store) -> None:
        self._store = store
        self._engine = engine_of(store)

    def _values(self, week: str, config_key: str, timezone: str, start: float, end: float,
                created_at: float, summary: dict[str, Any],
                documents: dict[str, str]) -> dict[str, Any]:
        return {
            "week": week, "config_key": config_key, "timezone": timezone,
            "start_ms": round(start * 1000), "end_ms": round(end * 1000),
            "created_at": round(created_at * 1000),
            "summary": json.dumps(summary, sort_keys=True),
            "json": documents["json"], "html": documents["html"],
            "markdown": documents["md"],
        }

    def insert(self, *, week: str, config_key: str, timezone: str, start: float, end: float,
               created_at: float, summary: dict[str, Any], documents: dict[str, str],
               replace: bool = False) -> int | None:
        """Keep a report; its id, or None when one of this week and configuration exists
        already (``replace``: overwrite it instead)."""
        row = self._values(week, config_key, timezone, start, end, created_at, summary,
                           documents)
        r = t.reports
        with write_transaction(self._store, "store report") as conn:
            stmt = dialect_insert(conn, r).values(**row)
            if replace:
                stmt = stmt.on_conflict_do_update(
                    index_elements=[r.c.week, r.c.config_key],
                    set_={k: v for k, v in row.items() if k not in ("week", "config_key")})
            else:
                stmt = stmt.on_conflict_do_nothing(index_elements=[r.c.week, r.c.config_key])
            # RETURNING yields nothing when the conflict clause skipped the row: the race lost.
            found: int | None = conn.execute(stmt.returning(r.c.id)).scalar_one_or_none()
        return found

    def exists(self, week: str, config_key: str) -> bool:
        r = t.reports
        with self._db("read reports"), transaction(self._engine, write=False) as conn:
            return conn.execute(select(r.c.id).where(
                r.c.week == week, r.c.config_key == config_key)).first() is not None

    def kept_weeks(self, config_key: str) -> set[str]:
        """The weeks kept for this configuration."""
        r = t.reports
        with self._db("read reports"), transaction(self._engine, write=False) as conn:
            return set(conn.execute(select(r.c.week).where(
                r.c.config_key == config_key)).scalars())

    def record_delivery(self, report_id: int, channel: str, delivered: bool,
                        at: float) -> int:
        """Count one delivery attempt of a report on a channel; the attempts so far."""
        d = t.report_deliveries
        with write_transaction(self._store, "store report delivery") as conn:
            stmt = dialect_insert(conn, d).values(
                report_id=report_id, channel=channel, delivered=delivered, attempts=1,
                last_attempt_ms=round(at * 1000))
            stmt = stmt.on_conflict_do_update(
                index_elements=[d.c.report_id, d.c.channel],
                set_={"delivered": delivered, "attempts": d.c.attempts + 1,
                      "last_attempt_ms": round(at * 1000)})
            attempts: int = conn.execute(stmt.returning(d.c.attempts)).scalar_one()
        return attempts

    def deliveries(self, report_id: int) -> dict[str, tuple[bool, int]]:
        """``{channel: (delivered, attempts)}`` of one report."""
        d = t.report_deliveries
        with self._db("read report deliveries"), transaction(self._engine, write=False) as conn:
            rows = conn.execute(select(d.c.channel, d.c.delivered, d.c.attempts).where(
                d.c.report_id == report_id)).all()
        return {x.channel: (bool(x.delivered), int(x.attempts)) for x in rows}

    def pending_deliveries(self, max_attempts: int, limit: int = 100) -> list[PendingDelivery]:
        """Undelivered reports with fewer than ``max_attempts`` attempts, oldest week first."""
        r, d = t.reports, t.report_deliveries
        stmt = (select(d.c.report_id, r.c.week, d.c.channel, d.c.attempts)
                .join(r, r.c.id == d.c.report_id)
                .where(d.c.delivered.is_(False), d.c.attempts < max_attempts)
                .order_by(r.c.start_ms, d.c.report_id, d.c.channel).limit(limit))
        with self._db("read report deliveries"), transaction(self._engine, write=False) as conn:
            rows = conn.execute(stmt).all()
        return [PendingDelivery(int(x.report_id), x.week, x.channel, int(x.attempts))
                for x in rows]

    def list(self, *, week: str | None = None, limit: int = 100) -> list[StoredReport]:
        """Kept reports, newest week first."""
        r = t.reports
        stmt = select(r.c.id, r.c.week, r.c.config_key, r.c.timezone, r.c.start_ms, r.c.end_ms,
                      r.c.created_at, r.c.summary).order_by(r.c.start_ms.desc(), r.c.id.desc())
        if week is not None:
            stmt = stmt.where(r.c.week == week)
        with self._db("read reports"), transaction(self._engine, write=False) as conn:
            rows = conn.execute(stmt.limit(limit)).all()
        return [StoredReport(x.id, x.week, x.config_key, x.timezone, x.start_ms / 1000,
                             x.end_ms / 1000, x.created_at / 1000, json.loads(x.summary))
                for x in rows]

    def document(self, report_id: int, fmt: Format) -> str | None:
        """One rendering of a kept report; None when there is no such report."""
        r = t.reports
        column = getattr(r.c, _COLUMN[fmt])
        with self._db("read report"), transaction(self._engine, write=False) as conn:
            found: str | None = conn.execute(
                select(column).where(r.c.id == report_id)).scalar_one_or_none()
        return found

    def _db(self, action: str) -> AbstractContextManager[None]:
        return db_errors(action, self._store.url_redacted)
