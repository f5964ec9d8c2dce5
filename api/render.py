"""Sample values and range answers as JSON text, written the way Prometheus writes them.

JSON has no Inf or NaN: as floats, +Inf came back as ``null`` (or broke the encoder).
Prometheus sends every sample value as a string, ``"+Inf"``, ``"-Inf"``, ``"NaN"`` included,
formatted by Go's ``strconv`` (``'f'``, or ``'e'`` below 1e-6 and from 1e21), shortest digits
that read back to the same float; :func:`format_value` writes the same text, and
``float(text)`` gives the value back exactly.  Timestamps stay JSON numbers of unix seconds.
"""

from __future__ import annotations

import json
import math

import numpy as np

from tritonwatch.store.values import SeriesColumns


def format_value(v: float) -> str:
    """``v`` as Prometheus's JSON writes a sample value (without the quotes)."""
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    # repr has Go's shortest digits; only the notation differs: Python switches to an exponent
    # below 1e-4 and from 1e16, Go ('f' with Prometheus's cut-offs) below 1e-6 and from 1e21.
    text = repr(v)
    if "e" in text:
        if 1e-6 <= abs(v) < 1e21:
            return np.format_float_positional(v, unique=True, trim="-")
        return text
    return text[:-2] if text.endswith(".0") else text


def format_ts(seconds: float) -> str:
    """A timestamp in unix seconds as a JSON number (``1700000000``, ``1700000000.5``)."""
    text = repr(seconds)
    return text[:-2] if text.endswith(".0") else text


def range_json(cols: SeriesColumns) -> bytes:
    """A list of ``{"target", "name", "labels", "points": [[ts, "value"], ...]}``."""
    # Encoded series by series: the answer is held once as the parts and once joined, not
    # also as one str (an answer near api.max_samples is tens of MB).
    parts: list[bytes] = []
    bounds = cols.bounds.tolist()
    for i, key in enumerate(cols.keys):
        lo, hi = bounds[i], bounds[i + 1]
        head = json.dumps({"target": key.target, "name": key.name, "labels": dict(key.labels)},
                          ensure_ascii=False, separators=(",", ":"))
        points = ",".join(
            f'[{format_ts(t)},"{format_value(v)}"]'
            for t, v in zip(cols.ts[lo:hi].tolist(), cols.values[lo:hi].tolist(), strict=True))
        parts.append(f'{head[:-1]},"points":[{points}]}}'.encode())
    return b"[" + b",".join(parts) + b"]"
