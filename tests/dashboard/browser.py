"""Real headless Chromium (Debian's ``chromium``) driven over the DevTools protocol.

Streamlit renders in the browser from a websocket, so ``--screenshot``/``--dump-dom`` alone
capture its loading skeleton: a page is "settled" here when Streamlit reports no script
running, the skeleton is gone and the number of rendered charts and tables stopped changing.
The protocol client is a few lines over ``websockets`` (a dependency of Streamlit).
"""

from __future__ import annotations

import base64
import io
import itertools
import json
import re
import shutil
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from websockets.sync.client import ClientConnection, connect

WIDTH = 1400

#: True once Streamlit is idle: app mounted, no skeleton, no "running" widget.
_IDLE = """(() => {
  const app = document.querySelector('[data-testid="stApp"]');
  if (!app) return false;
  if (document.querySelector('[data-testid="stSkeleton"]')) return false;
  if (document.querySelector('[data-testid="stStatusWidget"]')) return false;
  return document.querySelector('[data-testid="stMainBlockContainer"]') !== null;
})()"""
#: A fingerprint of what is drawn, to wait until charts and tables stop appearing.
_DRAWN = """[document.querySelectorAll('canvas, svg, [data-testid="stDataFrame"]').length,
  document.querySelector('[data-testid="stMain"]')?.innerText.length || 0].join('/')"""
_HEIGHT = """Math.max(
  document.querySelector('[data-testid="stMainBlockContainer"]')?.scrollHeight || 0,
  document.querySelector('[data-testid="stSidebarContent"]')?.scrollHeight || 0) + 120"""


class Browser:
    def __init__(self, ws: ClientConnection) -> None:
        self._ws = ws
        self._ids = itertools.count(1)

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        msg_id = next(self._ids)
        self._ws.send(json.dumps({"id": msg_id, "method": method, "params": params}))
        while True:
            reply = json.loads(self._ws.recv(timeout=60))
            if reply.get("id") == msg_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                result: dict[str, Any] = reply.get("result", {})
                return result

    def eval(self, expression: str) -> Any:
        out = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        return out.get("result", {}).get("value")

    def open(self, url: str, *, timeout: float = 60.0, height: int = 1200) -> None:
        """Navigate and wait until the Streamlit page has settled."""
        self.call("Emulation.setDeviceMetricsOverride", width=WIDTH, height=height,
                  deviceScaleFactor=1, mobile=False)
        self.call("Page.navigate", url=url)
        deadline = time.monotonic() + timeout
        time.sleep(0.5)
        stable, last = 0, None
        while time.monotonic() < deadline:
            if self.eval(_IDLE):
                drawn = self.eval(_DRAWN)
                stable = stable + 1 if drawn == last else 0
                last = drawn
                if stable >= 4:  # unchanged for 2 s
                    return
            time.sleep(0.5)
        raise TimeoutError(f"{url} did not settle within {timeout:.0f} s")

    def screenshot(self, path: Path) -> None:
        """The whole page (the viewport grown to the content), as a palette PNG (small)."""
        from PIL import Image

        height = int(self.eval(_HEIGHT) or 1200)
        self.call("Emulation.setDeviceMetricsOverride", width=WIDTH, height=min(height, 6000),
                  deviceScaleFactor=1, mobile=False)
        time.sleep(1.0)  # charts re-lay out to the new viewport
        shot = self.call("Page.captureScreenshot", format="png")
        image = Image.open(io.BytesIO(base64.b64decode(shot["data"])))
        image.convert("RGB").quantize(colors=64).save(path, optimize=True)


@contextmanager
def chromium() -> Iterator[Browser]:
    """A headless Chromium with one page, closed afterwards."""
    binary = shutil.which("chromium")
    if binary is None:
        raise RuntimeError("chromium is not installed: apt-get install chromium "
                           "(make system-deps)")
    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as profile:
        proc = subprocess.Popen(
            [binary, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
             "--remote-debugging-port=0", f"--user-data-dir={profile}",
             "--no-first-run", "--mute-audio", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            assert proc.stderr is not None
            port = None
            deadline = time.monotonic() + 30
            while port is None and time.monotonic() < deadline:
                line = proc.stderr.readline()
                if not line and proc.poll() is not None:
                    raise RuntimeError(f"chromium exited with {proc.returncode}")
                found = re.search(r"DevTools listening on ws://[^:]+:(\d+)/", line)
                port = int(found.group(1)) if found else None
            if port is None:
                raise TimeoutError("chromium did not open its DevTools port within 30 s")
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as r:
                pages = [t for t in json.load(r) if t["type"] == "page"]
            with connect(pages[0]["webSocketDebuggerUrl"], max_size=2**26,
                         open_timeout=10) as ws:
                browser = Browser(ws)
                browser.call("Page.enable")
                # An alert() from injected HTML would be recorded, never shown.
                browser.call("Page.addScriptToEvaluateOnNewDocument",
                             source="window.__alerts = []; window.alert = "
                                    "(m) => window.__alerts.push(String(m));")
                yield browser
        finally:
            if proc.stderr is not None:
                proc.stderr.close()
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
