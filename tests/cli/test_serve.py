"""`tritonwatch serve` as a process: API up, scraping a real Triton, SIGTERM flushes the buffer."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.fixtures_http import free_port
from tritonwatch.store import open_store

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


def scrape_ts(answer):
    """When the rig's metrics were last scraped, by /api/v1/targets (0 if not yet)."""
    return max((t["ts"] for t in answer.json()
                if t["target"] == "rig" and t["source"] == "metrics"), default=0.0)


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
        first = scrape_ts(targets)
        # A few more scrapes, so rates exist: waited for (a fixed 3 s could hold fewer than
        # two rates on a busy machine), within wait_for's bound.
        wait_for(f"{base}/api/v1/targets", lambda r: scrape_ts(r) >= first + 2.9)
        wait_for(f"{base}/metrics", lambda r: (
            'tritonwatch_target_up{source="metrics",target="rig"} 1.0' in r.text
        ))
    finally:
        code, out = stop(proc)
    assert code == 0, out
    with open_store(f"sqlite:///{db}") as store:
        names = {k.name for k in store.series(target="rig")}
        assert {"nv_inference_count", "sli:request_rate", "sli:batch_fill_rate"} <= names
        (rate,) = store.range("sli:request_rate", start=0, end=time.time(),
                              match={"model": "batcher"})
        assert len(rate.values) >= 2 and min(rate.values) > 0, rate


def test_serve_shuts_down_cleanly_when_the_final_flush_fails(tmp_path, monkeypatch, caplog):
    # The database goes away just before shutdown: the final flush gives up after its attempts,
    # closing the store must not flush (and fail) once more and raise out of serve(), and the
    # signal handlers serve() installed must be gone afterwards.
    import asyncio

    from tritonwatch import serve as serve_mod
    from tritonwatch.schemas.config import validate_config
    from tritonwatch.schemas.samples import Sample
    from tritonwatch.store import StoreError

    monkeypatch.setattr(serve_mod, "FINAL_FLUSH_DELAY_S", 0.0, raising=False)
    config = validate_config({
        "store": {"url": f"sqlite:///{tmp_path}/tw.db"},
        "nvml": {"enabled": False},
        "api": {"listen": f"127.0.0.1:{free_port()}"},
    })
    calls = []
    stop = asyncio.Event()
    url = []

    async def database_goes_away(collector):
        await asyncio.sleep(0.5)  # after the jobs' first runs (a flush of nothing)
        store = collector.store
        url.append(store.url_redacted)

        def refuse(chunks):
            calls.append(len(chunks))
            raise StoreError(f"flush on {store.url_redacted} failed: db down",
                             url=store.url_redacted)

        monkeypatch.setattr(store, "_write_chunks", refuse)
        store.write("t", time.time(), [Sample("x", (), 1.0), Sample("y", (), 2.0)])
        stop.set()

    async def main():
        await serve_mod.serve(config, sidecar=database_goes_away, stop=stop)
        loop = asyncio.get_running_loop()
        # remove_signal_handler() is False when no handler is installed for the signal.
        return [loop.remove_signal_handler(sig) for sig in (signal.SIGINT, signal.SIGTERM)]

    with caplog.at_level("INFO", logger="tritonwatch.serve"):
        still_installed = asyncio.run(main())
    assert still_installed == [False, False]
    assert len(calls) == serve_mod.FINAL_FLUSH_ATTEMPTS  # no extra flush on close
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1, errors
    assert "2 buffered samples" in errors[0] and url[0] in errors[0]
