"""Faults of issue 19 met through the configuration and the command line, items 3, 4, 11, 14
and 16, each through the real `tritonwatch` command run as a subprocess.

- 3: secrets never appear in config errors (URL userinfo and query, webhook URLs, a YAML line
  holding a token) nor in the ERROR log when a receiver echoes our request headers back;
- 4: a config whose YAML anchors expand to gigabytes fails `check-config` with the key and the
  bound, in bounded time;
- 11: each start-up failure and Ctrl-C gives one clear line and a documented exit code
  (0 ok, 1 failure, 2 bad input, 130 interrupted); `probe` prints its partial results and
  `record` keeps what it saved;
- 14: `${VAR}` in config values; the Dockerfile and docker-compose.yml;
- 16: `inspect` finds Triton's HTTP API without assuming port 8002, says why when it cannot,
  and never cuts tables on a pipe.

FAKE servers (at the edge, named so): a receiver that answers 400 echoing the request headers
(as some proxies and Alertmanager-compatible receivers do), a fake Triton serving recorded
/metrics and model-config payloads, the fake OpenAI streaming server of tests/fixtures_openai.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import zipfile
from collections.abc import Iterator
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.fixtures_http import OK_BODY, FakeTargets, free_port
from tests.fixtures_openai import FakeOpenAIServer
from tests.serving import QuietHandler, serving
from tritonwatch.schemas.config import validate_config
from tritonwatch.store import open_store

EXE = Path(sys.executable).with_name("tritonwatch")
REPO = Path(__file__).resolve().parents[2]
RIG = REPO / "tests" / "fixtures" / "rig"

EXIT_FAILURE, EXIT_USAGE, EXIT_INTERRUPTED = 1, 2, 130


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    env.pop("TRITONWATCH_API_TOKEN", None)
    env.update(extra)
    return env


def run(*args: Any, cwd: Path | None = None, env: dict[str, str] | None = None,
        timeout: float = 120, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(EXE), *map(str, args)], cwd=cwd, env=env or _env(),
                          capture_output=True, text=True, timeout=timeout, check=False,
                          **kwargs)


def start(*args: Any, cwd: Path | None = None, env: dict[str, str] | None = None,
          **kwargs: Any) -> subprocess.Popen[str]:
    return subprocess.Popen([str(EXE), *map(str, args)], cwd=cwd, env=env or _env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs)


def wait_until(predicate: Any, timeout: float = 60.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"{what} not reached within {timeout:.0f} s")


def one_clear_line(stderr: str, prefix: str) -> str:
    """The single ``prefix`` line of ``stderr``; fails on a traceback or several lines."""
    assert "Traceback" not in stderr, stderr
    lines = [line for line in stderr.splitlines() if line.startswith(prefix)]
    assert len(lines) == 1, stderr
    return lines[0]


# --- read-only files, for root too (root ignores permission bits) ----------------------------

class ReadOnly:
    """Makes paths read-only for the child processes of a test: ``chmod a-w`` for a normal
    user; as root, the immutable attribute (``chattr +i``), which binds root too."""

    def __init__(self) -> None:
        self.locked: list[Path] = []

    def __call__(self, path: Path) -> None:
        if os.geteuid() != 0:
            path.chmod(0o555 if path.is_dir() else 0o444)
        else:
            subprocess.run(["chattr", "+i", str(path)], check=True, timeout=30)
        self.locked.append(path)

    def release(self) -> None:
        for path in reversed(self.locked):
            if os.geteuid() == 0:
                subprocess.run(["chattr", "-i", str(path)], check=False, timeout=30)
            path.chmod(0o755 if path.is_dir() else 0o644)


@pytest.fixture
def read_only() -> Iterator[ReadOnly]:
    lock = ReadOnly()
    try:
        yield lock
    finally:
        lock.release()


# =============================================================================================
# 3. Secrets never leak into config errors or the notifier's ERROR log
# =============================================================================================

METRICS_URL = "htps://admin:MetricsUrlPw@h:8002/metrics?token=QTok123"
WEBHOOK_URL = "htps://hooks.example/services/T0/B1/HookPathTok999"


@pytest.mark.parametrize("command", ["check-config", "serve"])
def test_config_errors_never_quote_a_secret(tmp_path: Path, command: str) -> None:
    config = tmp_path / "leaky.yaml"
    config.write_text(
        "targets:\n"
        f"  - {{name: a, metrics_url: '{METRICS_URL}'}}\n"
        "alerting:\n"
        f"  webhooks: [{{url: '{WEBHOOK_URL}'}}]\n"
    )
    args = ["check-config", config] if command == "check-config" else ["serve", "--config",
                                                                        config]
    proc = run(*args, cwd=tmp_path)
    out = proc.stdout + proc.stderr
    # The same config error, the same exit code, from both commands.
    assert proc.returncode == EXIT_USAGE, out
    assert ("targets[0].metrics_url: 'htps://<redacted>@h:8002/metrics?<redacted>' is not an "
            "http(s) URL") in proc.stderr
    assert "alerting.webhooks[0].url: is not an http(s) URL (value not shown" in proc.stderr
    for secret in ("MetricsUrlPw", "admin:", "QTok123", "HookPathTok999", "hooks.example"):
        assert secret not in out


def test_a_yaml_syntax_error_names_file_line_and_column_not_the_text(tmp_path: Path) -> None:
    config = tmp_path / "broken.yaml"
    config.write_text(
        "targets:\n"
        "  - name: a\n"
        "    metrics_url: http://h:8002/metrics\n"
        "    headers: {Authorization: Bearer YamlTok-0123456789: oops}\n"
    )
    proc = run("check-config", config)
    assert proc.returncode == EXIT_USAGE
    assert f"{config}: 1 error(s)" in proc.stderr
    assert re.search(r"line 4, column \d+: invalid YAML: ", proc.stderr), proc.stderr
    assert "YamlTok" not in proc.stderr + proc.stdout


class _EchoHeaders(QuietHandler):
    """FAKE receiver: answers every POST with 400 and the request's headers in the body."""

    server: _EchoServer

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        headers = dict(self.headers.items())
        self.server.seen.append((self.path, headers))
        body = ("bad request; you sent:\n"
                + "".join(f"{k}: {v}\n" for k, v in headers.items())
                + json.dumps({"headers": {k: [v] for k, v in headers.items()}})).encode()
        self.send_response(400)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class _EchoServer(ThreadingHTTPServer):
    daemon_threads = True
    seen: list[tuple[str, dict[str, str]]]


@pytest.fixture
def echo_receiver() -> Iterator[_EchoServer]:
    server = _EchoServer(("127.0.0.1", 0), _EchoHeaders)
    server.seen = []
    with serving(server):
        yield server


def test_an_alertmanager_echoing_our_headers_leaks_no_credential_into_the_log(
    tmp_path: Path, fake_targets: FakeTargets, echo_receiver: _EchoServer
) -> None:
    port = echo_receiver.server_address[1]
    am_password, hook_token = "AmPassw0rd-Secret", "HookBearerTok-456789"
    basic = base64.b64encode(f"amuser:{am_password}".encode()).decode()
    rules = tmp_path / "rules.yaml"
    rules.write_text(
        "version: 1\n"
        "alerts:\n"
        "  - {name: AlwaysFires, series: nv_inference_count, agg: last, window: 1m,\n"
        "     op: '>', threshold: 0}\n"
        "defaults: {enabled: false}\n"
    )
    config = tmp_path / "tw.yaml"
    config.write_text(
        f"targets: [{{name: t, metrics_url: '{fake_targets.url('/ok')}'}}]\n"
        "scrape: {interval: 1s, timeout: 1s}\n"
        f"store: {{url: 'sqlite:///{tmp_path}/tw.db', flush_interval: 1s}}\n"
        "nvml: {enabled: false}\n"
        "alerting:\n"
        "  eval_interval: 1s\n"
        f"  rules_file: {rules}\n"
        f"  alertmanagers: ['http://amuser:{am_password}@127.0.0.1:{port}']\n"
        f"  webhooks: [{{url: 'http://127.0.0.1:{port}/hooks/HookPathTok123',"
        f" headers: {{Authorization: 'Bearer {hook_token}'}}}}]\n"
    )
    proc = start("serve", "--config", config, "--listen", f"127.0.0.1:{free_port()}",
                 cwd=tmp_path)
    try:
        wait_until(lambda: len({p for p, _ in echo_receiver.seen}) >= 2, 90,
                   "a POST to both the Alertmanager and the webhook")
        time.sleep(1.0)  # the ERROR lines are logged as the 400s come back
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    # The receiver really echoed the credentials: a leak would have been possible.
    sent = {path: headers.get("Authorization") for path, headers in echo_receiver.seen}
    assert sent["/api/v2/alerts"] == f"Basic {basic}"
    assert sent["/hooks/HookPathTok123"] == f"Bearer {hook_token}"
    errors = [line for line in err.splitlines() if " ERROR " in line]
    assert any("alertmanager http://127.0.0.1" in e and "HTTP 400" in e for e in errors), err
    assert any("webhook http://127.0.0.1" in e and "HTTP 400" in e for e in errors), err
    for secret in (am_password, basic, hook_token, "HookPathTok123"):
        assert secret not in out + err


# =============================================================================================
# 4. A bound on the expanded size of the configuration (billion laughs)
# =============================================================================================

def anchor_bomb(depth: int) -> str:
    """A probe whose ``parameters`` nest ``depth`` levels of 9 aliases each: 9**depth leaves
    from a few hundred bytes."""
    lines = ["probes:", "  - name: p", "    url: http://127.0.0.1:8000", "    protocol: http",
             "    model: m", "    parameters:",
             "      l0: &l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    for i in range(1, depth + 1):
        lines.append(f"      l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 9) + "]")
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("command", ["check-config", "serve"])
def test_an_8_deep_anchor_bomb_fails_check_config_with_the_key_and_the_bound(
    tmp_path: Path, command: str
) -> None:
    config = tmp_path / "bomb.yaml"
    config.write_text(anchor_bomb(8))
    assert config.stat().st_size < 1000  # the was 694 bytes
    args = ["check-config", config] if command == "check-config" else [
        "serve", "--config", config, "--listen", f"127.0.0.1:{free_port()}"]
    t0 = time.monotonic()
    proc = run(*args, cwd=tmp_path, timeout=60)
    assert time.monotonic() - t0 < 60  # never expanded: a few MB of work at most
    assert proc.returncode == EXIT_USAGE, proc.stdout + proc.stderr
    line = one_clear_line(proc.stderr, "  probes[0].parameters")
    assert "expands to" in line and "at most 16 MiB" in line
    assert not (tmp_path / "tritonwatch-data").exists()  # serve started nothing


def test_free_form_probe_parameters_are_bounded_by_their_own_limit(tmp_path: Path) -> None:
    config = tmp_path / "big-params.yaml"
    config.write_text(anchor_bomb(4))  # 9**4 leaves: ~400 KB as JSON, under the file bound
    proc = run("check-config", config)
    assert proc.returncode == EXIT_USAGE
    line = one_clear_line(proc.stderr, "  probes[0].parameters:")
    assert "the limit is 64 KiB" in line


def test_a_recursive_alias_is_refused(tmp_path: Path) -> None:
    config = tmp_path / "loop.yaml"
    config.write_text("targets: &t [*t]\n")
    proc = run("check-config", config)
    assert proc.returncode == EXIT_USAGE
    assert "refers to itself" in one_clear_line(proc.stderr, "  targets")


# =============================================================================================
# 11. One clear line, documented exit codes
# =============================================================================================

def test_serve_in_a_read_only_working_directory(tmp_path: Path, read_only: ReadOnly) -> None:
    cwd = tmp_path / "ro"
    cwd.mkdir()
    read_only(cwd)
    proc = run("serve", "--listen", f"127.0.0.1:{free_port()}", cwd=cwd)
    assert proc.returncode == EXIT_FAILURE, proc.stderr
    line = one_clear_line(proc.stderr, "serve:")
    assert "cannot create tritonwatch-data: permission denied" in line
    assert "run from a writable directory or set store.url" in line


def test_serve_on_a_read_only_database(tmp_path: Path, read_only: ReadOnly) -> None:
    data = tmp_path / "data"
    data.mkdir()
    db = data / "tw.db"
    with open_store(f"sqlite:///{db}") as store:
        store.migrations.apply()
    for leftover in data.glob("tw.db-*"):
        leftover.unlink()
    read_only(db)
    read_only(data)
    config = tmp_path / "tw.yaml"
    config.write_text(f"store: {{url: 'sqlite:///{db}'}}\nnvml: {{enabled: false}}\n")
    proc = run("serve", "--config", config, "--listen", f"127.0.0.1:{free_port()}",
               cwd=tmp_path)
    assert proc.returncode == EXIT_FAILURE, proc.stderr
    line = one_clear_line(proc.stderr, "serve:")
    # The first thing serve writes beside a SQLite file is its single-writer lock
    # (<db>.lock), so a read-only database directory is met there, and said so.
    assert str(db) in line and "store.url" in line and "permission denied" in line


def test_serve_with_postgresql_down_at_start(tmp_path: Path) -> None:
    config = tmp_path / "tw.yaml"
    config.write_text(
        f"store: {{url: 'postgresql://tw:PgDownPw123@127.0.0.1:{free_port()}/tw'}}\n"
        "nvml: {enabled: false}\n"
    )
    listen = f"127.0.0.1:{free_port()}"
    proc = run("serve", "--config", config, "--listen", listen, cwd=tmp_path)
    assert proc.returncode == EXIT_FAILURE, proc.stderr
    line = one_clear_line(proc.stderr, "serve:")
    assert "postgresql+psycopg://tw:***@127.0.0.1" in line and "check store.url" in line
    assert "(run with -v" not in line
    assert "PgDownPw123" not in proc.stderr
    # -v shows the traceback behind the line.
    verbose = run("-v", "serve", "--config", config, "--listen", listen, cwd=tmp_path)
    assert verbose.returncode == EXIT_FAILURE
    assert "Traceback" in verbose.stderr and "PgDownPw123" not in verbose.stderr


@pytest.mark.parametrize("command", ["check-config", "serve"])
def test_a_config_file_that_is_not_utf8(tmp_path: Path, command: str) -> None:
    config = tmp_path / "latin1.yaml"
    config.write_bytes(b"targets:\n  - name: caf\xe9\n    metrics_url: http://h:8002/metrics\n")
    args = ["check-config", config] if command == "check-config" else ["serve", "--config",
                                                                        config]
    proc = run(*args, cwd=tmp_path)
    assert proc.returncode == EXIT_USAGE
    line = one_clear_line(proc.stderr, "  line 2:")
    assert "not UTF-8 text (byte 0xE9" in line and "save the file as UTF-8" in line


def test_serve_on_a_port_in_use_names_listen(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = run("serve", "--listen", f"127.0.0.1:{port}", cwd=tmp_path)
    assert proc.returncode == EXIT_FAILURE
    line = one_clear_line(proc.stderr, "serve:")
    assert f"cannot listen on 127.0.0.1:{port} (--listen): address already in use" in line
    assert "--listen HOST:PORT" in line
    assert not (tmp_path / "tritonwatch-data").exists()  # nothing started


def test_an_http_url_given_to_the_grpc_probe(tmp_path: Path) -> None:
    proc = run("probe", "--url", "http://u:ProbePw987@127.0.0.1:8001", "--model", "m",
               cwd=tmp_path)
    assert proc.returncode == EXIT_USAGE
    line = one_clear_line(proc.stderr, "probe:")
    assert "grpc protocol takes HOST:PORT" in line and "--protocol http" in line
    assert "ProbePw987" not in proc.stderr
    assert "validation error" not in proc.stderr and "pydantic" not in proc.stderr


def test_ctrl_c_in_probe_prints_the_partial_results() -> None:
    server = FakeOpenAIServer()
    server.ttft_ms, server.itl_ms = 30.0, 20.0
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        proc = start("probe", "--url", server.url, "--model", "fake-llm", "--protocol",
                     "openai", "--requests", "1000", "--max-tokens", "4", "--warmup", "0",
                     "--json")

        def started() -> int:
            with server.lock:
                return sum(1 for _, i, _ in server.sent if i == 0)

        # One connection: the 5th request starts only after the client finished the 4th.
        wait_until(lambda: started() >= 5, 60, "five requests")
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        server.shutdown()
        server.server_close()
    assert proc.returncode == EXIT_INTERRUPTED, err
    summary = json.loads(out)
    assert summary["interrupted"] is True
    assert summary["ok"] >= 4 and summary["requests"] < 1000
    assert summary["ttft_ms"]["avg"] > 0
    line = one_clear_line(err, "probe:")
    assert f"interrupted after {summary['requests']} of 1000 request(s)" in line


def test_ctrl_c_in_record_keeps_what_it_wrote(tmp_path: Path, fake_targets: FakeTargets) -> None:
    out_dir = tmp_path / "rec"
    proc = start("record", fake_targets.url("/ok"), "--out", out_dir, "--every", "0.3s",
                 "--for", "10m")
    wait_until(lambda: len(list(out_dir.glob("*.prom"))) >= 2, 60, "two scrapes saved")
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == EXIT_INTERRUPTED, err
    saved = sorted(out_dir.glob("*.prom"))
    line = one_clear_line(err, "record:")
    assert f"record: interrupted; {len(saved)} scrape(s) saved under {out_dir}" in line
    assert len(saved) >= 2
    assert all(path.read_text() == OK_BODY for path in saved)  # every file whole


def test_ctrl_c_in_inspect(fake_targets: FakeTargets) -> None:
    proc = start("inspect", fake_targets.url("/ok"), "--seconds", "600")
    wait_until(lambda: any(p == "/ok" for p, _ in fake_targets.hits), 60, "the first read")
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == EXIT_INTERRUPTED
    assert one_clear_line(err, "inspect:") == "inspect: interrupted"


# =============================================================================================
# 14. ${VAR} in config values; the deploy files
# =============================================================================================

def test_env_references_are_expanded_and_an_unset_one_is_named(tmp_path: Path) -> None:
    config = tmp_path / "tw.yaml"
    config.write_text(
        "store: {url: 'postgresql://tritonwatch:${TW_TEST_PG_PASSWORD}@db/tritonwatch'}\n"
        "api: {listen: '${TW_TEST_LISTEN:-127.0.0.1:9999}'}\n"
    )
    unset = run("check-config", config)
    assert unset.returncode == EXIT_USAGE
    line = one_clear_line(unset.stderr, "  store.url:")
    assert "environment variable TW_TEST_PG_PASSWORD is not set" in line
    ok = run("check-config", config, env=_env(TW_TEST_PG_PASSWORD="Pg-Env-Secret-42"))
    assert ok.returncode == 0, ok.stderr
    assert "store postgresql" in ok.stdout and "Pg-Env-Secret-42" not in ok.stdout


def test_a_value_from_the_environment_is_never_printed(tmp_path: Path) -> None:
    config = tmp_path / "tw.yaml"
    config.write_text("targets: [{name: a, metrics_url: '${TW_TEST_URL}',"
                      " scrape_interval: '${TW_TEST_INTERVAL}'}]\n")
    proc = run("check-config", config, env=_env(TW_TEST_URL="htps://admin:EnvPw-4567@h/m",
                                                TW_TEST_INTERVAL="EnvInterval-Secret"))
    assert proc.returncode == EXIT_USAGE
    assert "targets[0].metrics_url:" in proc.stderr
    assert "targets[0].scrape_interval: invalid duration" in proc.stderr
    assert "EnvPw-4567" not in proc.stderr and "EnvInterval-Secret" not in proc.stderr


def test_serve_uses_the_expanded_values(tmp_path: Path) -> None:
    data = tmp_path / "data"
    port = free_port()
    config = tmp_path / "tw.yaml"
    config.write_text("store: {url: 'sqlite:///${TW_TEST_DATA}/tw.db'}\n"
                      "api: {listen: '127.0.0.1:${TW_TEST_PORT}'}\nnvml: {enabled: false}\n")
    proc = start("serve", "--config", config, cwd=tmp_path,
                 env=_env(TW_TEST_DATA=str(data), TW_TEST_PORT=str(port)))
    try:
        def healthy() -> bool:
            try:
                return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(healthy, 60, "/healthz")
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert (data / "tw.db").exists()


def _dockerfile() -> list[tuple[str, str]]:
    """(instruction, arguments) of every Dockerfile line, continuations joined."""
    text = (REPO / "Dockerfile").read_text().replace("\\\n", " ")
    lines = [line.strip() for line in text.splitlines()]
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in lines
            if line and not line.startswith("#")]


def test_the_dockerfile_builds_the_new_layout_and_runs_as_its_own_user(tmp_path: Path) -> None:
    steps = _dockerfile()
    stages = [i for i, (op, _) in enumerate(steps) if op == "FROM"]
    final = steps[stages[-1]:]
    # Every folder tritonwatch/<name> links to is copied next to it, as in the checkout.
    copied = {args.split()[0] for op, args in steps[:stages[-1]] if op == "COPY"}
    links = {p.name: os.readlink(p) for p in (REPO / "tritonwatch").iterdir() if p.is_symlink()}
    assert links and all(target == f"../{name}" for name, target in links.items())
    assert set(links) <= copied and "tritonwatch" in copied and "pyproject.toml" in copied
    # The data directory: created and owned by the service user before it is a VOLUME (a
    # change after VOLUME would be discarded), and the working directory of the default store.
    ops = [op for op, _ in final]
    (volume,) = [json.loads(args)[0] for op, args in final if op == "VOLUME"]
    (workdir,) = [args for op, args in final if op == "WORKDIR"]
    (user,) = [args for op, args in final if op == "USER"]
    assert workdir == volume
    assert user.split(":")[0] == "10001"
    setup = next(args for op, args in final if op == "RUN" and "chown" in args)
    assert f"chown tritonwatch:tritonwatch {volume}" in setup and "--uid 10001" in setup
    assert ops.index("RUN") < ops.index("VOLUME") < ops.index("USER")
    (health,) = [args for op, args in final if op == "HEALTHCHECK"]
    assert "/healthz" in health and "urllib.request" in health and "curl" not in health
    (cmd,) = [json.loads(args) for op, args in final if op == "CMD"]
    assert cmd[-1].endswith(":8080") and ":8080/healthz" in health

    # The build stage, replayed: the copied paths alone (links kept) build a complete wheel.
    context = tmp_path / "context"
    context.mkdir()
    for src in copied:
        path = REPO / src
        if path.is_dir():
            shutil.copytree(path, context / src, symlinks=True,
                            ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(path, context / src)
    dist = tmp_path / "dist"
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                           "--no-build-isolation", "--no-index", "-q", "-w", str(dist),
                           str(context)], capture_output=True, text=True, timeout=300,
                          check=False, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (wheel,) = dist.glob("tritonwatch-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    for name in links:
        assert f"tritonwatch/{name}/__init__.py" in names
    assert "tritonwatch/cli.py" in names and "tritonwatch/alerts/windows.yaml" in names


def test_docker_compose_gives_serve_what_its_config_expands() -> None:
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    volume = next(json.loads(a)[0] for op, a in _dockerfile() if op == "VOLUME")
    collectors = [s for s in compose["services"].values() if s.get("command", [""])[0] == "serve"]
    assert len(collectors) >= 2
    for serve in collectors:
        assert "POSTGRES_PASSWORD" in serve["environment"]
        # the image's data directory is a volume of each collector's own
        assert any(str(v).endswith(f":{volume}") for v in serve["volumes"])
    # The config they mount validates and expands the password as the comments say.
    config = validate_config(yaml.safe_load((REPO / "deploy" / "tritonwatch.yaml").read_text()),
                             environ={"POSTGRES_PASSWORD": "pw-42",
                                      "TRITONWATCH_API_TOKEN": "t" * 32,
                                      "ALERT_WEBHOOK_URL": "http://example.invalid/hook"})
    assert config.store.url == "postgresql://tritonwatch:pw-42@postgres:5432/tritonwatch"


# =============================================================================================
# 16. inspect: the HTTP API without assuming port 8002; tables on a pipe
# =============================================================================================

class _FakeTriton(QuietHandler):
    """FAKE Triton on one port (as behind a proxy): /metrics answers the recorded load-1
    snapshot, then load-2; with ``api`` set, /v2 answers the recorded model config and
    statistics of the rig's ``batcher``."""

    server: _FakeTritonServer

    def _send(self, code: int, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        if self.path == "/metrics":
            self.server.scrapes += 1
            name = "metrics-load-1.prom" if self.server.scrapes == 1 else "metrics-load-2.prom"
            self._send(200, (RIG / name).read_bytes())
        elif self.server.api and self.path == "/v2/models/batcher/config":
            self._send(200, (RIG / "config-batcher-http.json").read_bytes())
        elif self.server.api and self.path == "/v2/models/stats":
            self._send(200, (RIG / "stats-http.json").read_bytes())
        else:
            self._send(404, b'{"error":"not found"}')

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        if self.server.api and self.path == "/v2/repository/index":
            self._send(200, b'[{"name":"batcher","version":"1","state":"READY"}]')
        else:
            self._send(404, b'{"error":"not found"}')


class _FakeTritonServer(ThreadingHTTPServer):
    daemon_threads = True
    scrapes = 0
    api = True


def _serve_fake_triton(host: str, api: bool) -> tuple[_FakeTritonServer, str]:
    server = _FakeTritonServer((host, 0), _FakeTriton)
    server.api = api
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://{host}:{server.server_address[1]}/metrics"


def _counter(name: str, text: str) -> float:
    match = re.search(rf'^{name}{{model="batcher",version="1"}} (\S+)$', text, re.M)
    assert match
    return float(match.group(1))


def test_inspect_reads_max_batch_size_when_metrics_are_not_on_8002() -> None:
    server, url = _serve_fake_triton("127.0.0.1", api=True)
    try:
        assert not url.startswith("http://127.0.0.1:8002/")
        proc = run("inspect", url, "--seconds", "1", "--json")
    finally:
        server.shutdown()
        server.server_close()
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    a, b = ((RIG / f"metrics-load-{i}.prom").read_text() for i in (1, 2))
    d_count = _counter("nv_inference_count", b) - _counter("nv_inference_count", a)
    d_exec = _counter("nv_inference_exec_count", b) - _counter("nv_inference_exec_count", a)
    assert result["models"]["batcher"]["batch_fill_rate"] == pytest.approx(
        d_count / d_exec / 16, rel=1e-4)
    assert "config_error" not in result


def test_inspect_says_why_the_fill_rate_is_missing_instead_of_dropping_the_column() -> None:
    # 127.0.0.3: a loopback address of its own, so port 8000 there is nobody's Triton.
    server, url = _serve_fake_triton("127.0.0.3", api=False)
    port = server.server_address[1]
    try:
        table = run("inspect", url, "--seconds", "1")
    finally:
        server.shutdown()
        server.server_close()
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    header = next(line for line in lines if "req/s" in line)
    assert "fill" in header.replace("┃", " ").split()
    row = next(line for line in lines if line.startswith("│ batcher"))
    assert "?" in row.replace("│", " ").split()
    text = " ".join(table.stdout.split())
    assert "fill rate unavailable: max_batch_size could not be read" in text
    assert f"http://127.0.0.3:{port}:" in text and "http://127.0.0.3:8000:" in text
    assert "--http-url" in text and "--max-batch-size MODEL=N" in text


def test_inspect_tables_are_not_cut_when_piped(tmp_path: Path) -> None:
    model = "a-model-with-a-name-far-longer-than-eighty-columns-" * 3
    series = f'nv_inference_request_success{{model="{model}",version="1"}}'
    a, b = tmp_path / "a.prom", tmp_path / "b.prom"
    a.write_text(f"# TYPE nv_inference_request_success counter\n{series} 0\n")
    b.write_text(f"# TYPE nv_inference_request_success counter\n{series} 50\n")
    proc = run("inspect", a, b, "--seconds", "10")  # stdout is a pipe; COLUMNS unset
    assert proc.returncode == 0, proc.stderr
    assert "…" not in proc.stdout
    row = next(line for line in proc.stdout.splitlines() if model in line)
    assert row.replace("│", " ").split() == [model, "1", "5.0"]
