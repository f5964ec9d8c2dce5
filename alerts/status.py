"""The latest status of every SLO, kept in memory for /metrics and ``/api/v1/slos``.

An SLO's status reads its whole period (28 or 30 days of 5-minute buckets): far too costly to
compute on every scrape of /metrics or every API call.  :class:`SloBoard` recomputes it after an
alert evaluation at most every ``refresh_s`` seconds, in the evaluation's worker thread, and
readers only ever see the last result.  An SLO whose status cannot be computed (the store is
down) keeps its previous status and says so in ``error``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, NamedTuple

from tritonwatch.alerts.slo import Slo, SloStatus, slo_status, slo_statuses

if TYPE_CHECKING:
    from tritonwatch.store import Store

log = logging.getLogger(__name__)

#: How often the SLO statuses are recomputed (seconds): budgets move slowly, and one refresh
#: reads every SLO's whole period.
SLO_STATUS_REFRESH_S = 60.0


class SloEntry(NamedTuple):
    """One SLO: its statuses (one per ``by`` group, at least one) and the last refresh."""

    slo: Slo
    statuses: tuple[SloStatus, ...]
    refreshed_at: float | None
    error: str | None


class SloBoard:
    """The SLOs' latest statuses; :meth:`refresh` recomputes them when due."""

    def __init__(self, slos: Iterable[Slo], *, refresh_s: float = SLO_STATUS_REFRESH_S) -> None:
        self.refresh_s = refresh_s
        self._lock = threading.Lock()
        self._entries = {slo.name: SloEntry(slo, (), None, None) for slo in slos}
        self._due = 0.0  # monotonic

    def refresh(self, store: Store, now: float, *, force: bool = False) -> bool:
        """Recompute every SLO's status at ``now`` if ``refresh_s`` has passed; True if it
        did.  Never raises: a failing SLO keeps its last status, with the error noted."""
        if not self._entries or (not force and time.monotonic() < self._due):
            return False
        self._due = time.monotonic() + self.refresh_s
        for name, entry in list(self._entries.items()):
            try:
                found = slo_statuses(store, entry.slo, now) or [slo_status(store, entry.slo, now)]
            except Exception as exc:
                log.warning("slo %s: status not refreshed: %s", name, exc)
                with self._lock:
                    self._entries[name] = entry._replace(error=str(exc)[:300])
                continue
            with self._lock:
                self._entries[name] = SloEntry(entry.slo, tuple(found), now, None)
        return True

    def entries(self) -> list[SloEntry]:
        with self._lock:
            return [self._entries[name] for name in sorted(self._entries)]
