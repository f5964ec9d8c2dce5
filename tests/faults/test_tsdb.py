"""Issue 18 item 2: time series on a Prometheus-compatible TSDB, relational state in PostgreSQL.

End to end: a real ``tritonwatch serve`` with ``store.timeseries`` pointing at a real
VictoriaMetrics and ``store.url`` at a real PostgreSQL scrapes simulated Triton targets; its
API's ``query_range`` (the store's bucket read) answers from VictoriaMetrics, which holds
exactly what the Prometheus API of VictoriaMetrics itself returns, while PostgreSQL holds the
targets' health and no samples.  Plus the configuration's checks (errors naming the key).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.fixtures_http import free_port
from tests.scale.receivers import VictoriaMetrics, running
from tests.scale.targets import simulated_targets
from tests.scale.test_remote_write_receivers import wait_for
from tritonwatch.schemas.config import ConfigError, validate_config
from tritonwatch.store import Query, open_store

CLI = [sys.executable, "-m", "tritonwatch.cli"]
TARGETS = ("sim-a", "sim-b")
TS = {"write_url": "http://vm:8428/api/v1/write", "query_url": "http://vm:8428"}


def test_timeseries_config_is_validated_with_errors_naming_the_key() -> None:
    ok = validate_config({"store": {"url": "postgresql://tw@db/tw", "timeseries": {
        **TS, "bearer_token": "t0ken", "timeout": "5s", "max_response_size": "16MiB"}}})
    ts = ok.store.timeseries
    assert ts is not None and ts.timeout == 5.0 and ts.max_response_size == 16 * 1024**2
    assert ts.auth_headers() == {"Authorization": "Bearer t0ken"}
    assert ts.as_remote_write().url == TS["write_url"]
    assert "t0ken" not in repr(ok)

    with pytest.raises(ConfigError) as sqlite:
        validate_config({"store": {"url": "sqlite:///x.db", "timeseries": TS}})
    assert any(e.startswith("store: timeseries: needs url to be PostgreSQL")
               for e in sqlite.value.errors), sqlite.value.errors
    with pytest.raises(ConfigError) as bad:
        validate_config({"store": {"url": "postgresql://tw@db/tw", "timeseries": {
            "write_url": "ftp://x", "query_url": TS["query_url"], "timeout": "soon"}}})
    joined = "\n".join(bad.value.errors)
    assert "store.timeseries.write_url" in joined and "store.timeseries.timeout" in joined
    with pytest.raises(ConfigError, match="set one of basic_auth and bearer_token"):
        validate_config({"store": {"url": "postgresql://tw@db/tw", "timeseries": {
            **TS, "bearer_token": "a", "basic_auth": {"username": "u", "password": "p"}}}})
    with pytest.raises(ConfigError, match="name 'store' is taken"):
        validate_config({"store": {"url": "postgresql://tw@db/tw", "timeseries": TS},
                         "remote_write": [{"name": "store", "url": TS["write_url"]}]})


def test_serve_with_a_tsdb_store_answers_queries_from_victoriametrics(
        tmp_path: Path, postgres_db_url: str) -> None:
    port = free_port()
    log = tmp_path / "serve.log"
    with running(VictoriaMetrics(tmp_path / "vm")) as vm, simulated_targets() as sims:
        config = {
            "targets": [{"name": n, "metrics_url": sims.url(n)} for n in TARGETS],
            "scrape": {"interval": "1s", "timeout": "1s"},
            "store": {"url": postgres_db_url, "flush_interval": "1s",
                      "spill_dir": str(tmp_path / "spill"),
                      "timeseries": {
                          "write_url": vm.write_url, "query_url": vm.url,
                          "queue": {"shards": 2, "batch_send_deadline": "1s"},
                          "buffer": {"dir": str(tmp_path / "rw"), "max_size": "64MiB",
                                     "segment_size": "1MiB"}}},
            "api": {"listen": f"127.0.0.1:{port}"},
            "reports": {"enabled": False},
            "alerting": {"eval_interval": "1s"},
        }
        path = tmp_path / "tw.yaml"
        path.write_text(yaml.safe_dump(config))
        with open(log, "ab") as out:
            proc = subprocess.Popen([*CLI, "serve", "--config", str(path)], cwd=tmp_path,
                                    stdout=out, stderr=subprocess.STDOUT, env=dict(os.environ))
        try:
            api = f"http://127.0.0.1:{port}/api/v1/query_range"

            def answered() -> list[dict[str, Any]]:
                vm.flush()
                r = httpx.get(api, params={"query": "nv_inference_count", "step": "1",
                                           "start": time.time() - 120,
                                           "end": time.time()}, timeout=10)
                result: list[dict[str, Any]] = r.json()["data"]["result"]
                # Both targets, several scrapes each, through the TSDB.
                targets = {s["metric"].get("target") for s in result}
                return result if targets >= set(TARGETS) and sum(
                    len(s["values"]) for s in result) >= 4 * len(result) else []

            result = wait_for(answered, 90, "query_range answered from VictoriaMetrics", log)

            def evaluated() -> dict[str, float]:
                text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
                found = {line.rpartition(" ")[0]: float(line.rpartition(" ")[2])
                         for line in text.splitlines()
                         if line.startswith("tritonwatch_alert_") and " " in line}
                return found if found.get("tritonwatch_alert_evaluations_total", 0) >= 3 else {}

            # The alert engine's built-in rules read through the TSDB, none of them failing.
            metrics = wait_for(evaluated, 90, "three alert evaluations", log)
            failures = {k: v for k, v in metrics.items()
                        if k.startswith(("tritonwatch_alert_rule_failures_total",
                                         "tritonwatch_alert_store_errors_total")) and v}
            assert failures == {}, log.read_text(errors="replace")[-3000:]
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(60) == 0, log.read_text(errors="replace")[-3000:]
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
        vm.flush()
        # What the API read equals what VictoriaMetrics' own PromQL holds, series for series.
        raw = vm.raw_samples('{__name__="nv_inference_count"}', time.time() - 600, time.time())
        def ident(labels: dict[str, str]) -> tuple[str, str, str]:
            return labels["target"], labels["model"], labels.get("version", "")
        held = {ident(dict(k)): {v for _, v in points} for k, points in raw.items()}
        assert set(held) == {ident(s["metric"]) for s in result}
        for s in result:  # every value the API answered is a sample VictoriaMetrics holds
            assert {float(v) for _, v in s["values"]} <= held[ident(s["metric"])]
        # PostgreSQL keeps the relational state and no samples.
        assert " ERROR " not in log.read_text(errors="replace")
        pg = open_store(postgres_db_url)
        try:
            assert {h.target for h in pg.health()} >= set(TARGETS)
            assert pg.count_samples() == 0
            assert pg.read(Query("nv_inference_count", start=0, end=time.time())).keys == []
        finally:
            pg.close(flush=False)
