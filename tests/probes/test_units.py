"""Probe arithmetic, parsing, config validation and the store path, without a server."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tritonwatch.collector.probes.base import ProbeFailure, Recorder
from tritonwatch.collector.probes.http_sse import SSEParser
from tritonwatch.collector.probes.sink import ProbeMetrics, run_samples
from tritonwatch.collector.probes.stats import describe, percentile, summarize
from tritonwatch.schemas.config import ConfigError, validate_config
from tritonwatch.schemas.probes import ProbeConfig, ProbeResult
from tritonwatch.store import open_store

CFG = ProbeConfig(name="p", url="127.0.0.1:1", model="m", ttft_slo=0.05, itl_slo=0.01)


def _rec(t0: int, tokens: list[int]) -> Recorder:
    rec = Recorder()
    rec.t0_ns = t0
    rec.token_ns = list(tokens)
    return rec


def test_itl_is_the_mean_gap_after_the_first_token_and_tpot_matches() -> None:
    ms = 1_000_000
    r = _rec(0, [40 * ms, 45 * ms, 52 * ms, 55 * ms]).result(CFG, "t", "id")
    assert r.ttft_s == pytest.approx(0.040)
    assert r.e2e_s == pytest.approx(0.055)
    assert r.gaps_s == pytest.approx((0.005, 0.007, 0.003))
    assert r.itl_s == pytest.approx(0.005)
    assert r.tpot_s == pytest.approx((0.055 - 0.040) / 3)
    assert r.tokens == 4 and r.tokens_per_s == pytest.approx(4 / 0.055)


def test_one_token_has_no_itl_and_failure_keeps_ttft() -> None:
    r = _rec(0, [10_000_000]).result(CFG, "t", "id")
    assert r.itl_s is None and r.tpot_s is None and r.ttft_s == pytest.approx(0.01)
    f = _rec(0, [10_000_000]).failure(CFG, "t", "id", ProbeFailure("truncated_stream", "cut"))
    assert not f.ok and f.error_kind == "truncated_stream" and f.tokens == 1


@given(st.lists(st.floats(-1e6, 1e6), min_size=1, max_size=50), st.floats(0, 100))
def test_percentile_matches_numpy_linear(values: list[float], q: float) -> None:
    import numpy as np

    got = percentile(sorted(values), q)
    assert math.isclose(got, float(np.percentile(values, q)), rel_tol=1e-9, abs_tol=1e-6)


def test_describe_has_every_key_and_none_when_empty() -> None:
    assert describe([]) == dict.fromkeys(("avg", "min", "max", "p50", "p90", "p95", "p99"))
    d = describe([1.0, 2.0, 3.0, 4.0], 1000)
    assert d["avg"] == 2500 and d["min"] == 1000 and d["max"] == 4000 and d["p50"] == 2500


def test_summary_pools_gaps_and_counts_errors() -> None:
    ms = 1_000_000
    a = _rec(0, [10 * ms, 11 * ms, 12 * ms]).result(CFG, "t", "a")  # itl 1 ms
    b = _rec(0, [10 * ms, 19 * ms]).result(CFG, "t", "b")  # itl 9 ms
    c = Recorder().failure(CFG, "t", "c", ProbeFailure("timeout", "slow"))
    s = summarize([a, b, c], duration_s=1.0)
    assert s["requests"] == 3 and s["errors"] == 1 and s["errors_by_kind"] == {"timeout": 1}
    assert s["itl_ms"]["avg"] == pytest.approx(5.0)  # mean of per-request means
    assert s["itl_pooled_ms"]["avg"] == pytest.approx(11 / 3)  # mean of the 3 gaps
    assert s["output_tokens_total"] == 5 and s["request_throughput_per_s"] == 2.0


def test_sse_parser_handles_split_chunks_and_crlf() -> None:
    p = SSEParser()
    assert list(p.feed(b"data: {\"a\"")) == []
    assert list(p.feed(b": 1}\n\ndata: x\r\n\r\n: comment\n\ndata")) == ['{"a": 1}', "x"]
    assert p.pending


def test_run_samples_give_slis_and_slo_events() -> None:
    ms = 1_000_000
    good = _rec(0, [40 * ms, 45 * ms]).result(CFG, "t", "a")
    slow = _rec(0, [90 * ms, 120 * ms]).result(CFG, "t", "b")
    bad = Recorder().failure(CFG, "t", "c", ProbeFailure("server_error", "boom", "500"))
    samples = {(s.name, dict(s.labels).get("sli", dict(s.labels).get("kind", ""))): s.value
               for s in run_samples(CFG, [good, slow, bad])}
    assert samples[("probe:ttft_seconds", "")] == pytest.approx(0.065)
    assert samples[("probe:requests", "")] == 3
    assert samples[("probe:errors", "server_error")] == 1
    assert samples[("probe:slo_total", "ttft")] == 3 and samples[("probe:slo_good", "ttft")] == 1
    assert samples[("probe:slo_good", "itl")] == 1 and samples[("probe:slo_good", "success")] == 2


def test_histograms_observe_results() -> None:
    metrics = ProbeMetrics()
    metrics.observe(_rec(0, [40_000_000, 45_000_000]).result(CFG, "t", "a"))
    metrics.observe(Recorder().failure(CFG, "t", "c", ProbeFailure("connect", "refused")))
    reg = metrics.registry
    labels = {"probe": "p", "model": "m"}
    assert reg.get_sample_value("tritonwatch_probe_ttft_seconds_count", labels) == 1
    assert reg.get_sample_value("tritonwatch_probe_ttft_seconds_bucket",
                                {"probe": "p", "model": "m", "le": "0.05"}) == 1
    assert reg.get_sample_value("tritonwatch_probe_errors_total",
                                {"probe": "p", "model": "m", "kind": "connect"}) == 1


def test_config_probes_resolve_targets_and_report_key_paths() -> None:
    ok = validate_config({
        "targets": [{"name": "a", "metrics_url": "http://h:8002/metrics", "grpc_url": "h:8001"}],
        "probes": [{"name": "p1", "target": "a", "model": "llm", "interval": "10s",
                    "timeout": "2s", "ttft_slo": "500ms"},
                   {"name": "p2", "url": "http://h:9000", "protocol": "openai", "model": "x"}],
    })
    assert ok.probes[0].interval == 10.0 and ok.probes[0].ttft_slo == 0.5
    with pytest.raises(ConfigError) as err:
        validate_config({
            "targets": [{"name": "a", "metrics_url": "http://h:8002/metrics"}],
            "probes": [{"name": "p", "target": "a", "model": "m", "protocol": "http"}],
        })
    assert "target 'a' has no http_url" in str(err.value)
    with pytest.raises(ConfigError) as err:
        validate_config({"probes": [{"name": "p", "model": "m", "url": "http://h:1",
                                     "protocol": "grpc"}]})
    assert "probes[0]" in str(err.value) and "host:port" in str(err.value)
    with pytest.raises(ConfigError) as err:
        validate_config({"probes": [{"name": "p", "model": "m", "url": "h:1", "bogus": 1}]})
    assert "probes[0].bogus" in str(err.value)


def test_probe_results_round_trip_through_the_store(tmp_path) -> None:
    store = open_store(f"sqlite:///{tmp_path}/tw.db")
    store.migrations.apply()
    ms = 1_000_000
    ok = _rec(0, [40 * ms, 45 * ms]).result(CFG, "t", "a")
    bad = Recorder().failure(CFG, "t", "b", ProbeFailure("server_error", "boom", "500"))
    assert store.write_probe_results([ok, bad]) == 2
    assert store.probe_results() == []  # buffered until flush
    store.flush()
    got = store.probe_results(probe="p")
    assert [r.ok for r in got] == [True, False]
    assert got[0].ttft_s == pytest.approx(0.04) and got[0].itl_s == pytest.approx(0.005)
    assert (got[1].error_kind, got[1].error_code, got[1].error_message) == (
        "server_error", "500", "boom")
    store.close()


def test_probe_result_is_frozen() -> None:
    r = ProbeResult(probe="p", target="t", model="m", protocol="grpc", ts=0.0, ok=True)
    with pytest.raises(AttributeError):
        r.ok = False  # type: ignore[misc]
