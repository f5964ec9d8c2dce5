"""The `tritonwatch` console script, run as a user would (a subprocess)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tritonwatch.collector.parse import parse
from tritonwatch.schemas.samples import label_value

RIG = Path(__file__).parent.parent / "fixtures" / "rig"
EXE = Path(sys.executable).with_name("tritonwatch")


def run(*args, check=True, timeout=60):
    proc = subprocess.run([str(EXE), *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "COLUMNS": "200"})
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


def test_console_script_is_installed():
    assert EXE.exists(), "pip install -e . should install the tritonwatch entry point"
    assert "check-config" in run("--help").stdout


def test_check_config_ok(tmp_path):
    path = tmp_path / "ok.yaml"
    path.write_text("targets:\n  - {name: a, metrics_url: 'http://h:8002/metrics'}\n")
    assert "OK (1 target(s), store sqlite)" in run("check-config", str(path)).stdout


def test_check_config_prints_every_error_with_its_key_path(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(
        "targets:\n"
        "  - {name: a, metrics_url: 'ftp://h'}\n"
        "  - {name: b, metrics_url: 'http://h/m', scrape_interval: often}\n"
        "scrape: {timeout: 1m}\n"
    )
    proc = run("check-config", str(path), check=False)
    assert proc.returncode == 2
    assert "3 error(s)" in proc.stderr
    assert "targets[0].metrics_url: 'ftp://h' is not an http(s) URL" in proc.stderr
    assert "targets[1].scrape_interval: invalid duration 'often'" in proc.stderr
    assert "scrape: timeout (60s) must not exceed interval (15s)" in proc.stderr


def test_inspect_one_snapshot_lists_families_and_gauge_slis():
    proc = run("inspect", str(RIG / "metrics-load-1.prom"), "--json")
    result = json.loads(proc.stdout)
    text = (RIG / "metrics-load-1.prom").read_text()
    families = parse(text)
    assert result["series"] == sum(len(f.samples) for f in families)
    assert {f["name"] for f in result["families"]} == {f.name for f in families}
    kv = result["models"]["fake_llm"]["kv_cache_utilization"]
    raw = {label_value(s.labels, "kv_cache_block_type"): s.value for f in families
           for s in f.samples if f.name == "nv_trt_llm_kv_cache_block_metrics"}
    assert kv == pytest.approx(raw["used"] / raw["max"])
    assert "request_rate" not in result["models"].get("batcher", {})  # needs two snapshots


def counter(text, name, model):
    return sum(s.value for f in parse(text) for s in f.samples
               if s.name == name and label_value(s.labels, "model") == model)


def test_inspect_two_snapshots_gives_rates_and_fill_rate():
    a, b = RIG / "metrics-load-1.prom", RIG / "metrics-load-2.prom"
    result = json.loads(run("inspect", str(a), str(b), "--seconds", "5",
                            "--max-batch-size", "batcher=16", "--json").stdout)
    batcher = result["models"]["batcher"]
    ta, tb = a.read_text(), b.read_text()
    d_count = counter(tb, "nv_inference_count", "batcher") - counter(ta, "nv_inference_count",
                                                                       "batcher")
    d_exec = counter(tb, "nv_inference_exec_count", "batcher") - counter(
        ta, "nv_inference_exec_count", "batcher")
    assert batcher["batch_fill_rate"] == pytest.approx(d_count / d_exec / 16, rel=1e-4)
    assert batcher["inference_rate"] == pytest.approx(d_count / 5, rel=1e-4)
    assert result["interval_s"] == 5


def test_inspect_table_output_is_readable():
    out = run("inspect", str(RIG / "metrics-load-1.prom"), str(RIG / "metrics-load-2.prom"),
              "--seconds", "5", "--max-batch-size", "batcher=16").stdout
    assert "nv_inference_count" in out and "batcher" in out and "fill" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["a.prom", "b.prom"], "two sources need --seconds"),
        (["a.prom", "--seconds", "3"], "needs a URL"),
        (["x.prom", "--max-batch-size", "batcher"], "expected MODEL=N"),
        (["/no/such/file.prom"], "No such file"),
    ],
)
def test_inspect_usage_errors(args, message):
    proc = run("inspect", *args, check=False)
    assert proc.returncode == 2 and message in proc.stderr


@pytest.mark.triton
def test_inspect_live_server_reads_max_batch_size_from_the_api(triton_rig, rig_load):
    rig_load(concurrency=6)
    result = json.loads(run("inspect", triton_rig.metrics_url, "--seconds", "2",
                            "--http-url", triton_rig.http_url, "--json").stdout)
    batcher = result["models"]["batcher"]
    assert batcher["request_rate"] > 0
    assert 0 < batcher["batch_fill_rate"] <= 1
    # Both are rounded to 6 decimals in the output: compare within that rounding.
    assert batcher["batch_fill_rate"] == pytest.approx(batcher["avg_batch_size"] / 16, abs=2e-6)


def test_check_config_refuses_a_sqlite_url_without_a_file(tmp_path):
    path = tmp_path / "mem.yaml"
    path.write_text("store: {url: 'sqlite://'}\n")
    proc = run("check-config", str(path), check=False)
    assert proc.returncode == 2
    assert "store.url: names no database file" in proc.stderr


def _versions_snapshot(counts):
    lines = ["# TYPE nv_inference_request_success counter"]
    lines += [f'nv_inference_request_success{{model="{m}",version="{v}"}} {n}'
              for (m, v), n in counts.items()]
    return "\n".join(lines) + "\n"


def test_inspect_keeps_every_version_of_a_model_apart(tmp_path):
    # A canary rollout: version 10 next to version 2 (numeric order), plus a one-version model.
    a, b = tmp_path / "a.prom", tmp_path / "b.prom"
    a.write_text(_versions_snapshot({("m", "10"): 0, ("m", "2"): 0, ("solo", "3"): 0}))
    b.write_text(_versions_snapshot({("m", "10"): 10, ("m", "2"): 100, ("solo", "3"): 50}))
    result = json.loads(run("inspect", str(a), str(b), "--seconds", "10", "--json").stdout)
    assert result["models"]["m"] == {
        "versions": {"2": {"request_rate": 10.0}, "10": {"request_rate": 1.0}}
    }
    assert list(result["models"]["m"]["versions"]) == ["2", "10"]
    # One version: the flat dict of SLIs, as before; its version is in model_versions.
    assert result["models"]["solo"] == {"request_rate": 5.0}
    assert result["model_versions"] == {"m": ["2", "10"], "solo": ["3"]}

    table = run("inspect", str(a), str(b), "--seconds", "10").stdout
    rows = [line.replace("│", " ").split() for line in table.splitlines()
            if line.startswith("│") and ("m " in line or "solo" in line)]
    assert ["model", "version", "req/s"] in [
        line.replace("┃", " ").split() for line in table.splitlines()
    ]
    assert [r for r in rows if r[0] in ("m", "solo")] == [
        ["m", "2", "10.0"], ["m", "10", "1.0"], ["solo", "3", "5.0"]
    ]


@pytest.mark.triton
def test_debug_logging_leaves_out_a_line_per_request_unless_asked(triton_rig):
    # At 1,000 targets httpx's line per scrape request would be hundreds of lines a second.
    args = ("inspect", triton_rig.metrics_url, "--json")
    quiet = run("-vv", *args).stderr
    assert "DEBUG" in quiet or "INFO" in quiet  # -vv still logs our own debug lines
    assert "HTTP Request" not in quiet and "httpcore" not in quiet
    assert "HTTP Request: GET " + triton_rig.metrics_url in run("-vvv", *args).stderr
