"""Text that a target or a client controls: made safe to log and to store, repeats limited.

A scrape error quotes the body that broke it, a webhook carries a ``groupKey`` of the sender's
choosing, a probe error quotes the model server's answer.  Written to a log as they are, a
newline forges a log line, an ESC sequence rewrites the reader's terminal, and a 60 KB line
repeated every scrape fills the disk; stored as they are, a NUL byte is refused by every
PostgreSQL ``text`` column (and the whole transaction with it).

* :func:`log_safe` escapes control characters (CR, LF, ESC, NUL, C1, the Unicode line and
  paragraph separators, bidirectional overrides, lone surrogates) and cuts the text to a bound,
  noting the original length.  The output is one line of printable text.
* :func:`db_text` makes a text storable on both backends (NUL replaced, length bounded).
* :class:`RepeatLimiter` lets a line through once per key per interval and counts what it held
  back, so the next line it lets through can say how many were suppressed.
* :class:`ReplacingFilter` keeps registered secrets out of a library's own log records (httpx
  quotes every request's full URL), one instance per registrant.

No I/O here (this module sits under every other): callers log.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Mapping

__all__ = [
    "DB_TEXT_MAX",
    "LOG_VALUE_MAX",
    "RepeatLimiter",
    "ReplacingFilter",
    "db_text",
    "log_safe",
]

#: Default bound on one logged value, in characters (after escaping).
LOG_VALUE_MAX = 300
#: Default bound on one stored text that came from outside (an error message), in characters.
DB_TEXT_MAX = 2000

# C0 and C1 controls and DEL (CR, LF, ESC, NUL among them); U+2028/U+2029, which some log
# viewers break lines at; the bidirectional marks and overrides, which reorder what a reader
# sees; lone surrogates, which a UTF-8 log handler cannot even encode.
_UNSAFE_RE = re.compile("[\x00-\x1f\x7f-\x9f\u200e\u200f\u2028\u2029\u202a-\u202e"
                        "\u2066-\u2069\ud800-\udfff]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
# An escape cut in half by the length bound (``\x1`` of ``\x1b``), removed whole.
_PARTIAL_ESCAPE_RE = re.compile(r"\\(?:x[0-9a-f]?|u[0-9a-f]{0,3})?$")


def _escape(match: re.Match[str]) -> str:
    ch = match.group(0)
    named = _NAMED.get(ch)
    if named is not None:
        return named
    code = ord(ch)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def log_safe(value: object, limit: int = LOG_VALUE_MAX) -> str:
    """``str(value)`` as one printable line of at most about ``limit`` characters.

    Control characters become ``\\n``, ``\\r``, ``\\t``, ``\\xNN`` or ``\\uNNNN``; a longer
    text is cut and ends with ``... [N chars]``, N being the original length.  Backslashes are
    left as they are: the point is that nothing can end the line or steer the terminal, not a
    reversible encoding.
    """
    text = value if isinstance(value, str) else str(value)
    # Escaping at most quadruples a character (NUL -> \x00), so the first `limit` characters
    # always give enough output: a 60 KB text costs no more than a short one.
    head = text[:limit]
    out = _UNSAFE_RE.sub(_escape, head) if _UNSAFE_RE.search(head) else head
    if len(out) <= limit and len(text) <= limit:
        return out
    out = _PARTIAL_ESCAPE_RE.sub("", out[:limit])
    return f"{out}... [{len(text)} chars]"


def db_text(value: str | None, limit: int = DB_TEXT_MAX) -> str | None:
    """``value`` storable in a ``text`` column of SQLite and PostgreSQL alike.

    NUL becomes U+FFFD (PostgreSQL refuses NUL in text, failing the whole statement), lone
    surrogates too (psycopg cannot encode them), and a text over ``limit`` characters is cut
    with a note of its length.  Everything else is kept: this is the value a reader asked for,
    not a log line.
    """
    if value is None:
        return None
    if "\x00" in value:
        value = value.replace("\x00", "\ufffd")
    if _SURROGATE_RE.search(value):
        value = _SURROGATE_RE.sub("\ufffd", value)
    if len(value) > limit:
        value = f"{value[:limit]}... [{len(value)} chars]"
    return value


_SURROGATE_RE = re.compile("[\ud800-\udfff]")


class RepeatLimiter:
    """At most one line per key per ``every_s`` seconds; counts the lines held back.

    ``check(key)`` answers None when the line is to be suppressed, else the number of lines of
    that key suppressed since the last one let through (0 the first time).  ``note(n)`` turns
    that number into a suffix for the line.  At most ``max_keys`` keys are remembered (the
    least recently let through is forgotten first), so a target or client inventing a new key
    per request cannot grow it without bound.  Thread-safe.
    """

    def __init__(
        self,
        every_s: float = 300.0,
        *,
        max_keys: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not every_s >= 0:
            raise ValueError(f"every_s must be >= 0, got {every_s!r}")
        if max_keys < 1:
            raise ValueError(f"max_keys must be >= 1, got {max_keys!r}")
        self.every_s = every_s
        self.max_keys = max_keys
        self._clock = clock
        self._lock = threading.Lock()
        # key -> [time the last line was let through, lines suppressed since]
        self._seen: OrderedDict[Hashable, list[float]] = OrderedDict()

    def check(self, key: Hashable) -> int | None:
        now = self._clock()
        with self._lock:
            entry = self._seen.get(key)
            if entry is not None and now - entry[0] < self.every_s:
                entry[1] += 1
                return None
            suppressed = 0 if entry is None else int(entry[1])
            self._seen[key] = [now, 0]
            self._seen.move_to_end(key)
            while len(self._seen) > self.max_keys:
                self._seen.popitem(last=False)
            return suppressed

    def note(self, suppressed: int) -> str:
        """``""``, or `` (N similar line(s) suppressed since the last)`` for ``suppressed`` > 0."""
        if not suppressed:
            return ""
        return f" ({suppressed} similar line(s) suppressed since the last)"

    def forget(self, key: Hashable) -> None:
        """Let the next line of ``key`` through (e.g. a state change that must be seen)."""
        with self._lock:
            self._seen.pop(key, None)


class ReplacingFilter(logging.Filter):
    """A log filter that rewrites each record's message: every registered string replaced by
    its stand-in (longest first, so a secret inside a longer one cannot leave the rest behind),
    then ``finish`` applied.  It does nothing until something is registered.  Thread-safe.

    alerts/notify masks webhook secrets with it, collector/remote_write the receivers' URLs;
    each installs its own instance on the loggers it guards.
    """

    def __init__(self, finish: Callable[[str], str] | None = None) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self._finish = finish
        self._replacements: tuple[tuple[str, str], ...] = ()

    def add(self, replacements: Mapping[str, str]) -> None:
        with self._lock:
            merged = dict(self._replacements) | dict(replacements)
            self._replacements = tuple(
                sorted(merged.items(), key=lambda item: len(item[0]), reverse=True)
            )

    def filter(self, record: logging.LogRecord) -> bool:
        replacements = self._replacements
        if replacements:
            message = record.getMessage()
            cleaned = message
            for raw, stand_in in replacements:
                cleaned = cleaned.replace(raw, stand_in)
            if self._finish is not None:
                cleaned = self._finish(cleaned)
            if cleaned != message:
                record.msg, record.args = cleaned, ()
        return True
