"""The small part of PromQL the read API takes: series selectors, and one function over a range.

Accepted, as Prometheus writes them::

    sli:request_rate{model="batcher", target!="canary"}
    {__name__=~"sli:.*_rate", model!~"test.*"}
    rate(nv_inference_count{model="batcher"}[5m])

- Matchers ``=``, ``!=``, ``=~``, ``!~``.  Regexes are RE2 (Prometheus's own syntax, through
  google-re2: linear time whatever the pattern, so no pattern can make a matcher slow) and
  anchored at both ends, as in Prometheus.  A pattern longer than :data:`MAX_REGEX_CHARS` is
  refused.
- Strings in double or single quotes with Go's escapes, or in backticks (raw).
- As in Prometheus, a selector needs at least one matcher that does not match the empty
  string (``{}`` and ``{a=~".*"}`` select nothing useful and are refused), and a label absent
  from a series matches ``""``.
- Functions: ``rate``, ``increase``, ``avg_over_time``, ``min_over_time``, ``max_over_time``,
  each over ``selector[duration]``.  Anything else (aggregations, binary operators, offsets,
  other functions) is a 400 naming what is not supported.

Every series is seen with its labels plus ``__name__`` (the stored name) and ``target``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import NamedTuple

import re2

from tritonwatch.api.errors import ApiError, bad_param
from tritonwatch.schemas.values import parse_duration

#: Longest regex a matcher may hold.
MAX_REGEX_CHARS = 2_000
#: Longest selector or query text.
MAX_QUERY_CHARS = 10_000
#: Functions of ``func(selector[range])`` and what they compute.
FUNCTIONS = ("rate", "increase", "avg_over_time", "min_over_time", "max_over_time")
OPS = ("=", "!=", "=~", "!~")

_METRIC = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_SPACE = re.compile(r"\s*")
_DURATION = re.compile(r"(?:[0-9]+(?:ms|[smhdw]))+")
_ESCAPES = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v",
            "\\": "\\", "'": "'", '"': '"'}

_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.log_errors = False  # a bad pattern is the client's 400, not a line on stderr


class Matcher(NamedTuple):
    name: str
    op: str
    value: str
    regex: object | None  # compiled RE2 for =~ and !~

    def matches(self, value: str) -> bool:
        if self.op == "=":
            return value == self.value
        if self.op == "!=":
            return value != self.value
        hit = self.regex.fullmatch(value) is not None  # type: ignore[attr-defined]
        return hit if self.op == "=~" else not hit


class Selector(NamedTuple):
    matchers: tuple[Matcher, ...]

    @property
    def name(self) -> str | None:
        """The metric name when the selector fixes it (``__name__="x"``)."""
        return self.equal("__name__")

    @property
    def target(self) -> str | None:
        return self.equal("target")

    def equal(self, label: str) -> str | None:
        for m in self.matchers:
            if m.name == label and m.op == "=":
                return m.value
        return None

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(m.matches(labels.get(m.name, "")) for m in self.matchers)


class Query(NamedTuple):
    """``selector``, or ``func(selector[range_s])``."""

    func: str | None
    selector: Selector
    range_s: float | None


def series_labels(target: str, name: str, labels: tuple[tuple[str, str], ...]) -> dict[str, str]:
    """A stored series as PromQL sees it: its labels, ``__name__`` and ``target``."""
    out = dict(labels)
    out["__name__"] = name
    out["target"] = target
    return out


def predicate(selectors: list[Selector]) -> Callable[[str, str, tuple[tuple[str, str], ...]],
                                                     bool]:
    """Whether a stored series (target, name, labels) matches any of ``selectors``."""
    def match(target: str, name: str, labels: tuple[tuple[str, str], ...]) -> bool:
        seen = series_labels(target, name, labels)
        return any(s.matches(seen) for s in selectors)
    return match


class _Parser:
    def __init__(self, text: str, param: str) -> None:
        if len(text) > MAX_QUERY_CHARS:
            raise bad_param(param, f"longer than {MAX_QUERY_CHARS:,} characters")
        self.text = text
        self.pos = 0
        self.param = param

    def fail(self, why: str) -> ApiError:
        return bad_param(self.param, f"{why} (at character {self.pos + 1} of "
                                     f"{self.text[:200]!r})")

    def space(self) -> None:
        m = _SPACE.match(self.text, self.pos)
        assert m is not None
        self.pos = m.end()

    def peek(self, token: str) -> bool:
        self.space()
        return self.text.startswith(token, self.pos)

    def take(self, token: str) -> bool:
        if self.peek(token):
            self.pos += len(token)
            return True
        return False

    def expect(self, token: str, what: str) -> None:
        if not self.take(token):
            found = self.text[self.pos:self.pos + 20] or "end of input"
            raise self.fail(f"expected {what}, found {found!r}")

    def word(self, pattern: re.Pattern[str]) -> str | None:
        self.space()
        m = pattern.match(self.text, self.pos)
        if m is None:
            return None
        self.pos = m.end()
        return m.group()

    def end(self) -> None:
        self.space()
        if self.pos != len(self.text):
            rest = self.text[self.pos:self.pos + 20]
            if rest[0] in "+-*/%^=!<>" or rest.startswith(("and", "or", "unless")):
                raise self.fail(f"unsupported: binary operators ({rest!r}); only a selector or "
                                f"{'/'.join(FUNCTIONS)}(selector[range]) is supported")
            if rest.startswith(("offset", "@")):
                raise self.fail("unsupported: offset and @ modifiers")
            raise self.fail(f"unexpected {rest!r}")

    def string(self) -> str:
        self.space()
        if self.pos >= len(self.text) or self.text[self.pos] not in "\"'`":
            raise self.fail("expected a quoted string")
        quote = self.text[self.pos]
        self.pos += 1
        out: list[str] = []
        while True:
            if self.pos >= len(self.text):
                raise self.fail("unterminated quoted string")
            c = self.text[self.pos]
            self.pos += 1
            if c == quote:
                return "".join(out)
            if c == "\\" and quote != "`":
                out.append(self._escape(quote))
            elif c == "\n" and quote != "`":
                raise self.fail("newline in a quoted string")
            else:
                out.append(c)

    def _escape(self, quote: str) -> str:
        if self.pos >= len(self.text):
            raise self.fail("unterminated escape")
        c = self.text[self.pos]
        self.pos += 1
        if c in _ESCAPES and (c not in "'\"" or c == quote):
            return _ESCAPES[c]
        width = {"x": 2, "u": 4, "U": 8}.get(c)
        if width is not None:
            digits = self.text[self.pos:self.pos + width]
            if len(digits) != width or any(d not in "0123456789abcdefABCDEF" for d in digits):
                raise self.fail(f"invalid escape \\{c}{digits}")
            self.pos += width
            code = int(digits, 16)
        elif c in "01234567":
            digits = self.text[self.pos - 1:self.pos + 2]
            if len(digits) != 3 or any(d not in "01234567" for d in digits):
                raise self.fail(f"invalid octal escape \\{digits}")
            self.pos += 2
            code = int(digits, 8)
        else:
            raise self.fail(f"unknown escape sequence \\{c}")
        if code > 0x10FFFF or 0xD800 <= code < 0xE000:
            raise self.fail("escape sequence is an invalid Unicode code point")
        return chr(code)

    def selector(self) -> Selector:
        matchers: list[Matcher] = []
        name = self.word(_METRIC)
        if name is not None:
            if name in ("by", "without", "bool", "offset", "on", "ignoring"):
                raise self.fail(f"unsupported: {name!r}")
            if self.peek("("):
                raise self.fail(f"unsupported: function or aggregation {name!r}; supported: "
                                f"{', '.join(FUNCTIONS)} over selector[range]")
            matchers.append(Matcher("__name__", "=", name, None))
        if self.take("{"):
            while not self.take("}"):
                label = self.word(_LABEL)
                if label is None:
                    raise self.fail("expected a label name")
                op = next((o for o in ("=~", "!~", "!=", "=") if self.take(o)), None)
                if op is None:
                    raise self.fail(f"expected one of {', '.join(OPS)} after label {label!r}")
                value = self.string()
                if label == "__name__" and name is not None:
                    raise self.fail(f"metric name given twice ({name!r} and __name__)")
                matchers.append(self.matcher(label, op, value))
                if not self.take(","):
                    self.expect("}", "',' or '}'")
                    break
        elif name is None:
            raise self.fail("expected a metric name or '{'")
        if not any(not m.matches("") for m in matchers):
            raise self.fail("vector selector must contain at least one non-empty matcher")
        return Selector(tuple(matchers))

    def matcher(self, label: str, op: str, value: str) -> Matcher:
        if op in ("=", "!="):
            return Matcher(label, op, value, None)
        if len(value) > MAX_REGEX_CHARS:
            raise self.fail(f"regex of label {label!r} longer than {MAX_REGEX_CHARS} characters")
        try:
            # Anchored, and '.' matching a newline too, as Prometheus compiles a matcher.
            regex = re2.compile(f"(?s:{value})", _RE2_OPTIONS)
        except re2.error as exc:
            raise self.fail(f"invalid regex for label {label!r}: {_why(exc)}") from None
        return Matcher(label, op, value, regex)

    def duration(self) -> float:
        text = self.word(_DURATION)
        if text is None:
            raise self.fail("expected a duration such as 5m")
        seconds = parse_duration(text)
        if seconds <= 0:
            raise self.fail("range must be positive")
        return seconds

    def query(self) -> Query:
        self.space()
        start = self.pos
        func = self.word(re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*(?=\s*\()"))
        if func is None:
            self.pos = start
            sel = self.selector()
            if self.peek("["):
                raise self.fail("unsupported: a range selector outside a function; use "
                                f"{'/'.join(FUNCTIONS)}(selector[range])")
            self.end()
            return Query(None, sel, None)
        if func not in FUNCTIONS:
            raise self.fail(f"unsupported function or aggregation {func!r}; supported: "
                            f"{', '.join(FUNCTIONS)} over selector[range], or a plain selector")
        self.expect("(", "'('")
        sel = self.selector()
        self.expect("[", f"a range such as [5m] after the selector of {func}")
        range_s = self.duration()
        if self.peek(":"):
            raise self.fail("unsupported: subqueries")
        self.expect("]", "']'")
        self.expect(")", "')'")
        self.end()
        return Query(func, sel, range_s)


def _why(exc: Exception) -> str:
    text = exc.args[0] if exc.args else str(exc)
    return text.decode(errors="replace") if isinstance(text, bytes) else str(text)


def parse_selector(text: str, param: str = "match[]") -> Selector:
    """A series selector; 400 naming ``param`` when it is not one."""
    p = _Parser(text, param)
    sel = p.selector()
    p.end()
    return sel


def parse_query(text: str, param: str = "query") -> Query:
    """``selector`` or ``func(selector[range])``; 400 naming ``param`` otherwise."""
    return _Parser(text, param).query()
