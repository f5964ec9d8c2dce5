"""The steady-state parse: a target's payload structure, kept between scrapes, and its values.

A Triton server lists the same series, in the same order, under the same HELP and TYPE lines,
scrape after scrape; only the numbers change.  :func:`parse_columns` therefore parses a target's
first payload (and any payload whose structure changed) with :func:`collector.parse.parse`,
keeps the result as a :class:`Shape` (sample names, label tuples, family boundaries: everything
but the values), and reads later payloads as *one float array* against that shape, without
building a single per-sample object.  Measured on a 2,879-series Triton payload: 0.8 ms per
scrape instead of 1.9 ms for the line-by-line fast path, and no ``Sample`` tuples to keep.

Why the shortcut returns exactly what ``parse`` would (the differential tests hold it so):

* A payload is split at each line's last token (the text after its last space, as
  ``str.rpartition`` splits a line; one regular expression split, in C): the tokens, and the
  *skeleton*, the text between them.  On a payload the line-by-line fast path accepted, every
  sample line's token is its value (the text after the line's last space, which is what the
  fast path reads).  A shape records which tokens are sample values.
* A later payload takes the shortcut only if it has as many tokens, the same skeleton (the
  sequence of texts between tokens, compared by hash: equal sequences are equal text but for
  the tokens, each token in the same place) and the same tokens on every other line.  Then
  every line, head and comment is the same as in the shape's payload, so the fast path would
  take the same decisions on it, except those that depend on a value: the value tokens are
  converted exactly as it converts them (``float()``, refusing ``1_000``, the reference's
  ``-0``), and anything unusual (a token that ``float()`` refuses; one over 64 characters is
  not read as a token) sends the payload to the full parser instead.  Measured on the
  2,879-series payload when the split was introduced (glibc's default malloc settings): 0.6 ms
  of splitting and hashing, where splitting into lines and each line at its last space took
  0.85; under ``serve``'s settings, see the next point.
* The skeleton is compared by the hash of the tuple of its texts (each text's SipHash, keyed
  per process, so a target cannot steer a collision), which keeps a shape small: the skeleton
  itself is not stored.  Hashed as a tuple rather than joined into one string (with a control
  character marking where each token was, which the payload then had to lack): the joined
  copy was a fresh 370 KiB allocation a scrape of a 2,879-series payload, over the mapping
  threshold ``serve`` sets (``tritonwatch.memory.tune_malloc``), so each of its pages faulted
  in; measured with that setting, split and hash 840 -> 740 us.

Payloads the fast path declines (escapes, timestamps, exotic types...) get a shape without a
matcher: each scrape is parsed in full, as before.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Container
from itertools import compress
from typing import Any, NamedTuple, TypeVar

import numpy as np
import numpy.typing as npt

from tritonwatch.collector.parse import (
    MAX_LINE_CHARS,
    _decode,
    _reference_value,
    parse_fast,
    parse_reference,
    restore_exposed_names,
)
from tritonwatch.schemas.samples import Labels, MetricFamily, Sample, Snapshot

__all__ = ["Shape", "match", "parse_columns"]

Values = npt.NDArray[np.float64]

# Longest value token the shortcut converts; longer ones (never seen from an exporter) go to
# the full parser and its limits.
_MAX_TOKEN = 64

_new_tuple = tuple.__new__
_intern = sys.intern
_FLIP = bytes.maketrans(b"\x00\x01", b"\x01\x00")


# Shapes of a fleet are mostly alike (servers of one deployment list the same families, and
# the same lines up to label values), and a fleet keeps one per target: the parts that are
# equal (spans, masks, comment tokens, skeleton lengths) are one shared object for all of them.
# Bounded in entries and bytes, never emptied (like collector.parse's tables): past the bound
# new parts are kept unshared.
_SHARED_PARTS: dict[Any, Any] = {}
_SHARED_PARTS_MAX = 10_000
_SHARED_PARTS_BYTES_MAX = 32 * 1024 * 1024
_shared_parts_bytes = [0]
_T = TypeVar("_T", bytes, tuple[Any, ...])


def _shared(part: _T, size: int) -> _T:
    """The shared object equal to ``part`` (``size``: about its bytes), or ``part`` itself."""
    found = _SHARED_PARTS.get(part)
    if found is not None:
        return found  # type: ignore[no-any-return]
    if len(_SHARED_PARTS) < _SHARED_PARTS_MAX and (
        _shared_parts_bytes[0] + size <= _SHARED_PARTS_BYTES_MAX
    ):
        _shared_parts_bytes[0] += size
        _SHARED_PARTS[part] = part
    return part


class _Span(NamedTuple):
    name: str
    type: str
    help: str
    start: int
    stop: int


#: A line's last token: the text after its last space (``str.rpartition``'s), up to the end of
#: the line, of at most ``_MAX_TOKEN`` characters.  Splitting a payload by it gives, in one
#: pass in C, the text between the tokens and the tokens themselves (lines without a space
#: have none).  A longer last token is no token at all: its line keeps the whole of it in the
#: text between tokens, so a value grown past the bound changes the token count and the
#: payload goes to the full parser, as a token that long always did (the bound had been a
#: second pass over every token, ``max(map(len, tokens))``, 6 % of a match).  Possessive
#: (``{0,64}+``): a line whose last token is longer fails at once instead of trying every
#: shorter length; no shorter one can end the line.
_LAST_TOKEN = re.compile(rf" ([^ \n]{{0,{_MAX_TOKEN}}}+)$", re.MULTILINE)


def _skeleton(text: str) -> tuple[int, list[str]]:
    """The hash of ``text``'s skeleton (the texts between its lines' last tokens, in order),
    and the split itself (text between tokens, then a token, alternately)."""
    parts = _LAST_TOKEN.split(text)
    return hash(tuple(parts[0::2])), parts


class _Matcher:
    """Recognises a payload with the same structure as the one a shape was built from."""

    __slots__ = ("comment_mask", "comment_tokens", "n_tokens", "skeleton_hash", "value_mask")

    def __init__(self, skeleton_hash: int, tokens: list[str], value_mask: bytes) -> None:
        self.n_tokens = len(tokens)
        self.skeleton_hash = skeleton_hash
        self.value_mask = _shared(value_mask, len(value_mask))
        self.comment_mask = _shared(value_mask.translate(_FLIP), len(value_mask))
        # Every other line's last word (HELP and TYPE lines: the same few dozen words on
        # every server): with the skeleton, the whole line.
        ends = tuple(map(_intern, compress(tokens, self.comment_mask)))
        self.comment_tokens = _shared(ends, 8 * len(ends))

    def values(self, text: str) -> Values | None:
        """The sample values of ``text``, or None when its structure differs (or is unusual)."""
        skeleton_hash, parts = _skeleton(text)
        tokens = parts[1::2]
        if len(tokens) != self.n_tokens or skeleton_hash != self.skeleton_hash:
            return None
        if tuple(compress(tokens, self.comment_mask)) != self.comment_tokens:
            return None
        return _convert(list(compress(tokens, self.value_mask)))


def _convert(tokens: list[str]) -> Values | None:
    """``tokens`` as the fast path reads values, or None where it would decline them."""
    if not tokens:
        return np.empty(0, np.float64)
    # No token is longer than _MAX_TOKEN: _LAST_TOKEN does not take one.
    joined = "".join(tokens)
    if "_" in joined:  # float() accepts "1_000"; the reference does not
        return None
    try:
        # numpy converts each str with Python's own float() (the same acceptance and
        # rounding; tests/collector/test_shape.py holds it equal), without a list of floats.
        values = np.array(tokens, np.float64)
    except ValueError:
        return None
    if "-" in joined:
        # The reference tries int() first, so "-0" is 0.0 there but -0.0 for float().
        for i in np.flatnonzero(values == 0).tolist():
            if "-" in tokens[i]:
                values[i] = _reference_value(tokens[i])
    return values


class Shape:
    """Everything of one parsed payload except its sample values.

    ``names`` and ``labels`` are lists, one entry per sample in exposition order; they are the
    same list objects for every scrape read against this shape (the store recognises an
    unchanged series list by identity).  Immutable by convention: nothing mutates them.
    """

    __slots__ = ("_matcher", "labels", "names", "spans")

    def __init__(self, families: list[MetricFamily], matcher: _Matcher | None = None) -> None:
        names: list[str] = []
        labels: list[Labels] = []
        spans = []
        for f in families:
            start = len(names)
            for s in f.samples:
                names.append(s.name)
                labels.append(s.labels)
            spans.append(_Span(f.name, f.type, f.help, start, len(names)))
        self.names = names
        self.labels = labels
        self.spans = _shared(tuple(spans), 120 * len(spans))
        self._matcher = matcher

    def __len__(self) -> int:
        return len(self.names)

    @property
    def steady(self) -> bool:
        """Whether later payloads of the same structure skip the full parse."""
        return self._matcher is not None

    def families(self, values: Values, keep: Container[str] | None = None) -> list[MetricFamily]:
        """The families with ``values``; those not in ``keep`` (when given) without samples."""
        new = _new_tuple
        names, labels = self.names, self.labels
        out = []
        for span in self.spans:
            name, typ, help_text, lo, hi = span
            if keep is not None and name not in keep:
                samples: tuple[Sample, ...] = ()
            else:
                samples = tuple(
                    new(Sample, item)
                    for item in zip(names[lo:hi], labels[lo:hi], values[lo:hi].tolist(),
                                    strict=True)
                )
            out.append(MetricFamily(name, typ, help_text, samples))
        return out

    def samples(self, values: Values) -> list[Sample]:
        new = _new_tuple
        return [new(Sample, item)
                for item in zip(self.names, self.labels, values.tolist(), strict=True)]

    def snapshot(
        self, target: str, ts: float, values: Values, keep: Container[str] | None = None
    ) -> Snapshot:
        return Snapshot(target, ts, tuple(self.families(values, keep)))


def match(text: str, prev: Shape | None) -> Values | None:
    """The values of ``text`` when it has ``prev``'s structure (the steady state), else None.

    Cheap where it answers None: a changed payload usually differs in its number of lines.
    """
    if prev is None or prev._matcher is None:
        return None
    return prev._matcher.values(text)


def parse_columns(
    text: str | bytes, prev: Shape | None = None, *, try_match: bool = True
) -> tuple[Shape, Values]:
    """Parse a payload into ``(shape, values)``; ``prev`` is the shape of the target's last one.

    Returns ``prev`` itself when the payload has its structure, else a new shape.  Raises
    ``ParseError`` exactly where :func:`collector.parse.parse` does.  ``try_match=False``: the
    caller has already tried :func:`match` on this payload, and it answered None.
    """
    text = _decode(text)
    if try_match:
        values = match(text, prev)
        if values is not None:
            assert prev is not None
            return prev, values
    families = parse_fast(text, exposed_names=True)
    if families is None:
        families = restore_exposed_names(parse_reference(text), text)  # as parse() does
        return Shape(families), _values_of(families)
    values = _values_of(families)
    shape = Shape(families)
    # A matcher costs about as much again as the parse, so it is built only once the structure
    # has repeated: an exporter that reorders its series every scrape never pays for one.
    if prev is not None and prev.names == shape.names and prev.labels == shape.labels:
        shape._matcher = _matcher_for(text, values)
    return shape, values


def _values_of(families: list[MetricFamily]) -> Values:
    return np.fromiter((s.value for f in families for s in f.samples), np.float64)


def _matcher_for(text: str, values: Values) -> _Matcher | None:
    """A matcher for ``text`` (which the fast path accepted), or None if it cannot be built."""
    if len(text) > MAX_LINE_CHARS and max(map(len, text.split("\n"))) > MAX_LINE_CHARS - 256:
        return None  # a longer value could push a line over the limit: leave that to parse
    skeleton_hash, parts = _skeleton(text)
    tokens = parts[1::2]
    # Each token's line is the text before it back to the last newline: the line's head.  A
    # sample line is not a comment, and has a head and a token.  Its head is never empty on a
    # payload the fast path accepted (a name comes first); requiring it keeps equal skeletons
    # meaning a space in the same place on every sample line.
    heads = [before[before.rfind("\n") + 1:] for before in parts[0:-1:2]]
    value_mask = bytes(
        token != "" and head != "" and not head.startswith("#")
        for head, token in zip(heads, tokens, strict=True))
    if sum(value_mask) != len(values):
        return None
    # Belt and braces: the tokens must read back as the values the parser found.
    again = _convert(list(compress(tokens, value_mask)))
    if again is None or not np.array_equal(again, values, equal_nan=True):
        return None
    if not np.array_equal(np.signbit(again), np.signbit(values)):
        return None
    return _Matcher(skeleton_hash, tokens, value_mask)
