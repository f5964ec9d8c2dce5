"""Derived SLIs from consecutive payloads of one Triton target, reset-aware.

* :mod:`.catalog`: what is read (the role tables);
* :mod:`.accumulate`: per source, the plan of a payload's structure and the counter baselines,
  and per model the deltas of one interval (resets, gaps, duplicates);
* :mod:`.formulas`: what is emitted (``SLI_CATALOG``) and the SLIs from those deltas (stateless);
* :mod:`.deriver`: :class:`Deriver`, source precedence, and ``derive(snapshot)`` as an adapter.
"""

from tritonwatch.collector.derive.catalog import DERIVED_FROM, INPUT_FAMILIES, ModelKey
from tritonwatch.collector.derive.deriver import Deriver
from tritonwatch.collector.derive.formulas import SLI_CATALOG, SliSpec

__all__ = ["DERIVED_FROM", "INPUT_FAMILIES", "SLI_CATALOG", "Deriver", "ModelKey", "SliSpec"]
