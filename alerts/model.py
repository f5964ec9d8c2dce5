"""What every alert rule is to the engine: a name, timings, and ``evaluate``.

SLO burn-rate rules (alerts/slo.py, alerts/rules.py), regression rules (alerts/detect.py) and
the other built-in rules (alerts/capacity.py, alerts/availability.py) all implement
:class:`Rule`.  They read history through the store's query layer (``range``, ``increase``,
``rate``, ``buckets``, ``probe_results``) at ``now``, so the same rules run live (``serve``),
over a recording in simulated time (``replay``) and over stored history (``backtest``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from tritonwatch.schemas.alerts import AlertCandidate

if TYPE_CHECKING:
    from tritonwatch.store import Store


class Rule(Protocol):
    name: str  # unique rule name (also the default alertname)
    for_s: float  # condition must hold this long before firing (pending until then)
    keep_firing_for_s: float  # keep firing this long after the condition was last true

    def evaluate(self, store: Store, now: float) -> list[AlertCandidate]:
        """The instances whose condition holds at ``now`` (unix s); [] when none."""
        ...
