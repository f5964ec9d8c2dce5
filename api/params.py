"""Query parameters as Prometheus's HTTP API takes them, and the list answers' page tokens.

Times are unix seconds (``1700000000.5``) or RFC 3339 (``2023-11-14T22:13:20Z``); a step is
seconds or a duration (``15s``, ``1m30s``).  Every refusal is an :func:`api.errors.bad_param`
naming the parameter.  The bounds keep every time a whole number of milliseconds that fits the
store's 64-bit columns: ``start=-1e300`` used to reach SQL and come back as a 500.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
from datetime import datetime

from tritonwatch.api.errors import ApiError, bad_param
from tritonwatch.schemas.values import parse_duration

#: Times a query accepts: years 1 to 9999 (as Python's datetime).
MIN_TIME_S = -62_135_596_800.0
MAX_TIME_S = 253_402_300_799.0

#: Steps a range query accepts: a millisecond (the store's resolution) to about 317 years.
MIN_STEP_S = 0.001
MAX_STEP_S = 1e10

#: Points per series a range query may answer, as Prometheus (``exceeded maximum resolution
#: of 11,000 points per timeseries``).
MAX_POINTS_PER_SERIES = 11_000

#: Bytes of a page token: a few labels of a few hundred characters each.
MAX_TOKEN_CHARS = 8_192


def parse_time(name: str, text: str) -> float:
    """Unix seconds from ``text`` (seconds or RFC 3339), within years 1 to 9999."""
    try:
        seconds = float(text)
    except ValueError:
        try:
            stamp = datetime.fromisoformat(text)
        except ValueError:
            raise bad_param(name, f"cannot parse {text[:64]!r} to a valid timestamp (unix "
                                  "seconds or RFC 3339)") from None
        if stamp.tzinfo is None:
            raise bad_param(name, f"RFC 3339 time without a timezone: {text[:64]!r}") from None
        seconds = stamp.timestamp()
    if not (math.isfinite(seconds) and MIN_TIME_S <= seconds <= MAX_TIME_S):
        raise bad_param(name, f"{seconds!r} is outside the years 1 to 9999 "
                              f"({MIN_TIME_S:.0f} to {MAX_TIME_S:.0f} unix seconds)")
    return seconds


def parse_step(name: str, text: str) -> float:
    """Seconds from ``text`` (seconds or a duration), between 1 ms and :data:`MAX_STEP_S`."""
    try:
        seconds = float(text)
    except ValueError:
        try:
            seconds = parse_duration(text)
        except ValueError:
            raise bad_param(name, f"cannot parse {text[:64]!r} to a valid duration (seconds, "
                                  "or e.g. 15s, 1m30s)") from None
    if not math.isfinite(seconds):
        raise bad_param(name, f"{seconds!r} is not a finite number of seconds")
    if seconds <= 0:
        raise bad_param(name, "zero or negative query resolution step widths are not "
                              "accepted. Try a positive integer")
    if not MIN_STEP_S <= seconds <= MAX_STEP_S:
        raise bad_param(name, f"must be between {MIN_STEP_S} and {MAX_STEP_S:g} seconds")
    return seconds


def check_resolution(start: float, end: float, step: float) -> None:
    """Refuse ``end`` before ``start``, and more than :data:`MAX_POINTS_PER_SERIES` steps."""
    if end < start:
        raise bad_param("end", "end timestamp must not be before start time")
    if (end - start) / step > MAX_POINTS_PER_SERIES:
        raise ApiError(400, "bad_data",
                       f"exceeded maximum resolution of {MAX_POINTS_PER_SERIES:,} points per "
                       "timeseries. Try decreasing the query resolution (?step=XX)")


def encode_token(parts: list[object]) -> str:
    """An opaque page token for the item ``parts`` (the next page starts after it)."""
    raw = json.dumps(parts, separators=(",", ":"), ensure_ascii=False).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_token(name: str, token: str) -> list[object]:
    """The ``parts`` of a token from :func:`encode_token`; 400 naming ``name`` otherwise."""
    if len(token) > MAX_TOKEN_CHARS:
        raise bad_param(name, f"longer than {MAX_TOKEN_CHARS} characters")
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        parts = json.loads(raw)
    except (binascii.Error, ValueError):
        raise bad_param(name, "not a page token of this API (take it from the Link header "
                              "of the previous page)") from None
    if not isinstance(parts, list):
        raise bad_param(name, "not a page token of this API")
    return parts
