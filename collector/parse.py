"""Prometheus text-format parsing: a fast path for Triton's output, held equal to a reference.

Contract
--------
``parse_reference`` is the oracle: prometheus_client's own text parser, with its output
normalised into :class:`schemas.samples.MetricFamily`.  ``parse`` is what production calls, and
for every input it returns exactly what ``parse_reference`` returns (or raises ``ParseError``
when it raises).  It gets there in one of two ways:

* ``parse_fast`` handles the regular text that Triton's prometheus-cpp writes: ``# HELP`` and
  ``# TYPE`` lines with single spaces, ``name{a="b",...} value`` or ``name value`` sample lines,
  label values without backslashes, no timestamps.  It reproduces prometheus_client's grouping
  rules line for line (the same state machine: a sample whose name the current family does not
  allow becomes an untyped one-sample family, counter families lose ``_total`` and counter
  samples gain it, histograms own ``_bucket``/``_sum``/``_count`` but not ``_created``...).
* The moment it meets a line it does not handle with certainty (an escape, a timestamp, odd
  whitespace, a comment other than HELP/TYPE, a duplicate label, an unknown TYPE, a value it
  cannot read) it returns ``None`` and ``parse`` hands the *whole* payload to
  ``parse_reference``.  Declining is always safe; guessing never is.  The differential tests
  (every fixture, generated Triton payloads, hypothesis-generated text) hold the two equal and
  check that Triton's regular output really takes the fast path.

Note what the reference does to names, because consumers see it too: a Triton counter
``nv_inference_count`` (declared ``# TYPE nv_inference_count counter``) comes back as family
``nv_inference_count`` whose samples are named ``nv_inference_count_total``.

Both entry points refuse hostile input the same way (a line over 64 KiB, a sample with more than
1,000 labels), so the equality holds there too.

Exceptions::

    ValueError
     └── ParseError          .line_no (1-based, 0 if unknown), .line (truncated offending line)
"""

from __future__ import annotations

import io
import math
import operator
import re
from collections.abc import Callable
from typing import Any

from prometheus_client.parser import text_fd_to_metric_families

from tritonwatch.schemas.samples import METRIC_TYPES, MetricFamily, Sample, make_labels
from tritonwatch.schemas.untrusted import log_safe

__all__ = [
    "MAX_LABELS",
    "MAX_LINE_CHARS",
    "ParseError",
    "parse",
    "parse_fast",
    "parse_reference",
    "restore_exposed_names",
]

#: Longest accepted line, in characters (after UTF-8 decoding).  Triton's longest lines are a
#: few hundred characters; anything near this is an attack or a broken exporter.
MAX_LINE_CHARS = 64 * 1024
#: Most labels accepted on one sample.
MAX_LABELS = 1000

_LINE_QUOTE_CHARS = 200

# prometheus_client's own validation rules (validation.py), written out so the fast path can
# decide without importing private helpers.  fullmatch, not match-with-$: `$` would accept a
# trailing newline.
_METRIC_NAME_RE = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
# Stricter than the reference (which also allows ':' in label names): the fast path only needs
# to be right about what it accepts, and Triton never puts ':' in a label name.
_LABEL_NAME_RE = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_HELP_ESCAPE_RE = re.compile(r"\\[\\n]")
_HELP_ESCAPES = {"\\\\": "\\", "\\n": "\n"}
# str.strip() (what the reference applies to a line) strips all Unicode whitespace, but its
# token splitter only skips these; a HELP text starting with one of them is left to it.
_ASCII_WHITESPACE = " \t\n\r\x0b\x0c"

# Types the fast path knows the grouping rules of; anything else (info, stateset, typos) is
# declined.  Values: the type our MetricFamily reports.
_FAST_TYPES = {
    "counter": "counter",
    "gauge": "gauge",
    "histogram": "histogram",
    "summary": "summary",
    "untyped": "untyped",
    "unknown": "untyped",
}
# Sample-name suffixes each type accepts into its family (prometheus_client text parser).
_ALLOWED_SUFFIXES = {
    "counter": ("",),
    "gauge": ("",),
    "summary": ("_count", "_sum", ""),
    "histogram": ("_count", "_sum", "_bucket"),
}

# Label-set cache shared by all calls: parsing a head is the costly part of a cold parse, and
# the cache also hands out the very same label tuples for the same series each time (the store
# compares them by identity first).  Keyed by the raw `name{...}` text, which holds no target
# name, so a fleet of servers with the same models shares entries; the value is a pure function
# of the key, so sharing it between threads is harmless.  A target's steady state does not come
# here at all (collector.shape reads a payload with an unchanged structure as values only), so
# the cache serves first scrapes and changed payloads, and is kept small: an entry costs about
# 250 bytes beside the label set it shares, so the bound is ~1 MB (longer heads than
# _SHARED_TEXT_MAX are never cached).
# Past it, new heads are parsed cold and not cached; nothing is evicted (a fleet whose series
# outnumber the bound would otherwise turn every lookup into a miss).  Series that went away
# stay cached until ``clear_head_cache()``.  The shared heads (a model's families, the same on
# every server running it) come first and stay; what fills the rest is mostly heads naming
# one server's GPUs (its UUIDs), each used once: ``bench.memory_state --targets 1000`` found
# the cache full at the former bound of 20,000 (4.8 MB; 1.0 at this one).
_HEAD_CACHE: dict[str, tuple[str, tuple[tuple[str, str], ...]]] = {}
_HEAD_CACHE_MAX = 4_096


def clear_head_cache() -> None:
    """Forget every cached label set (series that went away stop taking memory)."""
    _HEAD_CACHE.clear()


# Building NamedTuples through tuple.__new__ skips the generated Python-level __new__, which
# is a measurable share of the per-sample cost.
_new_tuple: Callable[..., Any] = tuple.__new__


class ParseError(ValueError):
    """A payload that is not valid Prometheus text (or breaks a safety limit).

    ``line_no`` is 1-based (0 when the line is not known), ``line`` the offending line cut to
    about 200 characters; the message quotes it.
    """

    def __init__(self, reason: str, line_no: int = 0, line: str = "") -> None:
        if len(line) > _LINE_QUOTE_CHARS:
            line = line[:_LINE_QUOTE_CHARS] + "..."
        # prometheus_client's messages quote the text they refused, raw and whole (a 64 KiB
        # line, with its NUL, ESC and CR bytes): escaped and cut like the line.
        self.reason = log_safe(reason, _LINE_QUOTE_CHARS)
        self.line_no = line_no
        self.line = line
        where = f"line {line_no}: " if line_no else ""
        super().__init__(f"{where}{self.reason}: {line!r}")


# --------------------------------------------------------------------------------------------
# Entry points


def parse(text: str | bytes) -> list[MetricFamily]:
    """Parse a /metrics payload, keeping sample names as the target exposed them.

    Identical to :func:`parse_reference` followed by :func:`restore_exposed_names` (the
    differential tests hold it so), usually much faster.
    """
    text = _decode(text)
    families = parse_fast(text, exposed_names=True)
    if families is None:
        return restore_exposed_names(parse_reference(text), text)
    return families


_COUNTER_TYPE_RE = re.compile(r"^[ \t]*#[ \t]+TYPE[ \t]+(\S+)[ \t]+counter[ \t\r]*$", re.M)


def restore_exposed_names(families: list[MetricFamily], text: str) -> list[MetricFamily]:
    """Undo prometheus_client's ``_total`` suffix on counters declared without it.

    prometheus_client munges ``# TYPE nv_inference_count counter`` into samples named
    ``nv_inference_count_total`` (its OpenMetrics view).  Prometheus itself stores the name the
    target exposed, and that is the name users query and alert on, so the store keeps it too.
    """
    declared = set(_COUNTER_TYPE_RE.findall(text))
    out = []
    for family in families:
        if family.type == "counter" and family.name in declared:
            suffixed = family.name + "_total"
            family = family._replace(samples=tuple(
                s._replace(name=family.name) if s.name == suffixed else s
                for s in family.samples
            ))
        out.append(family)
    return out


def parse_reference(text: str) -> list[MetricFamily]:
    """prometheus_client's text parser, normalised into our types (the oracle for ``parse``).

    Timestamps and exemplars are dropped; ``unknown`` (and any type outside the Prometheus text
    format: info, stateset, gaugehistogram) is reported as ``untyped``.
    """
    lines = text.split("\n")
    _check_line_lengths(text, lines)
    reader = _CountingReader(text)
    try:
        metrics = list(text_fd_to_metric_families(reader))
    except Exception as exc:
        # prometheus_client raises bare ValueErrors (sometimes without a message), IndexErrors
        # and friends; the line being read when it gave up is the best pointer we have.
        reason = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        line = reader.last_line.rstrip("\r\n")
        raise ParseError(reason, reader.line_no, line) from exc

    families = []
    for metric in metrics:
        samples = []
        for s in metric.samples:
            if len(s.labels) > MAX_LABELS:
                line_no, line = _find_many_labels_line(lines)
                raise ParseError(f"more than {MAX_LABELS} labels on one sample", line_no, line)
            samples.append(Sample(s.name, make_labels(s.labels), _to_float(s.value)))
        typ = metric.type if metric.type in METRIC_TYPES else "untyped"
        families.append(MetricFamily(metric.name, typ, metric.documentation, tuple(samples)))
    return families


def parse_fast(text: str, *, exposed_names: bool = False) -> list[MetricFamily] | None:
    """The fast path alone: the parsed families, or ``None`` where it declines the payload.

    It declines whenever it is not certain to match :func:`parse_reference`; it raises
    ``ParseError`` only for the safety limits.
    """
    lines = text.split("\n")
    _check_line_lengths(text, lines)
    cache = _HEAD_CACHE
    new = _new_tuple
    out: list[MetricFamily] = []

    # The reference's state machine, variable for variable (text_fd_to_metric_families).
    name = ""
    doc = ""
    typ = "untyped"
    samples: list[Sample] = []
    allowed: tuple[str, ...] = ()

    for line in lines:
        if not line:
            continue
        if line[0] == "#":
            line = line.strip()
            if line.startswith("# HELP "):
                cand, _, text = line[7:].partition(" ")
                if not _valid_metric_name(cand) or (text and text[0] in _ASCII_WHITESPACE):
                    return None
            elif line.startswith("# TYPE "):
                cand, _, text = line[7:].partition(" ")
                if not _valid_metric_name(cand) or text not in _FAST_TYPES:
                    return None
            else:
                # Plain comments are harmless, but the reference tokenises them with rules
                # (quote tracking, repeated separators) that can turn one into a HELP.
                return None
            if cand != name:
                # A new name closes the family, as in the reference: its HELP or TYPE line then
                # sets doc or typ, and the other keeps the reference's start value.
                if not _close(out, name, doc, typ, samples, exposed_names):
                    return None
                name, doc, typ, samples, allowed = cand, "", "untyped", [], (cand,)
            if line[2] == "H":
                if "\\" in text:
                    text = _HELP_ESCAPE_RE.sub(_help_unescape, text)
                doc = text
            else:
                typ = text
                allowed = tuple(name + s for s in _ALLOWED_SUFFIXES.get(typ, ("",)))
            continue

        # The value is the text after the last space: label values may hold spaces, values
        # never do, and a timestamp leaves a head that fails validation below.
        head, _, vs = line.rpartition(" ")
        hit = cache.get(head)
        if hit is None:
            if line.isspace():  # e.g. the "\r" of a blank CRLF line
                continue
            hit = _parse_head(head)
            if hit is None:
                return None
            if len(hit[1]) > MAX_LABELS:
                raise ParseError(
                    f"more than {MAX_LABELS} labels on one sample", lines.index(line) + 1, line
                )
            if len(cache) < _HEAD_CACHE_MAX and len(head) <= _SHARED_TEXT_MAX:
                cache[head] = hit
        try:
            value = float(vs)
        except ValueError:
            return None
        if "_" in vs:  # float() accepts "1_000"; the reference does not
            return None
        if not value and "-" in vs:
            # The reference tries int() first, so "-0" is 0.0 there but -0.0 for float().
            value = _reference_value(vs)

        sname = hit[0]
        if sname in allowed:
            samples.append(new(Sample, (sname, hit[1], value)))
        else:
            if not _close(out, name, doc, typ, samples, exposed_names):
                return None
            name = ""
            doc = ""
            typ = "untyped"
            samples = []
            allowed = ()
            single = (new(Sample, (sname, hit[1], value)),)
            out.append(new(MetricFamily, (sname, "untyped", "", single)))

    if not _close(out, name, doc, typ, samples, exposed_names):
        return None
    return out


def _close(
    out: list[MetricFamily], name: str, doc: str, typ: str, samples: list[Sample],
    exposed_names: bool,
) -> bool:
    """Append the family being read (none while ``name`` is empty) to ``out``; False where
    the fast path declines it."""
    if not name:
        return True
    fam = _build(name, doc, typ, samples, exposed_names)
    if fam is None:
        return False
    out.append(fam)
    return True


# --------------------------------------------------------------------------------------------
# Helpers


def _decode(text: str | bytes) -> str:
    if isinstance(text, str):
        return text
    try:
        return text.decode("utf-8")
    except UnicodeDecodeError as exc:
        line_no = text.count(b"\n", 0, exc.start) + 1
        start = text.rfind(b"\n", 0, exc.start) + 1
        end = text.find(b"\n", exc.start)
        raw = text[start : end if end >= 0 else len(text)]
        line = raw.decode("utf-8", "replace")
        raise ParseError(f"invalid UTF-8 ({exc.reason})", line_no, line) from exc


def _check_line_lengths(text: str, lines: list[str]) -> None:
    # A payload shorter than the limit cannot hold a line longer than it; this keeps the
    # common case to one comparison.
    if len(text) <= MAX_LINE_CHARS or max(map(len, lines)) <= MAX_LINE_CHARS:
        return
    for i, line in enumerate(lines):
        if len(line) > MAX_LINE_CHARS:
            raise ParseError(f"line longer than {MAX_LINE_CHARS} characters", i + 1, line)


def _find_many_labels_line(lines: list[str]) -> tuple[int, str]:
    # Only reached on the refusal path; each label needs an '=', so this finds the culprit
    # (or, with '=' inside quoted values, a line at least as suspicious).
    for i, line in enumerate(lines):
        if not line.lstrip().startswith("#") and line.count("=") > MAX_LABELS:
            return i + 1, line
    return 0, ""


class _CountingReader(io.StringIO):
    """A StringIO that remembers how many lines prometheus_client has pulled from it."""

    line_no = 0
    last_line = ""

    # typeshed declares _IOBase.__next__ as returning bytes; a StringIO yields str.
    def __next__(self) -> str:  # type: ignore[override]
        line = super().__next__()
        self.line_no += 1
        self.last_line = line
        return line


def _to_float(value: float) -> float:
    if isinstance(value, int):
        try:
            return float(value)
        except OverflowError:
            # float() of the same digits gives ±inf; keep both paths in agreement.
            return math.inf if value > 0 else -math.inf
    return float(value)


def _reference_value(vs: str) -> float:
    try:
        return _to_float(int(vs))
    except ValueError:
        return float(vs)


def _help_unescape(match: re.Match[str]) -> str:
    return _HELP_ESCAPES[match.group(0)]


def _valid_metric_name(name: str) -> bool:
    if name in _VALID_NAMES:
        return True
    if _METRIC_NAME_RE.fullmatch(name) is None:
        return False
    if len(_VALID_NAMES) >= _TOKENS_MAX:
        _VALID_NAMES.clear()
    _VALID_NAMES.add(name)
    return True


# Metric names already validated, and the bound on this and the other small caches below.
_VALID_NAMES: set[str] = set()
_TOKENS_MAX = 10_000


def _parse_head(head: str) -> tuple[str, tuple[tuple[str, str], ...]] | None:
    """``name`` or ``name{a="b",...}`` -> (name, labels), or None to decline."""
    if not head.endswith("}"):
        return (head, ()) if _valid_metric_name(head) else None
    name, _, raw = head.partition("{")
    if not _valid_metric_name(name):
        return None
    if raw == "}":
        return name, ()
    if "\\" in raw:
        return None
    # Without backslashes a '"' always opens or closes a value, so splitting on it alternates
    # between the text around values (even indices: `,a=`, `,b=`, ..., and the closing `}`)
    # and the values themselves (odd indices).  The leading comma makes every name token look
    # alike.
    parts = ("," + raw).split('"')
    if len(parts) % 2 == 0 or parts[-1] != "}":
        return None
    skeleton = tuple(parts[:-1:2])
    shape = _SKELETONS.get(skeleton)
    if shape is None:
        shape = _check_skeleton(skeleton)
    names, reorder = shape
    if not names:
        return None
    values = parts[1::2]
    pairs = list(zip(names, values if reorder is None else reorder(values), strict=True))
    if len(_PAIRS) < _PAIRS_MAX and len(_NAMES) < _PAIRS_MAX and len(raw) <= _SHARED_TEXT_MAX:
        # Share equal (name, value) pairs and names between all the label sets of a fleet:
        # heads parsed cold (past the head cache) then cost one small tuple each, not a
        # fresh copy of every string (measured: most of the collector's memory at 1,000
        # targets x 566 series).
        labels = tuple(map(_PAIRS.setdefault, pairs, pairs))
        if len(_LABELSETS) < _LABELSETS_MAX:
            # And equal label sets: a Triton payload lists each one under several names (566
            # series, 153 label sets), and servers of one deployment share their models'.
            labels = _LABELSETS.setdefault(labels, labels)
        return _NAMES.setdefault(name, name), labels
    return name, tuple(pairs)


# Interned sample names and (label, value) pairs (see _parse_head).  A fleet has a few thousand
# distinct pairs (models, versions, GPU UUIDs, buckets); past the bound nothing more is shared.
_PAIRS: dict[tuple[str, str], tuple[str, str]] = {}
_NAMES: dict[str, str] = {}
_PAIRS_MAX = 100_000
# Only texts up to this long are cached or shared: the tables are bounded in entries and never
# emptied, and one hostile line may be 64 KiB.  Triton's longest heads are about 200.
_SHARED_TEXT_MAX = 1024
_LABELSETS: dict[tuple[tuple[str, str], ...], tuple[tuple[str, str], ...]] = {}
_LABELSETS_MAX = 200_000


# Validated label-name sequences, keyed by the text around the values (`(',model=',
# ',version=')`).  A scrape uses a few dozen such shapes, so each is checked by regex once.
# The value is the label names in sorted order (empty when the shape is not acceptable) and,
# unless the text already lists them in that order, a getter that puts the values in it
# (prometheus-cpp writes `le` and `quantile` last).
_Shape = tuple[tuple[str, ...], "Callable[[list[str]], tuple[str, ...]] | None"]
_SKELETONS: dict[tuple[str, ...], _Shape] = {}


def _check_skeleton(skeleton: tuple[str, ...]) -> _Shape:
    names = tuple(token[1:-1] for token in skeleton)
    ok = (
        all(t.startswith(",") and t.endswith("=") for t in skeleton)
        and all(_LABEL_NAME_RE.fullmatch(n) and not n.startswith("__") for n in names)
        and len(set(names)) == len(names)  # the reference rejects duplicates
    )
    shape: _Shape = ((), None)
    if ok:
        order = sorted(range(len(names)), key=names.__getitem__)
        if order == list(range(len(names))):
            shape = (names, None)
        else:
            shape = (tuple(names[i] for i in order), operator.itemgetter(*order))
    if len(_SKELETONS) >= _TOKENS_MAX:
        _SKELETONS.clear()
    _SKELETONS[skeleton] = shape
    return shape


def _build(
    name: str, doc: str, typ: str, samples: list[Sample], exposed_names: bool = False
) -> MetricFamily | None:
    """prometheus_client's build_metric, in our types; None where the reference would raise."""
    if typ == "counter":
        if name.endswith("_total"):
            name = name[:-6]
            if not name:
                return None
        elif samples and not exposed_names:
            new = _new_tuple
            samples = [new(Sample, (s[0] + "_total", s[1], s[2])) for s in samples]
    if len(_NAMES) < _PAIRS_MAX and len(name) + len(doc) <= _SHARED_TEXT_MAX:
        # Every server of a fleet repeats the same family names and HELP texts.  (Bounded in
        # length too: the table is never emptied, and a hostile HELP may be 1 MB long.)
        name, doc = _NAMES.setdefault(name, name), _NAMES.setdefault(doc, doc)
    return MetricFamily(name, _FAST_TYPES[typ], doc, tuple(samples))
