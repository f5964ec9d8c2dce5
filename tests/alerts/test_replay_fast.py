"""Fast replay (issue 20 item 5): a scratch store that gives the same alerts, progress, and
several recordings at once (``--jobs``)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from sqlalchemy import text

from tests.alerts.test_replay import LatestAbove, rig_recording, synthetic_probes
from tests.store_sql import raw_engine
from tritonwatch import cli
from tritonwatch.alerts.rules import load_rules
from tritonwatch.replay import recordings_in, replay
from tritonwatch.store import Query, open_store


def _rules() -> list[Any]:
    return [*load_rules(None),
            LatestAbove("BusyBatcher", "sli:request_rate", 50.0, match={"model": "batcher"}),
            LatestAbove("SlowTTFT", "probe:ttft_seconds", 0.2, window=5.0, for_s=20.0,
                        keep_firing_for_s=10.0)]


def _recording(root: Path) -> Path:
    # The rig captures (rates, fill rates from configs) and a probe run that turns slow.
    rig_recording(root)
    synthetic_probes(root)
    return root


def test_scratch_store_gives_the_same_alerts_as_the_durable_one(tmp_path: Path) -> None:
    rec = _recording(tmp_path / "rec")
    progress: list[tuple[int, int]] = []
    fast = replay(rec, _rules(), ttft_slo=0.2, progress=lambda d, t: progress.append((d, t)))
    durable = replay(rec, _rules(), ttft_slo=0.2, scratch=False)
    assert fast == durable
    # TargetDown too: the probe lines go on for minutes after the last scrape.
    assert {a.alertname for a in fast.alerts} >= {"BusyBatcher", "SlowTTFT", "TargetDown"}
    assert progress[-1] == (fast.evaluations, fast.evaluations)
    assert len(progress) == fast.evaluations


def test_scratch_store_has_no_journal_and_no_fsync(tmp_path: Path) -> None:
    with open_store(f"sqlite:///{tmp_path}/s.db", scratch=True) as store:
        store.migrations.apply()
        with raw_engine(store).connect() as conn:
            assert conn.execute(text("PRAGMA journal_mode")).scalar() == "off"
            assert conn.execute(text("PRAGMA synchronous")).scalar() == 0
    with open_store(f"sqlite:///{tmp_path}/d.db") as store:
        store.migrations.apply()
        with raw_engine(store).connect() as conn:
            assert conn.execute(text("PRAGMA journal_mode")).scalar() == "wal"


def test_replay_json_is_the_same_with_and_without_jobs(tmp_path: Path, capsys: Any) -> None:
    fleet = tmp_path / "fleet"
    _recording(fleet / "a")
    _recording(fleet / "b")  # TargetDown fires on each: probes outlast the scrapes
    assert [(p.name, n) for p, n in recordings_in([fleet])] == [("a", "a"), ("b", "b")]
    assert cli.main(["replay", str(fleet), "--json", "--ttft-slo", "200ms"]) == 0
    serial = json.loads(capsys.readouterr().out)
    assert cli.main(["replay", str(fleet), "--json", "--ttft-slo", "200ms", "--jobs", "2"]) == 0
    parallel = json.loads(capsys.readouterr().out)
    assert serial == parallel
    # One target per subdirectory, named after it.
    assert {a["labels"]["target"] for a in serial["alerts"]
            if a["alertname"] == "TargetDown"} == {"a", "b"}
    # Each recording alone gives the same alerts it gives in the fleet.
    assert cli.main(["replay", str(fleet / "b"), "--json", "--target", "b"]) == 0
    alone = json.loads(capsys.readouterr().out)["alerts"]
    assert alone and all(a in serial["alerts"] for a in alone)
    assert [a for a in serial["alerts"] if a["labels"].get("target") == "b"] == alone


def test_one_bad_recording_does_not_stop_the_others(tmp_path: Path, capsys: Any) -> None:
    good = rig_recording(tmp_path / "good")
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "probes.jsonl").write_text("not json\n")
    assert cli.main(["replay", str(good), str(bad), "--json", "--jobs", "2"]) == 1
    captured = capsys.readouterr()
    assert "probes.jsonl:1" in captured.err
    assert json.loads(captured.out)["alerts"] is not None
    shutil.rmtree(bad)


def test_scratch_store_sees_series_created_after_a_query(tmp_path: Path) -> None:
    # Its series lookups are remembered between queries: a new series must still show.
    from tritonwatch.schemas.samples import Sample, make_labels

    with open_store(f"sqlite:///{tmp_path}/s.db", scratch=True) as store:
        store.migrations.apply()
        store.write("t", 1000.0, [Sample("x", make_labels({"m": "a"}), 1.0)])
        store.flush()
        assert [k.labels for k in store.series(Query("x"))] == [make_labels({"m": "a"})]
        assert len(store.read(Query("x", start=900, end=1100)).keys) == 1
        store.write("t", 1010.0, [Sample("x", make_labels({"m": "b"}), 2.0)])
        store.flush()
        assert len(store.series(Query("x"))) == 2
        cols = store.read(Query("x", start=900, end=1100))
        assert sorted(cols.values.tolist()) == [1.0, 2.0]


def test_scratch_store_answers_as_the_durable_one_across_rollups(tmp_path: Path) -> None:
    # Its rollup watermarks are remembered too: maintenance must make it read them again.
    from tritonwatch.schemas.samples import Sample, make_labels

    answers = []
    for scratch in (True, False):
        with open_store(f"sqlite:///{tmp_path}/{scratch}.db", scratch=scratch) as store:
            store.migrations.apply()
            got = []
            for i in range(0, 4 * 3600, 60):
                store.write("t", 1_800_000_000.0 + i, [Sample("x", make_labels({}), float(i))])
                if i % 3600 == 0:
                    store.flush()
                    got.append(store.read(Query("x", start=1_800_000_000.0,
                                                end=1_800_000_000.0 + i, step=300,
                                                agg="avg")).values.tolist())
                    store.maintenance.rollup(1_800_000_000.0 + i + 7200)
            store.flush()
            store.maintenance.rollup(1_800_000_000.0 + 6 * 3600)
            got.append(store.read(Query("x", start=1_800_000_000.0,
                                        end=1_800_000_000.0 + 4 * 3600, step=3600,
                                        agg="avg")).values.tolist())
            answers.append(got)
    assert answers[0] == answers[1]
    assert len(answers[0][-1]) == 4
