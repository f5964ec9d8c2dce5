"""Renderers, the reports table, ``tritonwatch report`` and ``/api/v1/reports`` over the
synthetic fortnight in a real SQLite store (and the unique key on PostgreSQL too)."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from fastapi.testclient import TestClient
from sqlalchemy import inspect, text

from tests.report import synthetic as syn
from tests.store_sql import raw_engine
from tritonwatch.alerts.report.build import build_report
from tritonwatch.alerts.report.model import to_json
from tritonwatch.alerts.report.produce import produce
from tritonwatch.alerts.report.render import render
from tritonwatch.api.app import create_app
from tritonwatch.cli import main
from tritonwatch.store import Store, open_store
from tritonwatch.store.reports import ReportStore


@pytest.fixture
def documents(filled: Store) -> dict[str, str]:
    report = build_report(filled, syn.config(), syn.SLOS, syn.WEEK, config_key="k",
                          now=syn.WEEK.end + 60)
    return {fmt: render(report, fmt) for fmt in ("html", "md", "json")}


def test_html_is_self_contained_with_every_chart_inline(documents) -> None:
    html = documents["html"]
    # No asset from anywhere else: no <link>, no <script>, every src an inline data: URI.
    assert "<link" not in html and "<script" not in html and "@import" not in html
    sources = re.findall(r'src="([^"]*)"', html)
    assert len(sources) == 4  # two SLO burn charts, efficiency, completeness
    assert all(s.startswith("data:image/png;base64,") for s in sources)
    assert not re.search(r"url\((?!data:)", html)


def test_html_markdown_and_json_show_the_same_numbers(documents) -> None:
    data = json.loads(documents["json"])
    assert data["week"] == "2026-W43" and data["slos"][0]["budget_remaining"] == 0.703264
    for fmt in ("html", "md"):
        doc = documents[fmt]
        for shown in ("70.3 %", "99.408 %", "29.7 %", "-37.5 %", "169 hours", "50x",
                      "25000 µs", "80.0 %"):
            assert shown in doc, (fmt, shown)


def test_html_escapes_what_comes_from_labels(filled: Store) -> None:
    spec = syn.SLOS[0].model_copy(update={"description": "<script>alert(1)</script>"})
    html = render(build_report(filled, syn.config(), [spec], syn.WEEK, config_key="k"), "html")
    assert "<script>alert(1)</script>" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html


def test_a_report_is_kept_once_per_week_and_config(make_store: Callable[..., Store],
                                                   tmp_path: Path) -> None:
    first, second = make_store(), make_store()  # two processes on one database
    config = syn.config(out_dir=str(tmp_path / "out"))
    made = produce(first, config, syn.WEEK, specs=syn.SLOS, now=1.0)
    assert made is not None
    assert produce(second, config, syn.WEEK, specs=syn.SLOS, now=2.0) is None
    # Even a racer that built it too loses at the unique key.
    docs = {"json": "{}", "html": "", "md": ""}
    assert ReportStore(second).insert(
        week=syn.WEEK.name, config_key=made.report.config_key, timezone=syn.TZ, start=0,
        end=1, created_at=3, summary={}, documents=docs) is None
    listed = ReportStore(second).list()
    assert [(r.id, r.week, r.created_at) for r in listed] == [(made.id, "2026-W43", 1.0)]
    # Another configuration (here: another time zone) is another report.
    other = syn.config(out_dir=str(tmp_path / "out"), timezone="UTC")
    week_utc = syn.WEEK.__class__(2026, 43, "UTC")
    assert produce(second, other, week_utc, specs=syn.SLOS, now=4.0) is not None
    assert len(ReportStore(first).list()) == 2


def test_an_existing_database_gets_the_reports_table_and_keeps_its_data(filled_url) -> None:
    with open_store(filled_url) as store:
        with raw_engine(store).begin() as conn:
            conn.execute(text("DROP TABLE reports"))  # as a database made before reports
        assert not inspect(raw_engine(store)).has_table("reports")
        samples = store.count_samples()
        store.migrations.apply()
        assert inspect(raw_engine(store)).has_table("reports")
        assert store.count_samples() == samples
        assert ReportStore(store).list() == []


def _config_file(tmp_path: Path, url: str) -> Path:
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump({"version": 1, "slos": [
        s.model_dump(mode="json", by_alias=True, exclude_defaults=True) for s in syn.SLOS]}))
    path = tmp_path / "tw.yaml"
    path.write_text(yaml.safe_dump({
        "store": {"url": url},
        "scrape": {"interval": "5m", "timeout": "10s"},
        "targets": [{"name": "a", "metrics_url": "http://127.0.0.1:1/metrics"},
                    {"name": "b", "metrics_url": "http://127.0.0.1:2/metrics"}],
        "alerting": {"rules_file": str(rules)},
        "reports": {"timezone": syn.TZ},
    }))
    return path


def test_cli_report_writes_the_files_and_keeps_the_report(
    filled_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _config_file(tmp_path, filled_url)
    out = tmp_path / "out"
    rc = main(["report", "--week", "2026-W43", "--config", str(config), "--out", str(out),
               "--format", "html,json"])
    printed = capsys.readouterr()
    assert rc == 0, printed.err
    assert sorted(p.name for p in out.iterdir()) == ["2026-W43.html", "2026-W43.json"]
    data = json.loads((out / "2026-W43.json").read_text())
    assert data["hours"] == 169 and data["summary"]["advice"] == 2
    assert "report 2026-W43 (169 h, Europe/Berlin): 2 held" in printed.out
    assert "only 80.0 % of the expected scrapes of b" in printed.err
    # Run again (late data): the kept report is replaced, not duplicated.
    assert main(["report", "--week", "2026-W43", "--config", str(config), "--out",
                 str(out)]) == 0
    with open_store(filled_url) as store:
        assert [r.week for r in ReportStore(store).list()] == ["2026-W43"]


@pytest.mark.parametrize(("args", "message"), [
    pytest.param(["--week", "2026-48"], "--week: invalid week '2026-48'",
                 id="a week that is no ISO week is refused naming the option"),
    pytest.param(["--week", "2026-W54"], "2026 has no ISO week 54",
                 id="a week past the year's last is refused"),
])
def test_cli_report_refuses_bad_input(filled_url, tmp_path, capsys, args, message) -> None:
    config = _config_file(tmp_path, filled_url)
    assert main(["report", "--config", str(config), *args]) == 2
    assert message in capsys.readouterr().err


def test_cli_report_refuses_an_unknown_format(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["report", "--format", "html,pdf"])
    assert "--format 'html,pdf'" in capsys.readouterr().err


def test_api_lists_and_fetches_kept_reports(filled: Store, tmp_path: Path) -> None:
    made = produce(filled, syn.config(out_dir=str(tmp_path)), syn.WEEK, specs=syn.SLOS)
    assert made is not None
    client = TestClient(create_app(filled))
    listed = client.get("/api/v1/reports").json()["data"]
    assert [(r["id"], r["week"]) for r in listed] == [(made.id, "2026-W43")]
    assert listed[0]["summary"]["postmortems"] == 1
    assert client.get("/api/v1/reports", params={"week": "2026-W42"}).json()["data"] == []
    html = client.get(f"/api/v1/reports/{made.id}")
    assert html.headers["content-type"].startswith("text/html")
    assert html.text == made.documents["html"]
    as_json = client.get(f"/api/v1/reports/{made.id}", params={"format": "json"}).json()
    assert as_json == to_json(made.report)
    assert client.get(f"/api/v1/reports/{made.id}", params={"format": "md"}).text.startswith(
        "# Weekly SLO report 2026-W43")
    missing = client.get("/api/v1/reports/999")
    assert missing.status_code == 404 and "999" in missing.json()["detail"]
    bad = client.get("/api/v1/reports", params={"week": "48"})
    assert bad.status_code == 400 and "week" in bad.json()["error"]


def test_serve_draws_the_charts_in_a_child_process(filled_url: str, tmp_path: Path) -> None:
    """serve's weekly job (``isolate_charts``) gives the same HTML without loading matplotlib
    into the collector, where it would stay resident (issue 22: about 30 MB)."""
    import subprocess
    import sys

    script = tmp_path / "draw.py"
    script.write_text(
        "import sys\n"
        "from tests.report import synthetic as syn\n"
        "from tritonwatch.alerts.report.build import build_report\n"
        "from tritonwatch.alerts.report.render import render_html\n"
        "from tritonwatch.store import open_store\n"
        "if __name__ == '__main__':\n"
        "    with open_store(sys.argv[1]) as store:\n"
        "        report = build_report(store, syn.config(), syn.SLOS, syn.WEEK,\n"
        "                              config_key='k', now=syn.WEEK.end + 60)\n"
        "    html = render_html(report, isolate_charts=True)\n"
        "    open(sys.argv[2], 'w', encoding='utf-8').write(html)\n"
        "    print('matplotlib' in sys.modules)\n", encoding="utf-8")
    out = tmp_path / "isolated.html"
    # The script imports the test data module (tests.report.synthetic): put the checkout on
    # its path, which a plain `pytest` (no PYTHONPATH) does not give a child process.
    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ,
           "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
    done = subprocess.run([sys.executable, str(script), filled_url, str(out)],
                          capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "False", done.stderr
    with open_store(filled_url) as store:
        report = build_report(store, syn.config(), syn.SLOS, syn.WEEK, config_key="k",
                              now=syn.WEEK.end + 60)
    assert out.read_text(encoding="utf-8") == render(report, "html")
