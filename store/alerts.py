"""Alert persistence: the engine's per-instance state and the alert history.

``AlertStore`` works on the same database as a :class:`~store.Store` (it borrows the store's
SQLAlchemy engine), so ``Store.migrations.apply()`` has already created its two tables
(``schemas.tables.alert_states`` and ``alert_events``).

* ``save()`` writes one evaluation's outcome — changed states, states that are gone, and the
  transitions as events — in **one** transaction, so a crash can never leave an event without
  its state or a state without its event.
* ``mark_sent()`` records the last successful delivery per fingerprint (a second, small
  transaction: delivery happens after the evaluation committed).
* ``append_events()`` is the entry point for alerts received from Alertmanager webhooks.

Times are unix seconds in the API and integer milliseconds in the tables, like the samples.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, NamedTuple, cast

from sqlalchemy import delete, select, update

from tritonwatch.schemas import tables as t
from tritonwatch.schemas.alerts import AlertEvent, AlertState, AlertStatus, EventStatus
from tritonwatch.schemas.samples import Labels, labels_json, make_labels
from tritonwatch.schemas.untrusted import db_text
from tritonwatch.store.engine import transaction
from tritonwatch.store.errors import StoreError, db_errors
from tritonwatch.store.store import Store, engine_of, write_transaction
from tritonwatch.store.write import dialect_insert

_STATUSES = frozenset({"pending", "firing", "resolved"})


class StoredAlert(NamedTuple):
    """An :class:`AlertState` plus the engine's bookkeeping that is not part of the interface."""

    state: AlertState
    #: First evaluation at which a firing alert's condition was false (Prometheus's
    #: ``KeepFiringSince``); None while the condition holds.
    keep_firing_since: float | None = None


def _ms(ts: float) -> int:
    return round(ts * 1000)


def _ms_or_none(ts: float | None) -> int | None:
    return None if ts is None else round(ts * 1000)


def _s_or_none(ms: int | None) -> float | None:
    return None if ms is None else ms / 1000


def _labels_from(text: str) -> Labels:
    return make_labels({str(k): str(v) for k, v in json.loads(text).items()})


class AlertStore:
    """Alert states and history in the database of ``store``.  Thread-safe (no own state)."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._engine = engine_of(store)

    # --- states ------------------------------------------------------------------------------

    def load(self) -> list[StoredAlert]:
        """Every persisted alert state, ordered by fingerprint."""
        st = t.alert_states
        with self._db("load alert states"), transaction(self._engine, write=False) as conn:
            rows = conn.execute(select(st).order_by(st.c.fingerprint)).all()
        out = []
        for r in rows:
            status = str(r.status)
            if status not in _STATUSES:
                raise StoreError(
                    f"alert_states row {r.fingerprint!r} has unknown status {status!r}",
                    url=self._store.url_redacted,
                )
            state = AlertState(
                fingerprint=r.fingerprint,
                rule=r.rule,
                labels=_labels_from(r.labels),
                annotations=_labels_from(r.annotations),
                status=cast(AlertStatus, status),
                active_since=r.active_since / 1000,
                fired_at=_s_or_none(r.fired_at),
                resolved_at=_s_or_none(r.resolved_at),
                last_true_at=r.last_true_at / 1000,
                last_sent_at=_s_or_none(r.last_sent_at),
                value=math.nan if r.value is None else float(r.value),
            )
            out.append(StoredAlert(state, _s_or_none(r.keep_firing_since)))
        return out

    def states(self) -> list[AlertState]:
        """Every persisted alert state (pending, firing, recently resolved)."""
        return [stored.state for stored in self.load()]

    def save(
        self,
        upsert: Sequence[StoredAlert],
        *,
        removed: Iterable[str] = (),
        events: Sequence[AlertEvent] = (),
        now: float,
    ) -> None:
        """One evaluation's outcome in one transaction: upsert states, delete ``removed``
        fingerprints, append ``events``.  Raises StoreError (nothing written) on failure."""
        st = t.alert_states
        gone = sorted(set(removed))
        rows = [_state_row(s, now) for s in sorted(upsert, key=lambda s: s.state.fingerprint)]
        with write_transaction(self._store, "save alert states") as conn:
            if gone:
                conn.execute(delete(st).where(st.c.fingerprint.in_(gone)))
            if rows:
                stmt = dialect_insert(conn, st)
                stmt = stmt.on_conflict_do_update(
                    index_elements=[st.c.fingerprint],
                    set_={k: stmt.excluded[k] for k in rows[0] if k != "fingerprint"},
                )
                conn.execute(stmt, rows)
            if events:
                conn.execute(t.alert_events.insert(), [_event_row(e) for e in events])

    def mark_sent(self, sent: Mapping[str, float]) -> None:
        """Record ``{fingerprint: sent_at}`` as each alert's last successful delivery."""
        if not sent:
            return
        st = t.alert_states
        with write_transaction(self._store, "mark alerts sent") as conn:
            for fp, ts in sorted(sent.items()):
                conn.execute(
                    update(st).where(st.c.fingerprint == fp).values(last_sent_at=_ms(ts))
                )

    def clear(self) -> None:
        """Forget every alert state (history is kept)."""
        with write_transaction(self._store, "clear alert states") as conn:
            conn.execute(delete(t.alert_states))

    # --- history -----------------------------------------------------------------------------

    def append_events(self, events: Sequence[AlertEvent]) -> int:
        """Append events to the history (e.g. alerts received from Alertmanager)."""
        if not events:
            return 0
        with write_transaction(self._store, "append alert events") as conn:
            conn.execute(t.alert_events.insert(), [_event_row(e) for e in events])
        return len(events)

    def events(
        self,
        *,
        start: float | None = None,
        end: float | None = None,
        fingerprint: str | None = None,
        source: str | None = None,
        limit: int | None = None,
    ) -> list[AlertEvent]:
        """History in ``[start, end]`` (by event time ``ts``), oldest first."""
        ev = t.alert_events
        stmt = select(ev).order_by(ev.c.ts, ev.c.id)
        if start is not None:
            stmt = stmt.where(ev.c.ts >= _ms(start))
        if end is not None:
            stmt = stmt.where(ev.c.ts <= _ms(end))
        if fingerprint is not None:
            stmt = stmt.where(ev.c.fingerprint == fingerprint)
        if source is not None:
            stmt = stmt.where(ev.c.source == source)
        if limit is not None:
            stmt = stmt.limit(limit)
        with self._db("read alert events"), transaction(self._engine, write=False) as conn:
            rows = conn.execute(stmt).all()
        return [
            AlertEvent(
                ts=r.ts / 1000,
                fingerprint=r.fingerprint,
                labels=_labels_from(r.labels),
                annotations=_labels_from(r.annotations),
                status=cast(EventStatus, r.status),
                starts_at=r.starts_at / 1000,
                ends_at=_s_or_none(r.ends_at),
                source=r.source,
                group_key=r.group_key,
            )
            for r in rows
        ]

    def _db(self, action: str) -> AbstractContextManager[None]:
        return db_errors(action, self._store.url_redacted)


def _state_row(stored: StoredAlert, now: float) -> dict[str, Any]:
    s = stored.state
    return {
        "fingerprint": s.fingerprint,
        "rule": s.rule,
        "labels": labels_json(s.labels),
        "annotations": labels_json(s.annotations),
        "status": s.status,
        "active_since": _ms(s.active_since),
        "fired_at": _ms_or_none(s.fired_at),
        "resolved_at": _ms_or_none(s.resolved_at),
        "last_true_at": _ms(s.last_true_at),
        "keep_firing_since": _ms_or_none(stored.keep_firing_since),
        "last_sent_at": _ms_or_none(s.last_sent_at),
        "value": None if math.isnan(s.value) else s.value,
        "updated_at": _ms(now),
    }


def _event_row(e: AlertEvent) -> dict[str, Any]:
    return {
        "ts": _ms(e.ts),
        "fingerprint": e.fingerprint,
        "labels": labels_json(e.labels),
        "annotations": labels_json(e.annotations),
        "status": e.status,
        "starts_at": _ms(e.starts_at),
        "ends_at": _ms_or_none(e.ends_at),
        # Both may come from a webhook's sender: storable on PostgreSQL whatever they hold.
        "source": db_text(e.source),
        "group_key": db_text(e.group_key),
    }
