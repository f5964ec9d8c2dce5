"""Target-provided values (model names, labels, annotations) are data: they are shown with
``st.text``, ``st.dataframe`` or chart data, which render text as text, or, where a widget
takes markdown (labels, captions, metric titles), escaped first with :func:`md`."""

from __future__ import annotations

import re

_MD_SPECIAL = re.compile(r"([\\`*_{}\[\]()#+\-.!|<>~$:&])")


def md(value: object) -> str:
    """``value`` as markdown that displays exactly its characters (no markup, no HTML)."""
    return _MD_SPECIAL.sub(r"\\\1", str(value))
