"""A real, local Triton Inference Server for tests, ``tritonwatch demo`` and benchmarks.

The server is the ``tritonserver`` binary shipped in the ``nvidia-pytriton`` wheel, run from its
own virtual environment (it pins numpy<2, the product uses numpy 2; see :func:`default_venv`) on
the Python-backend model repository shipped as package data in ``tritonwatch/rig_models``:

- ``batcher``: max_batch_size 16, dynamic batching (preferred 4 and 8, 20 ms queue delay), one
  CPU instance; clients send batch-1 requests and Triton forms the batches.
- ``fake_llm``: decoupled streaming "LLM" (one response per token, empty final response) that
  exports the TensorRT-LLM ``nv_trt_llm_*`` gauge families.

Both models re-read a JSON control file on every request, so a test can change the behaviour of
the live server with :meth:`TritonRig.control` (see :data:`CONTROL_DEFAULTS` for the keys):
slower first token (``ttft_ms``), slower tokens (``itl_ms``), errors (``fail``, ``fail_rate``,
``fail_after_tokens``, ``batcher_fail``), a filling KV cache (``kv_used_fraction``), stale TRT-LLM
gauges (``freeze_metrics``), slower batches (``batch_exec_ms``, ``item_exec_ms``).

Smaller batches: the model config (``max_queue_delay_microseconds``, preferred sizes) cannot
change on a live server, and a batch can only hold requests that are waiting, so batches are
shrunk from the client side: lower the batcher concurrency of the load generator
(``LoadGenerator.set(concurrency=2)`` gives batches of at most 2, i.e. a fill rate of 2/16).
A larger ``batch_exec_ms`` does the opposite for open traffic (more requests queue per execution).

``fake_llm`` appends when it sent each response to ``response.jsonl`` in the work directory
(``{"request_id", "index", "t_ns", "final"}``, ``t_ns`` = time.monotonic_ns(), CLOCK_MONOTONIC,
comparable with the client's clock on the same host): :meth:`TritonRig.response_log`.

Running the binary outside PyTriton needs three fixes (``/work/shared/triton-rig.md``): the
Triton venv's ``bin`` first on PATH (the stub imports numpy from the first ``python``), the
interpreter's own LIBDIR first on LD_LIBRARY_PATH (else the stub picks the system libpython), and
``nvidia_pytriton.libs`` on LD_LIBRARY_PATH (the stub's rpath breaks once copied). The plain
binary has no restricted gRPC protocol, unlike PyTriton's ``Triton()``.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tritonwatch.lifecycle import StartStop

log = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[1]
#: The demo's models travel inside the package (package data), so an installed wheel has them.
DEFAULT_MODEL_REPO = Path(__file__).resolve().with_name("rig_models")
#: Overrides where the Triton virtual environment lives.
TRITON_VENV_ENV = "TRITONWATCH_TRITON_VENV"
PYTRITON_REQUIREMENT = "nvidia-pytriton==0.7.0"

#: Every key the rig models understand, with its default. Kept in step with DEFAULTS in
#: tritonwatch/rig_models/*/1/model.py (the models cannot import product code: they run in Triton's
#: Python stub, in the Triton venv).
CONTROL_DEFAULTS: dict[str, Any] = {
    # fake_llm
    "ttft_ms": 40.0,
    "itl_ms": 5.0,
    "tokens": 16,
    "fail": False,
    "fail_rate": 0.0,
    "fail_after_tokens": None,
    "kv_used_fraction": 0.3,
    "kv_max_blocks": 1000,
    "kv_tokens_per_block": 64,
    "kv_reused_blocks": 0,
    "max_requests": 64,
    "paused_requests": 0,
    "freeze_metrics": False,
    # batcher
    "batch_exec_ms": 5.0,
    "item_exec_ms": 0.0,
    "batcher_fail": False,
}


class RigError(RuntimeError):
    """The rig could not be set up, started or stopped."""


@dataclass(frozen=True)
class TritonInstall:
    """Where the pieces of the tritonserver install in a venv live."""

    venv: Path
    server: Path  # .../pytriton/tritonserver
    libs: Path  # .../nvidia_pytriton.libs
    python_libdir: Path  # the venv interpreter's LIBDIR (its own libpython)
    python_version: str  # "3.11"

    @property
    def binary(self) -> Path:
        return self.server / "bin" / "tritonserver"

    @property
    def stub(self) -> Path:
        stubs = self.server / "python_backend_stubs"
        return stubs / self.python_version / "triton_python_backend_stub"


def _find_server_dir(venv: Path) -> Path | None:
    for candidate in sorted(venv.glob("lib/python3*/site-packages/pytriton/tritonserver")):
        if (candidate / "bin" / "tritonserver").is_file():
            return candidate
    return None


def default_venv() -> Path:
    """Where the Triton virtual environment lives (about 370 MB once installed).

    ``$TRITONWATCH_TRITON_VENV`` if set; else a source checkout's ``.venv-triton`` (``make``
    creates it there); else the user's cache directory (``$XDG_CACHE_HOME/tritonwatch/
    venv-triton``, ``~/.cache/...`` by default), never inside site-packages.
    """
    override = os.environ.get(TRITON_VENV_ENV)
    if override:
        return Path(override).expanduser()
    if (REPO_ROOT / "pyproject.toml").is_file() and (REPO_ROOT / ".git").exists():
        return REPO_ROOT / ".venv-triton"
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "tritonwatch" / "venv-triton"


def ensure_triton_env(venv: Path | None = None) -> Path:
    """Create ``venv`` with nvidia-pytriton (and so tritonserver) unless it is already there.

    Installing downloads a ~55 MB wheel once; later calls only check the files.
    """
    venv = Path(venv) if venv is not None else default_venv()
    venv.parent.mkdir(parents=True, exist_ok=True)
    if _find_server_dir(venv) is not None:
        return venv
    python = venv / "bin" / "python"
    if not python.exists():
        log.info("creating Triton virtual environment %s", venv)
        _run([sys.executable, "-m", "venv", str(venv)])
    log.info("installing %s into %s", PYTRITON_REQUIREMENT, venv)
    _run([str(python), "-m", "pip", "install", "--quiet", PYTRITON_REQUIREMENT])
    if _find_server_dir(venv) is None:
        raise RigError(f"{PYTRITON_REQUIREMENT} installed into {venv} but no tritonserver found")
    return venv


def _run(cmd: list[str], timeout: float = 900.0) -> None:
    # pip downloads ~55 MB; a stalled mirror must end in an error, not a hung demo.
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        raise RigError(f"{' '.join(cmd)} did not finish within {timeout:.0f} s") from exc
    if proc.returncode != 0:
        raise RigError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")


def triton_install(venv: Path) -> TritonInstall:
    """Locate tritonserver, its libraries and the venv interpreter's LIBDIR."""
    server = _find_server_dir(venv)
    if server is None:
        raise RigError(f"no tritonserver in {venv}; call ensure_triton_env() first")
    out = subprocess.run(
        [
            str(venv / "bin" / "python"),
            "-c",
            "import sys, sysconfig; print(sysconfig.get_config_var('LIBDIR')); "
            "print('%d.%d' % sys.version_info[:2])",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return TritonInstall(
        venv=venv,
        server=server,
        libs=server.parent.parent / "nvidia_pytriton.libs",
        python_libdir=Path(out[0]),
        python_version=out[1],
    )


def _free_port(taken: set[int]) -> int:
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port not in taken:
            return port


def _model_names(model_repo: Path) -> list[str]:
    return sorted(p.parent.name for p in model_repo.glob("*/config.pbtxt"))


def _shm_regions() -> set[Path]:
    return set(Path("/dev/shm").glob("triton_python_backend_shm_region_*"))


def _set_parent_death_signal() -> None:
    # Runs in the child between fork and exec: if the test process dies without stopping the
    # rig, the kernel sends tritonserver SIGTERM instead of leaving it running.
    import ctypes

    pr_set_pdeathsig = 1
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


class TritonRig(StartStop):
    """A tritonserver process on free local ports, serving the rig's model repository.

    Use as a context manager, or call :meth:`start` and :meth:`stop`. :meth:`restart` keeps the
    ports, so a collector pointed at the rig sees a server restart (counters back to zero).
    """

    def __init__(
        self,
        model_repo: Path | None = None,
        workdir: Path | None = None,
        venv: Path | None = None,
        *,
        metrics_interval_ms: int = 500,
        extra_args: tuple[str, ...] = (),
    ) -> None:
        self.model_repo = Path(model_repo or DEFAULT_MODEL_REPO).resolve()
        if workdir is None:
            workdir = Path(tempfile.mkdtemp(prefix="tritonwatch-rig-"))
        self.workdir = Path(workdir).resolve()
        self._venv = Path(venv) if venv is not None else None
        self.metrics_interval_ms = metrics_interval_ms
        self.extra_args = tuple(extra_args)
        self.models = _model_names(self.model_repo)
        self.http_port = 0
        self.grpc_port = 0
        self.metrics_port = 0
        self._proc: subprocess.Popen[bytes] | None = None
        self._install: TritonInstall | None = None
        self._control_lock = threading.Lock()
        #: Seconds the last successful start took, until every model was ready.
        self.last_start_seconds: float | None = None
        self._shm_before: set[Path] = set()
        self._atexit_registered = False
        self._shm_regions: set[Path] = set()

    # -- paths and addresses -----------------------------------------------------------------

    @property
    def log_path(self) -> Path:
        return self.workdir / "triton.log"

    @property
    def control_path(self) -> Path:
        return self.workdir / "control.json"

    @property
    def response_log_path(self) -> Path:
        return self.workdir / "response.jsonl"

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    # -- lifecycle -----------------------------------------------------------------------------

    def _prepare(self) -> TritonInstall:
        if self._install is None:
            venv = self._venv if self._venv is not None else ensure_triton_env()
            self._install = triton_install(venv)
        inst = self._install
        self.workdir.mkdir(parents=True, exist_ok=True)
        backend = self.workdir / "backends" / "python"
        if not (backend / "triton_python_backend_stub").exists():
            shutil.rmtree(backend, ignore_errors=True)
            shutil.copytree(inst.server / "backends" / "python", backend)
            # The stub must sit next to libtriton_python.so, matching the venv's Python.
            shutil.copy2(inst.stub, backend / "triton_python_backend_stub")
        if not self.control_path.exists():
            self._write_control(dict(CONTROL_DEFAULTS))
        return inst

    def _env(self, inst: TritonInstall) -> dict[str, str]:
        env = dict(os.environ)
        # The product's environment must not leak into the stub (numpy 2 would break it).
        for key in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP"):
            env.pop(key, None)
        env["VIRTUAL_ENV"] = str(inst.venv)
        env["PATH"] = os.pathsep.join([str(inst.venv / "bin"), env.get("PATH", "")])
        ld = [str(inst.python_libdir), str(inst.libs)]
        if env.get("LD_LIBRARY_PATH"):
            ld.append(env["LD_LIBRARY_PATH"])
        env["LD_LIBRARY_PATH"] = os.pathsep.join(ld)
        env["TRITONWATCH_RIG_CONTROL"] = str(self.control_path)
        env["TRITONWATCH_RIG_RESPONSE_LOG"] = str(self.response_log_path)
        return env

    def _command(self, inst: TritonInstall) -> list[str]:
        return [
            str(inst.binary),
            f"--model-repository={self.model_repo}",
            f"--backend-directory={self.workdir / 'backends'}",
            "--http-address=127.0.0.1",
            f"--http-port={self.http_port}",
            "--grpc-address=127.0.0.1",
            f"--grpc-port={self.grpc_port}",
            "--metrics-address=127.0.0.1",
            f"--metrics-port={self.metrics_port}",
            f"--metrics-interval-ms={self.metrics_interval_ms}",
            # No GPU here; DCGM would only log warnings.
            "--allow-gpu-metrics=false",
            # On SIGTERM wait at most 3 s (default 30) for in-flight requests.
            "--exit-timeout-secs=3",
            *self.extra_args,
        ]

    def start(self, timeout: float = 120.0) -> None:
        """Start tritonserver and wait until the server and every model are ready."""
        if self.running:
            return
        inst = self._prepare()
        if not self.http_port:
            taken: set[int] = set()
            for attr in ("http_port", "grpc_port", "metrics_port"):
                port = _free_port(taken)
                taken.add(port)
                setattr(self, attr, port)
        t0 = time.monotonic()
        deadline = t0 + timeout
        while True:
            self._spawn(inst)
            try:
                self._wait_ready(deadline)
                break
            except _EarlyExit as exc:
                # After a restart the old sockets may linger briefly: retry on bind errors.
                if "address already in use" in exc.log_tail.lower() and time.monotonic() < deadline:
                    time.sleep(0.5)
                    continue
                raise RigError(
                    f"tritonserver exited with code {exc.code} during start-up; "
                    f"tail of {self.log_path}:\n{exc.log_tail}"
                ) from None
            except TimeoutError:
                tail = self.log_tail()
                self.stop()
                raise RigError(
                    f"tritonserver not ready after {timeout:.0f} s; "
                    f"tail of {self.log_path}:\n{tail}"
                ) from None
        self.last_start_seconds = time.monotonic() - t0
        # Regions that appeared while this server started are its stubs' (cleaned after a kill).
        self._shm_regions = _shm_regions() - self._shm_before
        log.info(
            "tritonserver ready in %.1f s (http %s, grpc %s, metrics %s)",
            self.last_start_seconds,
            self.http_port,
            self.grpc_port,
            self.metrics_port,
        )

    def _spawn(self, inst: TritonInstall) -> None:
        self._shm_before = _shm_regions()
        with open(self.log_path, "ab") as logf:
            logf.write(f"==== tritonwatch rig start {time.strftime('%F %T')} ====\n".encode())
            logf.flush()
            # PDEATHSIG fires when the spawning *thread* exits, so only use it from the main
            # thread (pytest, the CLI); Python 3.12+ also warns about preexec_fn while other
            # threads run. Otherwise stop(), the context manager or atexit clean up.
            use_pdeathsig = threading.current_thread() is threading.main_thread() and (
                sys.version_info < (3, 12) or threading.active_count() == 1
            )
            self._proc = subprocess.Popen(
                self._command(inst),
                cwd=self.workdir,
                env=self._env(inst),
                stdin=subprocess.DEVNULL,
                stdout=logf,
                stderr=subprocess.STDOUT,
                preexec_fn=_set_parent_death_signal if use_pdeathsig else None,
                # Its own process group, so stop() can reap Python-backend stubs that outlive
                # the server (seen after a SIGKILL, and after a restart under load).
                start_new_session=True,
            )
        if not self._atexit_registered:
            atexit.register(self.stop)
            self._atexit_registered = True

    def _wait_ready(self, deadline: float) -> None:
        paths = ["/v2/health/ready", *(f"/v2/models/{m}/ready" for m in self.models)]
        pending = list(paths)
        while pending:
            proc = self._proc
            if proc is None or proc.poll() is not None:
                code = proc.returncode if proc is not None else None
                self._proc = None
                raise _EarlyExit(code, self.log_tail())
            if self._http_ok(pending[0]):
                pending.pop(0)
                continue
            if time.monotonic() > deadline:
                raise TimeoutError
            time.sleep(0.2)

    def _http_ok(self, path: str) -> bool:
        try:
            with urllib.request.urlopen(self.http_url + path, timeout=2) as resp:
                return int(resp.status) == 200
        except (urllib.error.URLError, OSError):
            return False

    def stop(self, timeout: float = 8.0) -> None:
        """SIGTERM tritonserver, wait for it, SIGKILL it if it does not exit in time.

        Triton waits up to --exit-timeout-secs (3 here) for in-flight requests, then for every
        open gRPC stream to be closed by its client, without limit: a client that keeps a stream
        open would hold the shutdown forever, hence the SIGKILL after ``timeout``.
        """
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                log.warning(
                    "tritonserver pid %s still running %.0f s after SIGTERM: killing it",
                    proc.pid,
                    timeout,
                )
                proc.kill()
                proc.wait(10)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        # After a kill the Python stubs exit on their own but leave their shared memory behind.
        for region in self._shm_regions:
            with contextlib.suppress(FileNotFoundError):
                region.unlink()
        self._shm_regions = set()

    def restart(self, timeout: float = 120.0) -> None:
        """Stop and start again on the same ports: every Triton counter starts from zero."""
        self.stop()
        self.start(timeout)

    # -- control and observation ---------------------------------------------------------------

    def control(self, **values: Any) -> dict[str, Any]:
        """Merge ``values`` into the control file (atomically) and return the new contents.

        The models pick changes up on their next request (fake_llm's metrics within 100 ms).
        """
        unknown = sorted(set(values) - set(CONTROL_DEFAULTS))
        if unknown:
            raise ValueError(f"unknown control keys {unknown}; known: {sorted(CONTROL_DEFAULTS)}")
        with self._control_lock:
            current = self.read_control()
            current.update(values)
            self._write_control(current)
            return current

    def reset_control(self) -> dict[str, Any]:
        """Put every control key back to its default."""
        with self._control_lock:
            values = dict(CONTROL_DEFAULTS)
            self._write_control(values)
            return values

    def read_control(self) -> dict[str, Any]:
        values = dict(CONTROL_DEFAULTS)
        with contextlib.suppress(FileNotFoundError):
            values.update(json.loads(self.control_path.read_text(encoding="utf-8")))
        return values

    def _write_control(self, values: dict[str, Any]) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.workdir, prefix=".control-", suffix=".json")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(values, f, indent=1, sort_keys=True)
        # os.replace gives the models either the old or the new file, never half of one; the
        # new inode also tells their mtime/inode cache to re-read it.
        os.replace(tmp, self.control_path)

    def response_log(self) -> list[dict[str, Any]]:
        """Every response fake_llm sent so far: request_id, index, t_ns, final."""
        try:
            text = self.response_log_path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return []
        out: list[dict[str, Any]] = []
        for line in text.splitlines():
            # The model may be writing the last line right now.
            with contextlib.suppress(ValueError):
                out.append(json.loads(line))
        return out

    def clear_response_log(self) -> None:
        # Truncate in place: the model keeps its append-mode handle on this file.
        with contextlib.suppress(FileNotFoundError), open(self.response_log_path, "r+b") as f:
            f.truncate(0)

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])


class _EarlyExit(Exception):
    def __init__(self, code: int | None, log_tail: str) -> None:
        super().__init__(code)
        self.code = code
        self.log_tail = log_tail


def capture_fixtures(out_dir: Path, rig: TritonRig | None = None) -> list[Path]:
    """Save real scrapes, statistics and model configs of a rig (the parser/collector fixtures).

    Starts its own rig unless one is given; with a fresh server, ``metrics-idle.prom`` shows
    every counter at 0. ``python -m tritonwatch.rig tests/fixtures/rig`` regenerates the set.
    """
    import httpx
    import tritonclient.grpc as grpcclient

    from tritonwatch.loadgen import LoadGenerator

    own = rig is None
    if rig is None:
        rig = TritonRig()
        rig.start()
    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []

    def save(name: str, text: str) -> None:
        path = out_dir / name
        path.write_text(text, encoding="utf-8")
        written.append(path)

    def save_json(name: str, data: Any) -> None:
        save(name, json.dumps(data, indent=1) + "\n")

    try:
        save("metrics-idle.prom", httpx.get(rig.metrics_url, timeout=10).text)
        with LoadGenerator(rig.grpc_url, concurrency=8, llm_concurrency=2, max_duration=60):
            time.sleep(3)
            save("metrics-load-1.prom", httpx.get(rig.metrics_url, timeout=10).text)
            time.sleep(5)
            save("metrics-load-2.prom", httpx.get(rig.metrics_url, timeout=10).text)
        stats = httpx.get(f"{rig.http_url}/v2/models/stats", timeout=10).json()
        save_json("stats-http.json", stats)
        for model in ("batcher", "fake_llm"):
            config = httpx.get(f"{rig.http_url}/v2/models/{model}/config", timeout=10).json()
            save_json(f"config-{model}-http.json", config)
        client = grpcclient.InferenceServerClient(rig.grpc_url)
        try:
            # gRPC -> JSON (protobuf mapping) renders uint64 as strings, unlike HTTP.
            save_json("stats-grpc.json", client.get_inference_statistics(as_json=True))
            save_json("config-batcher-grpc.json", client.get_model_config("batcher", as_json=True))
        finally:
            client.close()
    finally:
        if own:
            rig.stop()
    return written


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else Path.cwd() / "tests" / "fixtures" / "rig"
    for written_path in capture_fixtures(target):
        log.info("wrote %s", written_path)
