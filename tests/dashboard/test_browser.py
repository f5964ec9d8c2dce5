"""``tritonwatch dashboard`` as users run it, seen through real headless Chromium.

The rig-filled store (plus a synthetic week for the SLO page) is served by the real command
(a Streamlit subprocess); every page is captured as PNG into build/screenshots/ (the folder
the README names; ``$TRITONWATCH_SCREENSHOTS`` names another, e.g. docs/screenshots to refresh
the committed copies), and the XSS case of item 7 is checked in Chromium's DOM: a model named
``<img src=x onerror=alert(1)>`` and an annotation holding a script show as those characters,
create no element and run nothing.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest

from tests.dashboard.browser import chromium
from tests.dashboard.conftest import WEEK_RULES, Filled
from tests.dashboard.fill import RULES, XSS_ANNOTATION, XSS_MODEL, synthetic_week, write_config
from tests.fixtures_http import free_port
from tritonwatch.store import open_store

pytestmark = pytest.mark.triton

# Not docs/screenshots by default: a test run must not rewrite committed files.
SCREENSHOTS = Path(os.environ.get("TRITONWATCH_SCREENSHOTS") or
                   Path(__file__).resolve().parents[2] / "build" / "screenshots")

PAGES = (
    ("fleet", "", "Fleet"),
    ("model", "model?target=rig&model=fake_llm", "Model"),
    ("model-batcher", "model?target=rig&model=batcher", "Batching"),
    ("llm", "llm", "LLM serving"),
    ("gpus", "gpus", "GPUs"),
    ("slos", "slos", "SLOs"),
    ("alerts", "alerts", "Alerts"),
    ("probes", "probes", "Probes"),
    ("reports", "reports", "Weekly SLO reports"),
)


def _keep_a_report(store, d) -> None:
    # The report golden test's week, made on a store of its own and kept in this one, so the
    # Reports page has a real report to show without mixing its targets into the others.
    from tests.report import synthetic as syn
    from tritonwatch.alerts.report.model import to_json
    from tritonwatch.alerts.report.produce import produce
    from tritonwatch.store.reports import ReportStore

    with open_store(f"sqlite:///{d}/report.db") as scratch:
        scratch.migrations.apply()
        syn.fill(scratch)
        made = produce(scratch, syn.config(out_dir=str(d / "reports")), syn.WEEK,
                       specs=syn.SLOS)
    assert made is not None
    r = made.report
    ReportStore(store).insert(week=r.week, config_key=r.config_key, timezone=r.timezone,
                              start=r.start, end=r.end, created_at=r.generated_at,
                              summary=to_json(r)["summary"],
                              documents=dict(made.documents))


@pytest.fixture(scope="module")
def served(rig_store: Filled, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A copy of the rig store plus a synthetic week, served by `tritonwatch dashboard`."""
    d = tmp_path_factory.mktemp("dash-browser")
    src = sqlite3.connect(rig_store.url.removeprefix("sqlite:///"))
    dst = sqlite3.connect(d / "tw.db")
    src.backup(dst)
    src.close()
    dst.close()
    url = f"sqlite:///{d}/tw.db"
    with open_store(url) as store:
        synthetic_week(store, now=time.time())
        _keep_a_report(store, d)
    # Both SLOs: the rig's probe TTFT and the synthetic week's availability.
    rules = RULES.replace("slos:\n", "slos:\n" + WEEK_RULES.split("slos:\n", 1)[1], 1)
    config = write_config(d, rig=None, db_url=url, rules=rules)
    port = free_port()
    env = dict(os.environ)
    log = (d / "dashboard.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "tritonwatch.cli", "dashboard", "--config", str(config),
         "--port", str(port)], stdout=log, stderr=subprocess.STDOUT, env=env)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{base}/_stcore/health", timeout=2) as r:
                    if r.read() == b"ok":
                        break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise AssertionError("dashboard did not start within 60 s:\n"
                                         + (d / "dashboard.log").read_text()) from None
                time.sleep(0.5)
        yield base
    finally:
        proc.terminate()
        assert proc.wait(timeout=30) == 0 or proc.returncode < 0 or proc.returncode == 0
        log.close()


def test_every_page_renders_in_chromium_and_is_captured(served):
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    with chromium() as browser:
        for name, path, heading in PAGES:
            browser.open(f"{served}/{path}", timeout=90)
            text = browser.eval("document.querySelector('[data-testid=\"stMain\"]').innerText")
            assert heading in text, (name, text[:500])
            # No traceback, no "page not found" dialog.
            bad = browser.eval(
                "[...document.querySelectorAll('[data-testid=\"stException\"], "
                "[role=\"dialog\"]')]"
                ".map(e => e.innerText)")
            assert bad == [], (name, bad)
            out = SCREENSHOTS / f"{name}.png"
            browser.screenshot(out)
            assert 5_000 < out.stat().st_size < 600_000, (name, out.stat().st_size)


def test_target_values_are_text_in_the_dom(served):
    with chromium() as browser:
        browser.open(f"{served}/model?target=edge&model={quote(XSS_MODEL, safe='')}")
        text = browser.eval("document.body.innerText")
        assert f"model: {XSS_MODEL}" in text
        browser.open(f"{served}/alerts")
        text = browser.eval("document.body.innerText")
        assert f"summary: {XSS_ANNOTATION}" in text or XSS_MODEL in text
        # Pick the Alertmanager alert (the one carrying both) in the full view.
        for page in ("", "alerts"):
            browser.open(f"{served}/{page}")
            assert browser.eval("document.querySelectorAll('img[src=\"x\"]').length") == 0
            assert browser.eval("window.__alerts.length") == 0
            assert browser.eval("window.__xss === undefined")
            # "**not bold**" stays two asterisks, never <strong>.
            assert browser.eval("[...document.querySelectorAll('strong, b')].some("
                                "e => e.innerText.includes('not bold'))") is False
