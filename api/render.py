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
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import numpy.typing as npt


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


def metric_json(labels: Mapping[str, str]) -> str:
    return json.dumps(dict(labels), ensure_ascii=False, separators=(",", ":"))


def matrix_json(series: Iterable[tuple[Mapping[str, str], npt.ArrayLike, npt.ArrayLike]],
                warnings: Sequence[str] = ()) -> bytes:
    """A Prometheus range answer: ``{"status": "success", "data": {"resultType": "matrix",
    "result": [{"metric": {...}, "values": [[ts, "value"], ...]}, ...]}}``; series without a
    point are left out, as Prometheus does."""
    parts: list[bytes] = []
    for labels, ts, values in series:
        # As Python floats: a numpy scalar's repr is not its number.
        times = np.asarray(ts, np.float64).tolist()
        if not times:
            continue
        points = ",".join(f'[{format_ts(t)},"{format_value(v)}"]'
                          for t, v in zip(times, np.asarray(values, np.float64).tolist(),
                                          strict=True))
        parts.append(f'{{"metric":{metric_json(labels)},"values":[{points}]}}'.encode())
    head = b'{"status":"success","data":{"resultType":"matrix","result":['
    tail = b"]}"
    if warnings:
        tail += b',"warnings":' + json.dumps(list(warnings)).encode()
    return head + b",".join(parts) + tail + b"}"
