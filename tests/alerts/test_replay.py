"""Record → replay → alerts: recordings built from real rig captures plus synthetic ones."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from tritonwatch import cli
from tritonwatch.replay import ReplayError, backtest, load_recording, replay
from tritonwatch.schemas.alerts import AlertCandidate
from tritonwatch.schemas.samples import Sample, make_labels
from tritonwatch.store import Query, Store, open_store
from tritonwatch.store.alerts import AlertStore

RIG = Path(__file__).parent.parent / "fixtures" / "rig"
T0 = 1_800_000_000


class LatestAbove:
    """Fires per series whose latest sample within ``window`` s exceeds ``threshold``."""

    def __init__(self, name: str, series: str, threshold: float, *, match=None,
                 window: float = 10.0, for_s: float = 0.0, keep_firing_for_s: float = 0.0,
                 seen: list[Any] | None = None) -> None:
        self.name, self.series, self.threshold = name, series, threshold
        self.match, self.window = match, window
        self.for_s, self.keep_firing_for_s = for_s, keep_firing_for_s
        self.seen = seen

    def evaluate(self, store: Store, now: float) -> list[AlertCandidate]:
        out = []
        for data in store.read(Query(self.series, start=now - self.window, end=now,
                                     match=self.match)).series():
            value = data.values[-1]
            if self.seen is not None:
                self.seen.append((now, dict(data.labels), value))
            if value > self.threshold:
                labels = {"alertname": self.name, "model": dict(data.labels).get("model", "")}
                out.append(AlertCandidate(make_labels(labels),
                                          make_labels({"value": f"{value:.3g}"}), value))
        return out


def rig_recording(root: Path) -> Path:
    """idle → load-1 → load-2 → load-2 again, 15 s apart, with stats and model configs."""
    root.mkdir(parents=True, exist_ok=True)
    for offset, name in ((0, "metrics-idle"), (15, "metrics-load-1"), (30, "metrics-load-2"),
                         (45, "metrics-load-2")):
        shutil.copy(RIG / f"{name}.prom", root / f"{T0 + offset}.prom")
    shutil.copy(RIG / "stats-http.json", root / f"{T0 + 30}.stats.json")
    (root / "config").mkdir()
    for model in ("batcher", "fake_llm"):
        shutil.copy(RIG / f"config-{model}-http.json", root / "config" / f"{model}.json")
    return root


def test_replay_of_rig_captures_derives_rates_and_fires(tmp_path):
    seen: list[Any] = []
    rule = LatestAbove("BusyBatcher", "sli:request_rate", 50.0, match={"model": "batcher"},
                       seen=seen)
    outcome = replay(rig_recording(tmp_path / "rec"), [rule])
    assert (outcome.scrapes, outcome.evaluations, outcome.rule_failures) == (4, 4, {})
    # Rates come from consecutive scrapes exactly as live: (5525 - 2097) / 15 s at T0 + 30.
    rates = {now - T0: round(value, 1) for now, _, value in seen}
    assert rates[15] == pytest.approx(2097 / 15, abs=0.1)
    assert rates[30] == pytest.approx((5525 - 2097) / 15, abs=0.1)
    [alert] = outcome.alerts
    assert alert.alertname == "BusyBatcher"
    assert alert.labels == {"alertname": "BusyBatcher", "model": "batcher"}
    assert (alert.fired_at, alert.resolved_at) == (T0 + 15, T0 + 45)


def test_replay_uses_recorded_configs_for_the_fill_rate(tmp_path):
    seen: list[Any] = []
    rule = LatestAbove("FillRate", "sli:batch_fill_rate", 2.0, match={"model": "batcher"},
                       seen=seen)
    replay(rig_recording(tmp_path / "rec"), [rule])
    fill = [value for now, _, value in seen if now == T0 + 30]
    assert fill and 0 < fill[0] <= 1  # needs max_batch_size 16 from config/batcher.json


def test_replay_with_eval_interval_evaluates_between_scrapes(tmp_path):
    rule = LatestAbove("BusyBatcher", "sli:request_rate", 50.0, match={"model": "batcher"},
                       window=30.0, for_s=20.0)
    outcome = replay(rig_recording(tmp_path / "rec"), [rule], eval_interval=5.0)
    assert outcome.evaluations == 10  # T0, T0 + 5, ..., T0 + 45
    [alert] = outcome.alerts
    # Pending from T0 + 15, fired 20 s later on the 5 s grid (not at a scrape time).
    assert alert.fired_at == T0 + 35


def synthetic_probes(root: Path) -> Path:
    """A probe every 10 s for 5 min; TTFT 50 ms except 400 ms between 100 s and 160 s."""
    root.mkdir(parents=True, exist_ok=True)
    lines = []
    for offset in range(0, 300, 10):
        slow = 100 <= offset < 160
        lines.append({"ts": T0 + offset, "model": "llama", "ok": True,
                      "ttft_ms": 400.0 if slow else 50.0, "itl_ms": 5.0, "e2e_ms": 500.0})
    lines.append({"ts": T0 + 5, "model": "llama", "ok": False, "ttft_ms": None,
                  "itl_ms": None, "e2e_ms": None})
    (root / "probes.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    return root


def test_replay_ingests_probes_as_the_sink_names_them(tmp_path):
    seen: list[Any] = []
    rule = LatestAbove("SlowTTFT", "probe:ttft_seconds", 0.2, window=5.0, for_s=20.0,
                       keep_firing_for_s=10.0, seen=seen)
    slo: list[Any] = []
    events = LatestAbove("SloEvents", "probe:slo_total", 1e9, window=5.0, seen=slo)
    outcome = replay(synthetic_probes(tmp_path / "rec"), [rule, events], ttft_slo=0.2)
    [alert] = outcome.alerts
    assert alert.labels == {"alertname": "SlowTTFT", "model": "llama"}
    assert (alert.fired_at, alert.resolved_at) == (T0 + 120, T0 + 170)
    assert {labels["sli"] for _, labels, _ in slo} == {"success", "ttft"}
    assert {labels["probe"] for _, labels, _ in slo} == {"llama"}


def test_replay_json_output_is_exactly_the_documented_shape(tmp_path, monkeypatch, capsys):
    rec = synthetic_probes(tmp_path / "rec")
    rule = LatestAbove("SlowTTFT", "probe:ttft_seconds", 0.2, window=5.0)
    still = LatestAbove("AlwaysSlowE2E", "probe:e2e_seconds", 0.1, window=5.0)
    monkeypatch.setattr(cli, "_load_rules", lambda path: [rule, still])
    assert cli.main(["replay", str(rec), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert list(data) == ["alerts"]
    assert data["alerts"] == [
        {"alertname": "AlwaysSlowE2E", "labels": {"alertname": "AlwaysSlowE2E",
                                                  "model": "llama"},
         "fired_at": T0, "resolved_at": None},
        {"alertname": "SlowTTFT", "labels": {"alertname": "SlowTTFT", "model": "llama"},
         "fired_at": T0 + 100, "resolved_at": T0 + 160},
    ]
    assert cli.main(["replay", str(rec)]) == 0
    text = capsys.readouterr().out
    assert "2 alert(s) would have fired" in text and "still firing" in text


def test_replay_with_the_built_in_rules_runs_clean(tmp_path, capsys):
    rec = rig_recording(tmp_path / "rec")
    synthetic_probes(rec)
    assert cli.main(["replay", str(rec), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert isinstance(data["alerts"], list)
    assert "failed" not in capsys.readouterr().err


def test_bad_recordings_are_reported(tmp_path, capsys):
    with pytest.raises(ReplayError, match="not a directory"):
        load_recording(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ReplayError, match=r"no <unix-seconds>\.prom"):
        load_recording(tmp_path / "empty")
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "probes.jsonl").write_text('{"ts": 1, "model": "m", "ok": true}\nnot json\n')
    with pytest.raises(ReplayError, match=r"probes.jsonl:2"):
        load_recording(bad)
    assert cli.main(["replay", str(tmp_path / "empty")]) == 2
    assert "replay:" in capsys.readouterr().err


def test_unparsable_scrape_counts_as_down(tmp_path):
    rec = rig_recording(tmp_path / "rec")
    (rec / f"{T0 + 60}.prom").write_text("this is { not prometheus\n")
    down = LatestAbove("Down", "up", -1.0, window=1.0)
    seen: list[Any] = []
    down.seen = seen
    replay(rec, [down])
    assert [(now - T0, value) for now, _, value in seen] == [
        (0, 1.0), (15, 1.0), (30, 1.0), (45, 1.0), (60, 0.0)]


def test_backtest_over_stored_history_writes_no_alert_state(tmp_path, capsys):
    url = f"sqlite:///{tmp_path}/tw.db"
    with open_store(url) as store:
        store.migrations.apply()
        labels = make_labels({"model": "llm"})
        for i in range(20):
            value = 0.99 if 5 <= i < 10 else 0.5
            store.write("triton-a", T0 + 15 * i, [Sample("sli:kv_cache_utilization", labels,
                                                         value)])
        store.flush()
        rule = LatestAbove("KVFull", "sli:kv_cache_utilization", 0.95, for_s=30.0)
        outcome = backtest(store, [rule], start=T0, end=T0 + 285, step=15.0)
        [alert] = outcome.alerts
        assert (alert.fired_at, alert.resolved_at) == (T0 + 105, T0 + 150)
        assert AlertStore(store).states() == [] and AlertStore(store).events() == []
    config = tmp_path / "tw.yaml"
    config.write_text(f"store:\n  url: {url}\n")
    from unittest import mock

    with mock.patch.object(cli, "_load_rules", lambda path: [rule]):
        assert cli.main(["backtest", "--config", str(config), "--from", str(T0),
                         "--to", "2027-01-15T08:04:45Z", "--step", "15s", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [(a["fired_at"], a["resolved_at"]) for a in data["alerts"]] == [(T0 + 105, T0 + 150)]


@pytest.mark.triton
def test_record_three_scrapes_from_the_rig_and_replay_them(triton_rig, tmp_path, capsys):
    out = tmp_path / "rec"
    assert cli.main(["record", triton_rig.metrics_url, "--out", str(out), "--every", "1s",
                     "--for", "3s", "--stats-url", triton_rig.http_url]) == 0
    proms = sorted(out.glob("*.prom"))
    assert len(proms) == 3
    stamps = [int(p.name.removesuffix(".prom")) for p in proms]
    assert len(set(stamps)) == 3 and stamps[-1] - stamps[0] in (2, 3)
    assert all("nv_inference_count" in p.read_text() for p in proms)
    assert len(list(out.glob("*.stats.json"))) == 3
    stats = json.loads(next(out.glob("*.stats.json")).read_text())
    assert {m["name"] for m in stats["model_stats"]} >= {"batcher", "fake_llm"}
    configs = {p.stem: json.loads(p.read_text()) for p in (out / "config").glob("*.json")}
    assert configs["batcher"]["max_batch_size"] == 16
    assert "3 scrape(s) saved" in capsys.readouterr().err
    seen: list[Any] = []
    outcome = replay(out, [LatestAbove("Up", "up", 0.5, window=0.5, seen=seen)])
    assert outcome.scrapes == 3 and [v for _, _, v in seen] == [1.0, 1.0, 1.0]


@pytest.mark.parametrize(("every", "ms"), [(1.0, False), (15.0, False), (1.5, True),
                                           (7.5, True), (0.5, True)])
def test_record_names_files_so_replay_sees_the_real_gaps(tmp_path, monkeypatch, every, ms):
    import asyncio

    from tritonwatch import record as rec_mod
    from tritonwatch.collector.scrape import Body

    now = [T0 + 0.25]

    async def sleep(delay: float) -> None:
        now[0] += delay

    async def fetch(*_: Any, **__: Any) -> Body:
        return Body("up 1\n", 0.0, 5)

    # Simulated time is injected, not patched into asyncio: other tests' servers running in
    # background threads would otherwise advance this test's clock with their own sleeps.
    monkeypatch.setattr(rec_mod, "fetch_metrics", fetch)
    out = tmp_path / "rec"
    written = asyncio.run(rec_mod.record("http://triton.invalid/metrics", out, every=every,
                                         duration=6 * every, clock=lambda: now[0],
                                         sleep=sleep))
    assert len(written) == 6
    names = [p.name.removesuffix(".prom") for p in written]
    assert all(("." in n) is ms for n in names), names
    gaps = {round(b.ts - a.ts, 3) for a, b in zip(load_recording(out).scrapes,
                                                  load_recording(out).scrapes[1:], strict=False)}
    assert gaps == {every}


def probe_lines(root: Path, lines: list[Any]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "probes.jsonl").write_text("\n".join(x if isinstance(x, str) else json.dumps(x)
                                                 for x in lines) + "\n")
    return root


GOOD = {"ts": T0, "model": "m", "ok": True, "ttft_ms": 10, "itl_ms": 1, "e2e_ms": 20}


@pytest.mark.parametrize(("bad", "message"), [
    ({"probe": "my probe"}, r"'probe' 'my probe': String should match pattern"),
    ({"ok": "false"}, r"'ok' must be true or false, got 'false'"),
    ({"ok": 0}, r"'ok' must be true or false, got 0"),
    ({"ttft_ms": "fast"}, r"'ttft_ms' must be a finite number"),
    ({"ts": None}, r"'ts' is required"),
    ({"tokens": 1.5}, r"'tokens' must be a non-negative integer"),
    ({"model": ""}, r"'model' '': String should have at least 1 character"),
])
def test_bad_probe_lines_name_the_file_and_line(tmp_path, capsys, bad, message):
    rec = probe_lines(tmp_path / "rec", [GOOD, {**GOOD, "ts": T0 + 10, **bad}])
    with pytest.raises(ReplayError, match=r"probes\.jsonl:2: bad probe line \(" + message):
        load_recording(rec)
    assert cli.main(["replay", str(rec)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("replay: ") and "probes.jsonl:2" in err and "Traceback" not in err


def test_replay_refuses_bad_probe_slos_without_a_traceback(tmp_path, capsys, monkeypatch):
    rec = probe_lines(tmp_path / "rec", [GOOD])
    with pytest.raises(ReplayError, match="ttft_slo"):
        replay(rec, [], ttft_slo=-1.0)
    monkeypatch.setattr(cli, "_load_rules", lambda path: [])
    assert cli.main(["replay", str(rec), "--itl-slo", "0"]) == 2
    assert capsys.readouterr().err.startswith("replay: itl_slo")


def test_probe_lines_after_the_last_scrape_are_replayed(tmp_path):
    rec = rig_recording(tmp_path / "rec")  # scrapes at T0 .. T0 + 45
    lines = [{**GOOD, "ts": T0 + offset, "ttft_ms": 400.0 if offset >= 60 else 50.0}
             for offset in range(0, 120, 10)]
    probe_lines(rec, lines)
    seen: list[Any] = []
    slow = LatestAbove("SlowTTFT", "probe:ttft_seconds", 0.2, window=5.0, for_s=20.0,
                       seen=seen)
    outcome = replay(rec, [slow])
    assert outcome.end == T0 + 110
    assert {now - T0 for now, _, _ in seen} >= {60, 70, 80, 90, 100, 110}
    [alert] = outcome.alerts
    assert (alert.fired_at, alert.resolved_at) == (T0 + 80, None)
