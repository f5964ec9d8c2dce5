"""The value types every configuration model shares: durations, sizes, URLs, headers, secrets,
and the frozen base models.

A leaf: this module imports nothing of the package, so every schemas module (``config``,
``alerting``, ``probes``, ``nvml``, ``rules``, ...) builds on it and none has to import another
to reach a duration type; that is what keeps ``schemas`` free of import cycles
(tests/test_architecture.py checks it).

Durations are Prometheus-style strings (``15s``, ``5m``, ``1h30m``, ``28d``) or plain seconds;
sizes accept ``KiB``/``MiB``/``GiB`` suffixes or plain bytes.  No error message here quotes a
secret: URLs are quoted with their userinfo and query masked, header values never.
"""

from __future__ import annotations

import math
import re
import unicodedata
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlsplit

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, WithJsonSchema

#: Where ``serve`` keeps its files unless told otherwise (SQLite, spill, reports, buffers).
DEFAULT_DATA_DIR = Path("tritonwatch-data")

REDACTED = "<redacted>"

_DURATION_RE = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(B|KB|KiB|MB|MiB|GB|GiB)?\s*$")
_SIZE_UNITS = {
    None: 1, "B": 1, "KB": 1000, "KiB": 1024, "MB": 1000**2, "MiB": 1024**2,
    "GB": 1000**3, "GiB": 1024**3,
}
# Placeholders people paste from examples; refusing them at start-up beats shipping a
# guessable token into production.
PLACEHOLDER_SECRETS = frozenset({"changeme", "change-me", "secret", "token", "xxx", "password"})


def parse_duration(value: Any) -> float:
    """Seconds from ``15s``/``1h30m``/``2.5`` (seconds); raises ValueError quoting the input."""
    if isinstance(value, bool):
        raise ValueError(f"invalid duration {value!r}")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str):
        text = value.strip()
        try:
            seconds = float(text)
        except ValueError:
            pos, seconds = 0, 0.0
            for match in _DURATION_RE.finditer(text):
                if match.start() != pos:
                    break
                seconds += float(match.group(1)) * _DURATION_UNITS[match.group(2)]
                pos = match.end()
            if pos != len(text) or not text:
                raise ValueError(
                    f"invalid duration {value!r}: use e.g. 500ms, 15s, 5m, 1h30m, 28d"
                ) from None
    else:
        raise ValueError(f"invalid duration {value!r}")
    if not math.isfinite(seconds):
        raise ValueError(f"invalid duration {value!r}: must be a finite number of seconds")
    if seconds < 0:
        raise ValueError(f"duration {value!r} must not be negative")
    return seconds


def format_duration(seconds: float) -> str:
    """A duration as a user writes one, the inverse of :func:`parse_duration`: ``3600`` →
    ``1h``, ``300`` → ``5m``, ``259200`` → ``3d``, ``0.5`` → ``500ms``, ``45`` → ``45s``."""
    if seconds < 1:
        return f"{seconds * 1000:g}ms"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"


def parse_size(value: Any) -> int:
    """Bytes from ``1048576``/``512KiB``/``50MiB``; raises ValueError quoting the input."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    match = _SIZE_RE.match(str(value))
    if not match:
        raise ValueError(f"invalid size {value!r}: use e.g. 1048576, 512KiB, 50MiB")
    return int(float(match.group(1)) * _SIZE_UNITS[match.group(2)])


def _positive(value: float) -> float:
    if value <= 0:
        raise ValueError("must be greater than 0")
    return value


# In the exported JSON Schema a duration is what a user may write: seconds or "1h30m".
_DURATION_SCHEMA = WithJsonSchema({
    "anyOf": [
        {"type": "number", "minimum": 0},
        {"type": "string", "pattern": r"^\s*((\d+(\.\d+)?)(ms|s|m|h|d|w))+\s*$"},
    ],
    "description": "seconds, or a Prometheus-style duration: 500ms, 15s, 5m, 1h30m, 28d",
})
Duration = Annotated[float, BeforeValidator(parse_duration), _DURATION_SCHEMA]
PositiveDuration = Annotated[
    float, BeforeValidator(parse_duration), AfterValidator(_positive), _DURATION_SCHEMA
]
ByteSize = Annotated[int, BeforeValidator(parse_size), AfterValidator(_positive)]


# --- URLs, addresses, headers, secrets --------------------------------------------------------


def redact_url_text(value: str, limit: int = 200) -> str:
    """``value`` (a URL, or what was meant to be one) with its userinfo, query and fragment
    masked; the rest (scheme, host, port, path) stays, so the user can see what is wrong.
    Long values are cut at ``limit`` characters."""
    head, hash_, _ = value.partition("#")
    head, query, _ = head.partition("?")
    scheme, sep, rest = head.partition("://")
    if not sep:
        scheme, rest = "", head
    authority, slash, path = rest.partition("/")
    if "@" in authority:
        authority = f"{REDACTED}@{authority.rpartition('@')[2]}"
    text = f"{scheme}{sep}{authority}{slash}{path}"
    text += f"?{REDACTED}" if query else ""
    text += f"#{REDACTED}" if hash_ else ""
    return text if len(text) <= limit else text[:limit] + "..."


def _is_http_url(value: str) -> bool:
    try:
        parts = urlsplit(value)
    except ValueError:  # e.g. an unbalanced "[" in the host
        return False
    return parts.scheme in ("http", "https") and bool(parts.netloc)


def http_url(value: str) -> str:
    """``value`` if it is an http(s) URL; else ValueError quoting it with its userinfo and
    query masked (they carry passwords and tokens)."""
    if not _is_http_url(value):
        raise ValueError(f"{redact_url_text(value)!r} is not an http(s) URL")
    return value


def _secret_http_url(value: str) -> str:
    # A webhook URL is a secret as a whole (chat webhooks carry the token in the path).
    if not _is_http_url(value):
        raise ValueError("is not an http(s) URL (value not shown: this URL is a secret)")
    return value


def host_port(value: str) -> str:
    """``value`` if it is ``HOST:PORT`` (a gRPC address, ``api.listen``, ``--listen``); else
    ValueError naming it with any credentials masked."""
    # tritonclient.grpc wants host:port without a scheme.
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"{redact_url_text(value)!r} is not host:port")
    if not 1 <= int(port) <= 65535:
        raise ValueError(f"{redact_url_text(value)!r}: port {int(port)} is outside 1-65535")
    return value


# RFC 9110 field names are tokens.
_HEADER_NAME_RE = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")


def check_headers(headers: dict[str, str]) -> dict[str, str]:
    """Refuse header names that are not HTTP tokens and values holding control characters.

    A CR or LF in a value would split the request (or make the HTTP client raise an error
    that quotes the whole value, usually a secret), so it is refused here, at config time.
    Messages name the header but never quote its value.
    """
    for name, value in headers.items():
        if not _HEADER_NAME_RE.match(name):
            raise ValueError(
                f"header name {name!r} is not a valid HTTP field name (letters, digits and "
                "!#$%&'*+-.^_`|~ only; no spaces, colons or control characters)"
            )
        bad = next((ch for ch in value if unicodedata.category(ch) in ("Cc", "Zl", "Zp")), None)
        if bad is not None:
            # The character's code is safe to show; the value (often a secret) is not.
            raise ValueError(
                f"header {name!r}: value contains a control character (U+{ord(bad):04X}; "
                "CR, LF and other control characters are not allowed); value not shown"
            )
    return headers


def real_secret(value: str) -> str:
    """``value`` unless it is a known placeholder or shorter than 16 characters (a token or
    password that guards an endpoint); the message never quotes it."""
    if value.lower() in PLACEHOLDER_SECRETS or len(value) < 16:
        raise ValueError("is a placeholder or shorter than 16 characters; set a real secret")
    return value


HttpUrl = Annotated[str, AfterValidator(http_url)]
#: An http(s) URL that is a secret as a whole: errors never quote it.
SecretHttpUrl = Annotated[str, AfterValidator(_secret_http_url)]
GrpcAddress = Annotated[str, AfterValidator(host_port)]
Headers = Annotated[dict[str, str], AfterValidator(check_headers)]


# --- base models ------------------------------------------------------------------------------


class Frozen(BaseModel):
    """Base of every configuration model: immutable once validated (the same value is handed
    to every job) and strict about unknown keys (a typo is an error, not a silent default)."""

    # Field docstrings become descriptions in the exported JSON Schema.
    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)


class FrozenAliased(Frozen):
    """:class:`Frozen` for the rules file, whose ``for`` fields carry an alias (``for`` is a
    Python keyword): such a field populates by either name."""

    model_config = ConfigDict(populate_by_name=True)


def supported_version(value: int, what: str) -> int:
    """``value`` if it is 1, the only format version of the ``what`` file this release reads."""
    if value != 1:
        raise ValueError(f"unsupported {what} version {value}; this release reads version 1")
    return value


def first_repeat(names: list[str]) -> tuple[int, str] | None:
    """Index and value of the first name that repeats an earlier one, or None."""
    seen: set[str] = set()
    for i, name in enumerate(names):
        if name in seen:
            return i, name
        seen.add(name)
    return None
