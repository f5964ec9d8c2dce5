"""``tritonwatch dashboard``: Streamlit in a second process, reading the store of ``serve``.

The dashboard reads the same config file as ``serve`` (``--config``; without it the embedded
defaults: SQLite under ./tritonwatch-data), opens the store read-only and never writes to it.
This module only validates the config and starts ``streamlit run`` on
``tritonwatch/dashboard/streamlit_app.py``; the app finds the config through
``TRITONWATCH_DASHBOARD_CONFIG``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

from tritonwatch.schemas.config import ConfigError, load_config

APP = Path(__file__).resolve().parent / "dashboard" / "streamlit_app.py"
CONFIG_ENV = "TRITONWATCH_DASHBOARD_CONFIG"
DEFAULT_PORT = 8501


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="YAML config file (the one `serve` uses; default: "
                   "embedded defaults)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help="HTTP port (default 8501)")
    p.add_argument("--address", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1)")


def command(*, port: int, address: str) -> list[str]:
    """The ``streamlit run`` command line."""
    return [
        sys.executable, "-m", "streamlit", "run", str(APP),
        "--server.port", str(port), "--server.address", address,
        "--server.headless", "true", "--browser.gatherUsageStats", "false",
        "--server.fileWatcherType", "none", "--global.developmentMode", "false",
        "--client.toolbarMode", "viewer", "--theme.base", "light",
    ]


def start(config: str | None, *, port: int, address: str,
          quiet: bool = False) -> subprocess.Popen[bytes]:
    """Start the dashboard process (the caller stops it)."""
    env = dict(os.environ)
    env[CONFIG_ENV] = str(Path(config).resolve()) if config else ""
    out = subprocess.DEVNULL if quiet else None
    return subprocess.Popen(command(port=port, address=address), env=env,
                            stdout=out, stderr=out)


def url(port: int, address: str) -> str:
    host = "127.0.0.1" if address in ("0.0.0.0", "") else address
    return f"http://{host}:{port}"


def run(args: argparse.Namespace) -> int:
    try:
        load_config(args.config)
    except ConfigError as exc:
        for line in exc.errors:
            sys.stderr.write(f"{exc.source}: {line}\n")
        return 2
    if not 0 < args.port < 65536:
        sys.stderr.write(f"--port {args.port}: must be 1-65535\n")
        return 2
    sys.stderr.write(f"dashboard on {url(args.port, args.address)} (Ctrl-C to stop)\n")
    proc = start(args.config, port=args.port, address=args.address)

    def forward(signum: int, _frame: object) -> None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signum)

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, forward)
    try:
        return proc.wait()
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
