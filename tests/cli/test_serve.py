"""`tritonwatch serve` as a process: API up, scraping a real Triton, SIGTERM flushes the buffer."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from store import open_store
from tests.fixtures_http import free_port

EXE = Path(sys.executable).with_name("tritonwatch")


def start_serve(args, cwd):
    return subprocess.Popen([str(EXE), "serve", *args], cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=dict(os.environ))


def wait_for(url, predicate, timeout=30.0):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            last = httpx.get(url, timeout=2)
            if predicate(last):
                return last
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise AssertionError(f"{url} never became ready; last answer {last}")


def stop(proc):
    proc.send_signal(signal.SIGTERM)
    try:
        out, _ = proc.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    return proc.returncode, out


def test_serve_without_config_starts_empty_on_defaults(tmp_path):
    port = free_port()
    proc = start_serve(["--listen", f"127.0.0.1:{port}"], tmp_path)
    try:
        wait_for(f"http://127.0.0.1:{port}/healthz", lambda r: r.status_code == 200)
        # No targets; at most the local NVML source, which on a host without a GPU says why.
        health = httpx.get(f"http://127.0.0.1:{port}/api/v1/targets").json()
        assert all(h["source"] == "nvml" for h in health)
        assert all(h["up"] or h["error"].startswith("NVML unavailable") for h in health)
    finally:
        code, out = stop(proc)
    assert code == 0, out
    assert (tmp_path / "tritonwatch-data" / "tritonwatch.db").exists()


@pytest.mark.triton
def test_serve_scrapes_the_rig_and_flushes_on_sigterm(triton_rig, rig_load, tmp_path):
    rig_load(concurrency=4)
    port = free_port()
    db = tmp_path / "tw.db"
    config = tmp_path / "tw.yaml"
    # A flush interval far beyond the test: only the shutdown flush can write the samples.
    config.write_text(
        "targets:\n"
        f"  - {{name: rig, metrics_url: '{triton_rig.metrics_url}',"
        f" http_url: '{triton_rig.http_url}'}}\n"
        "scrape: {interval: 1s, timeout: 1s, api_interval: 2s}\n"
        f"store: {{url: 'sqlite:///{db}', flush_interval: 1h}}\n"
    )
    proc = start_serve(["--config", str(config), "--listen", f"127.0.0.1:{port}"], tmp_path)
    try:
        base = f"http://127.0.0.1:{port}"
        targets = wait_for(f"{base}/api/v1/targets",
                           lambda r: len([t for t in r.json() if t["up"]]) == 2)
        assert {t["source"] for t in targets.json() if t["target"] == "rig"} == {"metrics", "api"}
        time.sleep(3)  # a few scrapes, so rates exist
        metrics = httpx.get(f"{base}/metrics").text
        assert 'tritonwatch_target_up{source="metrics",target="rig"} 1.0' in metrics
    finally:
        code, out = stop(proc)
    assert code == 0, out
    with open_store(f"sqlite:///{db}") as store:
        names = {k.name for k in store.series(target="rig")}
        assert {"nv_inference_count", "sli:request_rate", "sli:batch_fill_rate"} <= names
        (rate,) = store.range("sli:request_rate", start=0, end=time.time(),
                              match={"model": "batcher"})
        assert len(rate.values) >= 2 and min(rate.values) > 0
