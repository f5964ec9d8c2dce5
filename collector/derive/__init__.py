"""Derived SLIs from consecutive payloads of one Triton target, reset-aware.

* :mod:`.catalog`: what is emitted (``SLI_CATALOG``) and what is read (the role tables);
* :mod:`.accumulate`: per source, the plan of a payload's structure and the counter baselines,
  and per model the deltas of one interval (resets, gaps, duplicates);
* :mod:`.formulas`: the SLIs from those deltas (stateless);
* :mod:`.deriver`: :class:`Deriver`, source precedence, and ``derive(snapshot)`` as an adapter.
"""

from tritonwatch.collector.derive.catalog import (
    DERIVED_FROM,
    INPUT_FAMILIES,
    SLI_CATALOG,
    ModelKey,
    SliSpec,
)
from tritonwatch.collector.derive.deriver import Deriver

__all__ = ["DERIVED_FROM", "INPUT_FAMILIES", "SLI_CATALOG", "Deriver", "ModelKey", "SliSpec"]
