"""The HTML report in real headless Chromium (Debian's ``chromium``): every chart decodes
and the page renders to a PNG.  ``TRITONWATCH_REPORT_SNAPSHOT`` names a file to keep that
PNG in (docs/report/ holds the one looked at)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

from tests.report import synthetic as syn
from tritonwatch.alerts.report.build import build_report
from tritonwatch.alerts.report.render import render
from tritonwatch.store import Store

CHROMIUM = shutil.which("chromium") or "chromium"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
# Counts the images that decoded once the page has loaded, where --dump-dom can read it.
PROBE = ("<script>addEventListener('load', () => document.body.setAttribute('data-images', "
         "[...document.images].filter(i => i.complete && i.naturalWidth > 0).length + '/' + "
         "document.images.length));</script>")


def _chromium(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
         "--virtual-time-budget=5000", *args],
        capture_output=True, text=True, timeout=120, check=False)


def test_the_html_report_renders_every_chart_in_headless_chromium(filled: Store,
                                                                   tmp_path: Path) -> None:
    report = build_report(filled, syn.config(), syn.SLOS, syn.WEEK, config_key="golden",
                          now=syn.WEEK.scheduled_at("mon", 8))
    html = render(report, "html")
    page = tmp_path / "report.html"
    page.write_text(html, encoding="utf-8")
    probed = tmp_path / "probed.html"
    probed.write_text(html.replace("</body>", PROBE + "</body>"), encoding="utf-8")

    dom = _chromium("--dump-dom", probed.as_uri())
    assert dom.returncode == 0, dom.stderr[-2000:]
    found = re.search(r'data-images="(\d+)/(\d+)"', dom.stdout)
    assert found is not None, dom.stdout[:500]
    assert found.group(1) == found.group(2) == "4"  # two burn charts, efficiency, completeness

    shot = tmp_path / "report.png"
    run = _chromium("--window-size=1000,2700", f"--screenshot={shot}", page.as_uri())
    assert run.returncode == 0, run.stderr[-2000:]
    data = shot.read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 50_000
    keep = os.environ.get("TRITONWATCH_REPORT_SNAPSHOT")
    if keep:
        Path(keep).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, keep)
        Path(keep).with_suffix(".html").write_text(html, encoding="utf-8")
