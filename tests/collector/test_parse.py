"""collector.parse: the fast path must equal prometheus_client's parser on every input.

The differential tests are the proof: every fixture (including the real Triton captures other
suites drop into tests/fixtures/rig/), generated Triton payloads, and hypothesis-generated text,
regular and hostile.  The inline tests pin down what the shared behaviour actually is.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Summary
from prometheus_client.exposition import generate_latest

from tests.payloads import series_count, triton_payload
from tritonwatch.collector import parse as parse_module
from tritonwatch.collector.parse import (
    MAX_LABELS,
    MAX_LINE_CHARS,
    ParseError,
    parse,
    parse_fast,
    parse_reference,
    restore_exposed_names,
)
from tritonwatch.schemas.samples import MetricFamily, Sample

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
ALL_PROM = sorted(FIXTURES.glob("**/*.prom"))
# Regular exporter output the fast path must take: our hand-made Triton-style files and every
# real capture from the rig.
FAST_FIXTURES = [
    *(
        FIXTURES / "parse" / name
        for name in (
            "crlf.prom",
            "custom_families.prom",
            "empty_labels.prom",
            "histogram_summary.prom",
            "special_values.prom",
            "triton_22_legacy.prom",
            "vllm.prom",
        )
    ),
    *sorted((FIXTURES / "rig").glob("**/*.prom")),
]
# Input the fast path must leave to the reference.
DECLINED_FIXTURES = [
    FIXTURES / "parse" / name
    for name in (
        "comments.prom",
        "crlf_trailing_space.prom",
        "escapes.prom",
        "timestamps.prom",
    )
]
PAYLOAD_SHAPES = [
    {"models": 1, "gpus": 1},
    {"models": 5, "gpus": 2, "trtllm": False},
    {"models": 20, "gpus": 8},
    {"models": 20, "gpus": 8, "seed": 3, "step": 7},
    {"models": 60, "gpus": 8, "seed": 1},
    {"models": 3, "gpus": 0},
]


def canon(families: list[MetricFamily]) -> list[tuple[object, ...]]:
    """Families with values as repr(): NaN equals NaN, and -0.0 differs from 0.0."""
    return [
        (f.name, f.type, f.help, [(s.name, s.labels, repr(s.value)) for s in f.samples])
        for f in families
    ]


def read(path: Path) -> str:
    # Bytes, not text mode: text mode would turn the CRLF fixtures into LF ones.
    return path.read_bytes().decode("utf-8")


def assert_same_as_reference(text: str) -> None:
    try:
        expected = parse_reference(text)
    except ParseError:
        with pytest.raises(ParseError):
            parse(text)
        # The fast path must never return a result the reference refuses.
        try:
            assert parse_fast(text) is None
        except ParseError:
            pass
        return
    assert canon(parse(text)) == canon(restore_exposed_names(expected, text))
    fast = parse_fast(text)
    assert fast is None or canon(fast) == canon(expected)
    fast = parse_fast(text, exposed_names=True)
    assert fast is None or canon(fast) == canon(restore_exposed_names(expected, text))


# --------------------------------------------------------------------------------------------
# Differential: fixtures and generated Triton payloads


def test_fixture_set_is_present():
    names = {p.name for p in ALL_PROM}
    assert {p.name for p in FAST_FIXTURES if p.parent.name == "parse"} <= names
    assert {p.name for p in DECLINED_FIXTURES} <= names


@pytest.mark.parametrize("path", ALL_PROM, ids=lambda p: str(p.relative_to(FIXTURES)))
def test_fixture_parses_like_the_reference(path):
    assert_same_as_reference(read(path))


@pytest.mark.parametrize("path", ALL_PROM, ids=lambda p: str(p.relative_to(FIXTURES)))
def test_fixture_bytes_and_text_agree(path):
    assert canon(parse(path.read_bytes())) == canon(parse(read(path)))


@pytest.mark.parametrize("shape", PAYLOAD_SHAPES, ids=repr)
def test_generated_triton_payload_parses_like_the_reference(shape):
    text = triton_payload(**shape)
    fast = parse_fast(text)
    assert fast is not None, "the fast path declined a regular Triton payload"
    assert canon(fast) == canon(parse_reference(text))


@pytest.mark.parametrize("path", FAST_FIXTURES, ids=lambda p: str(p.relative_to(FIXTURES)))
def test_fast_path_takes_regular_exporter_output(path):
    assert parse_fast(read(path)) is not None


@pytest.mark.parametrize("path", DECLINED_FIXTURES, ids=lambda p: p.name)
def test_fast_path_declines_what_it_cannot_prove(path):
    assert parse_fast(read(path)) is None
    # ...and parse still answers, through the reference.
    assert parse(read(path))


def test_cache_eviction_changes_nothing(monkeypatch):
    text = triton_payload(models=4, gpus=2)
    expected = canon(parse_reference(text))
    monkeypatch.setattr(parse_module, "_HEAD_CACHE", {})
    monkeypatch.setattr(parse_module, "_SKELETONS", {})
    monkeypatch.setattr(parse_module, "_VALID_NAMES", set())
    monkeypatch.setattr(parse_module, "_HEAD_CACHE_MAX", 7)
    monkeypatch.setattr(parse_module, "_TOKENS_MAX", 2)
    for _ in range(2):
        fast = parse_fast(text)
        assert fast is not None
        assert canon(fast) == expected
    assert len(parse_module._HEAD_CACHE) <= 7


def test_equal_label_sets_are_one_tuple_and_long_texts_are_never_kept(monkeypatch):
    for table in ("_HEAD_CACHE", "_PAIRS", "_NAMES", "_LABELSETS"):
        monkeypatch.setattr(parse_module, table, {})
    long_value = "x" * 2000
    text = (
        "# HELP a_total A.\n# TYPE a_total counter\n"
        'a_total{model="m",version="1"} 1\n'
        "# HELP b_total B.\n# TYPE b_total counter\n"
        'b_total{model="m",version="1"} 2\n'
        f'b_total{{model="{long_value}",version="1"}} 3\n'
        f"# HELP c {long_value}\n# TYPE c gauge\n"
        "c 4\n"
    )
    families = parse_fast(text)
    assert families is not None and canon(families) == canon(parse_reference(text))
    a, b, c = families
    # One label set under two names: one tuple (a payload lists each set under many names).
    assert a.samples[0].labels is b.samples[0].labels
    # The 2,000-character label value and HELP text are parsed as usual but kept nowhere:
    # the tables are bounded in entries only, and one hostile line may be 64 KiB.
    assert b.samples[1].labels == (("model", long_value), ("version", "1"))
    assert c.help == long_value
    for table in ("_HEAD_CACHE", "_PAIRS", "_NAMES", "_LABELSETS"):
        kept = getattr(parse_module, table)
        assert not any(long_value in repr(k) for k in kept), table
    assert 'a_total{model="m",version="1"}' in parse_module._HEAD_CACHE


# --------------------------------------------------------------------------------------------
# Inline payloads (in the style of prometheus_client's tests/test_parser.py)


def fam(
    name: str, typ: str, help_text: str, *samples: tuple[str, dict[str, str], float]
) -> MetricFamily:
    return MetricFamily(
        name, typ, help_text, tuple(Sample(n, tuple(sorted(lb.items())), v) for n, lb, v in samples)
    )


def test_triton_counter_keeps_its_exposed_sample_name():
    # prometheus_client's view is nv_inference_count_total; Prometheus (and our store) keep
    # the name Triton exposed, which is what users query.
    text = """# HELP nv_inference_count Number of inferences performed
# TYPE nv_inference_count counter
nv_inference_count{model="m",version="1"} 101.000000
"""
    expected = [
        fam("nv_inference_count", "counter", "Number of inferences performed",
            ("nv_inference_count", {"model": "m", "version": "1"}, 101.0)),
    ]
    assert parse(text) == expected
    assert parse(text.replace('="m"', '="\\\\m"'))[0].samples[0].name == "nv_inference_count"
    assert parse_reference(text)[0].samples[0].name == "nv_inference_count_total"
    assert restore_exposed_names(parse_reference(text), text) == expected


def test_counter_already_named_total():
    text = "# TYPE a_total counter\na_total{x=\"1\"} 3\n"
    assert parse(text) == [fam("a", "counter", "", ("a_total", {"x": "1"}, 3.0))]


def test_gauge_with_help_and_labels_sorted_canonically():
    text = """# HELP g Some gauge
# TYPE g gauge
g{version="1",model="m"} 32.09
"""
    (family,) = parse(text)
    assert family.samples[0].labels == (("model", "m"), ("version", "1"))
    assert family.samples[0].value == 32.09


def test_histogram_groups_bucket_sum_count_but_not_created():
    text = """# TYPE h histogram
h_bucket{le="1"} 0
h_bucket{le="+Inf"} 2
h_sum 3
h_count 2
h_created 1.7e+09
"""
    assert parse(text) == [
        fam("h", "histogram", "",
            ("h_bucket", {"le": "1"}, 0.0), ("h_bucket", {"le": "+Inf"}, 2.0),
            ("h_sum", {}, 3.0), ("h_count", {}, 2.0)),
        fam("h_created", "untyped", "", ("h_created", {}, 1.7e9)),
    ]


def test_summary_keeps_quantile_label_and_nan():
    text = """# TYPE s summary
s{quantile="0.5"} NaN
s_sum 0
s_count 0
"""
    (family,) = parse(text)
    assert family.type == "summary"
    assert [s.name for s in family.samples] == ["s", "s_sum", "s_count"]
    assert math.isnan(family.samples[0].value)


def test_samples_without_metadata_are_untyped_singletons():
    text = 'a{x="1"} 1\na{x="2"} 2\n'
    assert parse(text) == [
        fam("a", "untyped", "", ("a", {"x": "1"}, 1.0)),
        fam("a", "untyped", "", ("a", {"x": "2"}, 2.0)),
    ]


def test_type_before_help_and_empty_family():
    text = "# TYPE a gauge\n# HELP a doc\na 1\n# HELP b nothing written\n"
    assert parse(text) == [
        fam("a", "gauge", "doc", ("a", {}, 1.0)),
        MetricFamily("b", "untyped", "nothing written", ()),
    ]


def test_unknown_and_untyped_types_are_reported_as_untyped():
    text = "# TYPE a unknown\na 1\n# TYPE b untyped\nb 2\n"
    assert [f.type for f in parse(text)] == ["untyped", "untyped"]


def test_openmetrics_only_type_is_reported_as_untyped():
    (family,) = parse("# TYPE a info\na 1\n")
    assert family.type == "untyped"


def test_label_escapes_are_resolved():
    text = r'a{p="C:\\x",q="say \"hi\"",n="1\n2"} 1' + "\n"
    (family,) = parse(text)
    assert dict(family.samples[0].labels) == {"p": "C:\\x", "q": 'say "hi"', "n": "1\n2"}


def test_help_escapes_are_resolved():
    (family,) = parse("# HELP a back\\\\slash and\\nnewline\na 1\n")
    assert family.help == "back\\slash and\nnewline"


def test_timestamps_are_dropped():
    (family,) = parse("# TYPE a gauge\na 5 1395066363000\n")
    assert family.samples == (Sample("a", (), 5.0),)


def test_special_value_spellings():
    text = "\n".join(
        f'v{{k="{i}"}} {spelling}'
        for i, spelling in enumerate(["+Inf", "-Inf", "1e+06", "101.000000", "-0", "-0.0"])
    )
    values = [s.value for f in parse("# TYPE v gauge\n" + text) for s in f.samples]
    assert values[:4] == [math.inf, -math.inf, 1e6, 101.0]
    # The reference reads integers with int(): "-0" is +0.0 there, "-0.0" keeps its sign.
    assert math.copysign(1, values[4]) == 1.0
    assert math.copysign(1, values[5]) == -1.0


def test_label_value_may_hold_structural_characters():
    (family,) = parse('# TYPE a gauge\na{x="b c,d=}{"} 1\n')
    assert family.samples[0].labels == (("x", "b c,d=}{"),)


def test_bytes_are_decoded_as_utf8():
    text = '# HELP a ünïcode\na{m="módel"} 1\n'
    assert parse(text.encode()) == parse(text)


@pytest.mark.parametrize(
    "metric",
    [
        lambda r: Counter("reqs", "Requests", ["model"], registry=r),
        lambda r: Gauge("temp", "Temperature", ["model"], registry=r),
        lambda r: Histogram("lat", "Latency", ["model"], buckets=(0.1, 1.0), registry=r),
        lambda r: Summary("dur", "Duration", ["model"], registry=r),
    ],
    ids=["counter", "gauge", "histogram", "summary"],
)
def test_round_trip_through_prometheus_client_exposition(metric):
    registry = CollectorRegistry()
    m = metric(registry)
    for model in ("plain", 'quo"te', "back\\slash", "new\nline"):
        child = m.labels(model=model)
        if hasattr(child, "inc"):
            child.inc(3)
        else:
            child.observe(0.5)
    text = generate_latest(registry)
    families = parse(text)
    assert canon(families) == canon(parse_reference(text.decode()))
    models = {
        dict(s.labels).get("model") for f in families for s in f.samples if s.labels
    }
    assert {"plain", 'quo"te', "back\\slash", "new\nline"} <= models


# --------------------------------------------------------------------------------------------
# Errors


@pytest.mark.parametrize(
    ("text", "line_no"),
    [
        ('a{b="c" 1\n', 1),
        ("# TYPE a counter\na 1\nb{ 2\n", 3),
        ("a 1_000\n", 1),
        ("a{b=c} 1\n", 1),
        ('a{b="c",b="d"} 1\n', 1),
        ("ok 1\n# TYPE a\n", 2),
        ("a nope\n", 1),
        ('a{0x="1"} 1\n', 1),
        ('a{__reserved="1"} 1\n', 1),
    ],
)
def test_malformed_input_raises_parse_error_naming_the_line(text, line_no):
    for parser in (parse, parse_reference):
        with pytest.raises(ParseError) as info:
            parser(text)
        assert isinstance(info.value, ValueError)
        assert info.value.line_no == line_no
        offending = text.split("\n")[line_no - 1]
        assert info.value.line == offending
        assert repr(offending) in str(info.value)


def test_invalid_utf8_names_the_line():
    with pytest.raises(ParseError) as info:
        parse(b"a 1\nb\xff 2\n")
    assert info.value.line_no == 2
    assert "invalid UTF-8" in str(info.value)


def test_quoted_line_is_truncated():
    text = "a{" + "b" * 500 + "} 1\n"
    with pytest.raises(ParseError) as info:
        parse(text)
    assert len(info.value.line) < 210
    assert info.value.line.startswith("a{bbb")


@pytest.mark.parametrize("parser", [parse, parse_reference])
def test_overlong_line_is_refused(parser):
    text = "ok 1\n" + "a" * (MAX_LINE_CHARS + 1) + " 1\n"
    with pytest.raises(ParseError, match="longer than") as info:
        parser(text)
    assert info.value.line_no == 2


@pytest.mark.parametrize("parser", [parse, parse_reference])
def test_too_many_labels_are_refused(parser):
    labels = ",".join(f'l{i}="v"' for i in range(MAX_LABELS + 1))
    text = f"# TYPE a gauge\na{{{labels}}} 1\n"
    with pytest.raises(ParseError, match="labels") as info:
        parser(text)
    assert info.value.line_no == 2


def test_exactly_max_labels_is_accepted():
    labels = ",".join(f'l{i}="v"' for i in range(MAX_LABELS))
    (family,) = parse(f"# TYPE a gauge\na{{{labels}}} 1\n")
    assert len(family.samples[0].labels) == MAX_LABELS


# --------------------------------------------------------------------------------------------
# The payload generator itself


def test_default_payload_size_matches_its_docstring():
    assert series_count(triton_payload()) == 2879


def test_payload_scales_with_models_and_gpus():
    assert series_count(triton_payload(models=40)) > series_count(triton_payload(models=20))
    assert series_count(triton_payload(gpus=16)) > series_count(triton_payload(gpus=8))


def test_consecutive_payloads_look_like_consecutive_scrapes():
    before = {f.name: f for f in parse(triton_payload(step=0))}
    after = {f.name: f for f in parse(triton_payload(step=1))}
    assert before.keys() == after.keys()
    grew = 0
    for name, family in before.items():
        old = {(s.name, s.labels): s.value for s in family.samples}
        new = {(s.name, s.labels): s.value for s in after[name].samples}
        assert old.keys() == new.keys(), name
        if family.type == "counter":
            assert all(new[k] >= old[k] for k in old), name
            grew += sum(new[k] > old[k] for k in old)
    assert grew > 100


def test_payload_covers_the_triton_families():
    names = {f.name for f in parse(triton_payload())}
    assert {
        "nv_inference_request_success", "nv_inference_request_failure", "nv_inference_count",
        "nv_inference_exec_count", "nv_inference_request_duration_us",
        "nv_inference_queue_duration_us", "nv_inference_compute_input_duration_us",
        "nv_inference_compute_infer_duration_us", "nv_inference_compute_output_duration_us",
        "nv_inference_pending_request_count", "nv_model_load_duration_secs",
        "nv_inference_request_summary_us", "nv_inference_first_response_histogram_ms",
        "nv_gpu_utilization", "nv_gpu_memory_total_bytes", "nv_gpu_memory_used_bytes",
        "nv_gpu_power_usage", "nv_gpu_power_limit", "nv_energy_consumption",
        "nv_cpu_utilization", "nv_pinned_memory_pool_used_bytes", "nv_trt_llm_request_metrics",
        "nv_trt_llm_kv_cache_block_metrics", "nv_trt_llm_inflight_batcher_metrics",
        "nv_trt_llm_general_metrics", "nv_trt_llm_runtime_memory_metrics",
    } <= names


# --------------------------------------------------------------------------------------------
# Hypothesis: generated exposition text

NAMES = st.sampled_from(
    ["a", "b", "a_total", "nv_x", "vllm:y", "h", "s", "_total", "c_bucket", "a:b_total"]
)
SUFFIXES = st.sampled_from(["", "", "_total", "_bucket", "_sum", "_count", "_created"])
TYPES = st.sampled_from(
    ["counter", "gauge", "histogram", "summary", "untyped", "unknown", "info", "stateset"]
)
LABEL_NAMES = st.sampled_from(["model", "version", "le", "quantile", "gpu_uuid", "a", "_b"])
FLOATS = st.floats(allow_nan=True, allow_infinity=True)
VALUES = st.one_of(
    st.integers(-(10**20), 10**20).map(str),
    FLOATS.map(repr),
    FLOATS.map(lambda v: f"{v:f}" if math.isfinite(v) else ("+Inf" if v > 0 else str(v))),
    FLOATS.map(lambda v: f"{v:g}"),
    st.sampled_from(["NaN", "+Inf", "-Inf", "-0", "1e+06", "101.000000", "0", "nan", "Inf"]),
)
# Label values without backslashes or quotes: the fast path must accept every one of them.
PLAIN_TEXT = st.text(
    st.characters(exclude_categories=["Cs"], exclude_characters='\\"\n'), max_size=12
)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


@st.composite
def regular_exposition(draw):
    """Text as a regular exporter writes it: the fast path must take all of it."""
    lines = []
    for _ in range(draw(st.integers(0, 5))):
        name = draw(NAMES.filter(lambda n: n != "_total"))
        typ = draw(st.sampled_from(["counter", "gauge", "histogram", "summary", "untyped"]))
        if draw(st.booleans()):
            help_text = draw(PLAIN_TEXT.filter(lambda t: t[:1] not in " \t\r\x0b\x0c"))
            lines.append(f"# HELP {name} {help_text}".rstrip())
        if draw(st.booleans()):
            lines.append(f"# TYPE {name} {typ}")
        for _ in range(draw(st.integers(0, 4))):
            label_names = draw(st.lists(LABEL_NAMES, unique=True, max_size=4))
            labels = ",".join(f'{k}="{draw(PLAIN_TEXT)}"' for k in label_names)
            head = name + draw(SUFFIXES) + (f"{{{labels}}}" if labels or draw(st.booleans())
                                            else "")
            value = draw(VALUES)
            lines.append(f"{head} {value}")
        if draw(st.booleans()):
            lines.append("")
    end = draw(st.sampled_from(["\n", "\r\n"]))
    return end.join(lines) + (end if lines else "")


@st.composite
def wild_exposition(draw):
    """Text with everything the format allows and a good deal it does not."""
    lines = []
    for _ in range(draw(st.integers(0, 6))):
        kind = draw(st.sampled_from(["help", "type", "sample", "sample", "sample", "junk"]))
        name = draw(NAMES)
        sep = draw(st.sampled_from([" ", " ", " ", "  ", "\t"]))
        if kind == "help":
            help_text = draw(st.text(st.sampled_from(list('ab \\n"\t{}')), max_size=8))
            lines.append(f"# HELP{sep}{name} {help_text}")
        elif kind == "type":
            lines.append(f"# TYPE {name}{sep}{draw(TYPES)}")
        elif kind == "sample":
            pairs = draw(
                st.lists(
                    st.tuples(
                        st.one_of(LABEL_NAMES, st.sampled_from(["__name__", "0x", "a b"])),
                        st.text(st.sampled_from(list('a\\"n\n{},= é')), max_size=6),
                        st.booleans(),
                    ),
                    max_size=3,
                )
            )
            labels = ",".join(f'{k}="{_escape(v) if esc else v}"' for k, v, esc in pairs)
            if draw(st.booleans()) and labels:
                labels += ","
            head = name + draw(SUFFIXES) + (f"{{{labels}}}" if labels or draw(st.booleans())
                                            else "")
            value = draw(st.one_of(VALUES, st.sampled_from(["1_0", "", "x", "1 2", "0x1"])))
            stamp = draw(st.sampled_from(["", "", " 1395066363000", "\t17"]))
            lines.append(f"{head}{sep}{value}{stamp}")
        else:
            lines.append(draw(st.sampled_from(["#", "# plain comment", "#HELP a b", "  ", "}"])))
    end = draw(st.sampled_from(["\n", "\r\n", " \n"]))
    return end.join(lines) + end


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(regular_exposition())
def test_hypothesis_regular_text_takes_the_fast_path_and_matches(text):
    expected = parse_reference(text)
    fast = parse_fast(text)
    assert fast is not None, text
    assert canon(fast) == canon(expected)


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(wild_exposition())
def test_hypothesis_any_text_matches_or_both_refuse(text):
    assert_same_as_reference(text)
