"""Differential tests: the steady-state parse (collector.shape) returns exactly what parse() does.

``parse_columns(text, prev)`` may read ``text`` as a value array against ``prev``, a shape built
from an earlier payload, instead of parsing it.  Whatever it does, ``shape.families(values)``
must equal ``parse(text)`` (and it must raise ``ParseError`` exactly when parse() does), for
every pair of payloads: same structure with new values (the shortcut), values the fast path
declines, and payloads whose structure changed in any way.
"""

from __future__ import annotations

import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.collector.test_parse import (
    ALL_PROM,
    FAST_FIXTURES,
    PAYLOAD_SHAPES,
    canon,
    read,
    regular_exposition,
    wild_exposition,
)
from tests.payloads import triton_payload
from tritonwatch.collector.parse import ParseError, parse
from tritonwatch.collector.shape import Shape, parse_columns

# The value at the end of each sample line (not comments).
_SAMPLE_VALUE = re.compile(r"(?m)^([^#\n][^\n]*) ([^ \n]+)$")


def assert_columns_match(text: str, prev: Shape | None) -> Shape | None:
    """parse_columns(text, prev) agrees with parse(text); returns the shape it gave."""
    try:
        expected = parse(text)
    except ParseError:
        with pytest.raises(ParseError):
            parse_columns(text, prev)
        return None
    shape, values = parse_columns(text, prev)
    assert len(values) == len(shape) == len(shape.names) == len(shape.labels)
    assert canon(shape.families(values)) == canon(expected)
    assert [(s.name, s.labels, repr(s.value)) for s in shape.samples(values)] == [
        (s.name, s.labels, repr(s.value)) for f in expected for s in f.samples
    ]
    return shape


def settled(text: str) -> Shape:
    """The shape a target has once ``text``'s structure has repeated (the second scrape)."""
    first, _ = parse_columns(text)
    assert not first.steady  # a matcher is built only for a structure seen twice
    shape, _ = parse_columns(text, first)
    return shape


def with_values(text: str, values: list[str]) -> str:
    it = iter(values)
    return _SAMPLE_VALUE.sub(lambda m: f"{m.group(1)} {next(it, m.group(2))}", text)


# --------------------------------------------------------------------------------------------
# Fixtures and generated Triton payloads


@pytest.mark.parametrize("path", ALL_PROM, ids=lambda p: p.name)
def test_every_fixture_reads_like_parse_cold_and_against_itself(path):
    text = read(path)
    shape = assert_columns_match(text, None)
    # Read again against its own shape (a full parse that builds the shortcut, where the
    # payload allows one), and a third time: the shortcut.
    again = assert_columns_match(text, shape)
    third = assert_columns_match(text, again)
    if again is not None and again.steady:
        assert third is again


@pytest.mark.parametrize("path", FAST_FIXTURES, ids=lambda p: p.name)
def test_regular_exporter_output_gets_a_steady_shape(path):
    assert settled(read(path)).steady


@pytest.mark.parametrize("kw", PAYLOAD_SHAPES, ids=repr)
def test_consecutive_triton_scrapes(kw):
    kw = dict(kw)
    step = kw.pop("step", 0)
    first = triton_payload(**kw, step=step)
    assert_columns_match(first, None)
    shape = settled(first)
    assert shape.steady
    assert_columns_match(first, shape)
    # The same series with every value changed: the shortcut, same shape object back.
    values = [repr(float(i) * 1.5) for i in range(len(shape))]
    changed = with_values(first, values)
    assert assert_columns_match(changed, shape) is shape
    # triton_payload reorders series between steps: a new structure, a new shape, and no
    # shortcut built for it until it repeats.
    later = triton_payload(**kw, step=step + 1)
    other = assert_columns_match(later, shape)
    assert other is not None and other is not shape and not other.steady
    assert canon(other.families(parse_columns(later, other)[1])) == canon(parse(later))


def test_the_shortcut_reuses_names_and_labels_lists():
    text = triton_payload(models=2, gpus=1)
    shape = settled(text)
    again, values = parse_columns(with_values(text, ["7"] * len(shape)), shape)
    assert again is shape and again.names is shape.names and again.labels is shape.labels
    assert set(values.tolist()) == {7.0}


@pytest.mark.parametrize(
    "token",
    ["1_000", "-0", "-0.0", "+Inf", "-Inf", "NaN", "nan", "1e400", "0x10", "abc", "1" * 80,
     "1\t", "٣", "+1", ".5", "5.", "1e-3", "-1.5E+3"],
)
def test_every_value_spelling_reads_like_parse(token):
    text = triton_payload(models=1, gpus=1)
    shape = settled(text)
    n = len(shape)
    for k in (0, n // 2, n - 1):
        values = ["1"] * n
        values[k] = token
        assert_columns_match(with_values(text, values), shape)


@pytest.mark.parametrize(
    "mutate",
    [
        lambda t: t.replace('model="preprocessing"', 'model="preprocessinG"', 1),  # a label
        lambda t: t.replace("# HELP nv_inference_count", "# HELP nv_inference_count x", 1),
        lambda t: t.replace("# TYPE nv_inference_count counter", "# TYPE nv_inference_count gauge"),
        lambda t: t + 'extra_series{a="b"} 1\n',  # a series more
        lambda t: t.split("\n", 3)[3],  # lines fewer
        lambda t: t.replace("\n", "\r\n"),
        lambda t: t.replace(" ", "  ", 1),
        lambda t: t.replace("} ", "} 1 ", 1),  # a timestamp-like extra token
        lambda t: t.replace("}", ',a="b\\n"}', 1),  # an escape: the reference's turf
        lambda t: t.replace('="', '= "', 1),
        lambda t: t[:-40],  # a truncated body
        lambda t: "",
    ],
)
def test_a_changed_structure_is_parsed_in_full(mutate):
    text = triton_payload(models=3, gpus=2)
    shape = settled(text)
    changed = mutate(text)
    assert changed != text
    got = assert_columns_match(changed, shape)
    assert got is not shape


def test_a_token_moved_to_another_line_is_not_the_same_structure():
    # Without the marks where each token was, these two payloads' text between tokens joins
    # to the same "x\ny\n", with two tokens each: the second would read as x 1 and y 2.
    shape = settled("x 1\ny 2\n")
    for moved in ("x 1\ny\n 2", "x\ny 1\n 2", "x 1\ny\n 2\n"):
        got = assert_columns_match(moved, shape)
        assert got is not shape


def test_control_characters_anywhere_keep_the_shortcut_and_values_holding_them_do_not():
    # The skeleton is hashed as a sequence of texts, so no character has to be kept free to
    # mark where the tokens were: a HELP text holding every control character still gets the
    # shortcut (a joined skeleton had needed one the payload lacked, and had none here).
    controls = "".join(map(chr, (*range(0, 10), *range(11, 32))))
    text = f"# HELP x a {controls} b\n# TYPE x gauge\nx 1\ny 2\n"
    shape = settled(text)
    assert shape.steady
    assert assert_columns_match(text.replace("x 1", "x 3"), shape) is shape
    # A value holding one reads as parse() reads it: whitespace float() strips (vertical tab,
    # carriage return) through the shortcut, anything else in full.
    for odd in ("\x0b3", "3\r", "3\x00", "3\x01"):
        got = assert_columns_match(text.replace("x 1", f"x {odd}"), shape)
        assert (got is shape) == (odd.strip() == "3"), repr(odd)
    # The same text between tokens, cut at other places, is another structure.
    moved = text.replace("x 1\ny 2\n", "x\x001\ny 2\n")
    assert assert_columns_match(moved, shape) is not shape

def test_down_to_the_reference_and_back():
    # A payload the fast path declines has no shortcut; the next regular one gets one again.
    regular = triton_payload(models=1, gpus=1)
    escaped = regular.replace("}", ',x="a\\\\b"}', 1)
    shape = assert_columns_match(escaped, None)
    assert shape is not None and not shape.steady
    back = assert_columns_match(regular, shape)
    assert back is not None and not back.steady
    again = assert_columns_match(regular, back)
    assert again is not None and again.steady


def test_bytes_are_decoded():
    text = triton_payload(models=1, gpus=1)
    shape, values = parse_columns(text.encode())
    assert canon(shape.families(values)) == canon(parse(text))
    with pytest.raises(ParseError, match="UTF-8"):
        parse_columns(b"a 1\n\xff 2\n", shape)


def test_families_keep_filters_samples_not_families():
    text = triton_payload(models=2, gpus=1)
    shape, values = parse_columns(text)
    full = shape.families(values)
    kept = shape.families(values, keep={"nv_inference_count"})
    assert [f.name for f in kept] == [f.name for f in full]
    for f, k in zip(full, kept, strict=True):
        assert k.samples == (f.samples if f.name == "nv_inference_count" else ())


# --------------------------------------------------------------------------------------------
# Hypothesis: any pair of payloads

VALUE_TOKENS = st.one_of(
    st.sampled_from(["0", "-0", "1", "1.5", "NaN", "+Inf", "-Inf", "1e3", "1_0", "0x1", "x",
                     "", "٣", "1\r", "inf", "-nan", "1" * 70]),
    st.floats(allow_nan=True).map(repr),
    st.integers(-(10**30), 10**30).map(str),
)


@st.composite
def same_structure(draw, text):
    n = len(_SAMPLE_VALUE.findall(text))
    return with_values(text, draw(st.lists(VALUE_TOKENS, min_size=n, max_size=n)))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data(), regular_exposition())
def test_hypothesis_new_values_against_a_regular_payload(data, text):
    assert_columns_match(text, None)
    shape = assert_columns_match(text, settled(text))
    assert shape is not None
    # Regular text gets the shortcut, unless a value is too long to be read by it.
    assert shape.steady or max(len(v) for _, v in _SAMPLE_VALUE.findall(text)) > 64
    assert_columns_match(data.draw(same_structure(text)), shape)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(regular_exposition(), st.one_of(regular_exposition(), wild_exposition()))
def test_hypothesis_any_second_payload(first, second):
    shape = assert_columns_match(first, None)
    assert_columns_match(second, shape)
    assert_columns_match(second, settled(first))


def test_equal_structures_share_their_parts_and_still_tell_lengths_apart():
    # Two servers of one deployment (the same lines up to values): their shapes hold one copy
    # of the spans, masks, comment tokens and skeleton lengths between them.
    text = triton_payload(models=3, gpus=2, seed=1)
    a = settled(text)
    b = settled(with_values(text, ["7"] * 3))
    assert a is not b and a.spans is b.spans
    ma, mb = a._matcher, b._matcher
    assert ma is not None and mb is not None
    assert ma.comment_tokens is mb.comment_tokens
    assert ma.value_mask is mb.value_mask and ma.comment_mask is mb.comment_mask
    # A label value of another length (same line count, same tokens) is another structure.
    longer = text.replace('model="', 'model="x', 1)
    assert longer.count("\n") == text.count("\n")
    got = assert_columns_match(longer, a)
    assert got is not a
