"""The distribution as a user installs it: a wheel built from this repository, installed into
a fresh virtual environment outside the checkout, run from an empty directory.

The fresh environment takes the wheel with ``--no-deps``; its third-party dependencies come from
the test environment's site-packages through a ``.pth`` line (a path line in a ``.pth`` file
runs none of that directory's own ``.pth`` files, so the checkout's editable install stays out
of it). The wheel's own import names are therefore exactly what the fresh environment sees.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from tritonwatch.rig import default_venv

REPO = Path(__file__).resolve().parents[2]
#: Everything a build must not copy: environments, caches and data of a working checkout.
_IGNORE = shutil.ignore_patterns(
    ".git", ".venv", ".venv-*", "tritonwatch-data", "tritonwatch-demo", "__pycache__",
    "*.egg-info", "build",
    ".mypy_cache", ".pytest_cache", ".ruff_cache", ".hypothesis", ".rig-backends", ".gl", ".whl",
)
_PRODUCT_FOLDERS = ("schemas", "collector", "store", "alerts", "api", "dashboard")


def _run(cmd: list[str], *, cwd: Path, env: dict[str, str] | None = None,
         timeout: float = 300.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # A copy, so the build's build/ and egg-info never land in the checkout.
    src = tmp_path_factory.mktemp("src") / "tritonwatch"
    shutil.copytree(REPO, src, symlinks=True, ignore=_IGNORE)
    out = tmp_path_factory.mktemp("dist")
    proc = _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                 "--no-index", "-q", "-w", str(out), str(src)], cwd=out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (whl,) = out.glob("tritonwatch-*.whl")
    return whl


@pytest.fixture(scope="module")
def fresh_env(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    venv = tmp_path_factory.mktemp("venv") / "env"
    proc = _run([sys.executable, "-m", "venv", str(venv)], cwd=venv.parent)
    assert proc.returncode == 0, proc.stderr
    python = str(venv / "bin" / "python")
    site = Path(_run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                     cwd=venv).stdout.strip())
    # The fresh environment's own pip: the test environment's pip with --prefix would first
    # uninstall the checkout's editable install from the test environment itself.
    proc = _run([python, "-m", "pip", "install", "--no-deps", "--no-index", "-q", str(wheel)],
                cwd=venv.parent)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (site / "_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return venv


def test_the_wheel_holds_one_top_level_name_and_the_demo_models(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/", 1)[0] for n in names if not n.startswith("tritonwatch-")}
    assert tops == {"tritonwatch"}
    for folder in _PRODUCT_FOLDERS:
        assert f"tritonwatch/{folder}/__init__.py" in names
    assert "tritonwatch/alerts/windows.yaml" in names
    assert "tritonwatch/alerts/builtin_rules.yaml" in names  # the built-in rules, read at start
    assert "tritonwatch/alerts/report/report.html.j2" in names
    for model in ("batcher", "fake_llm"):
        assert f"tritonwatch/rig_models/{model}/config.pbtxt" in names
        assert f"tritonwatch/rig_models/{model}/1/model.py" in names
    assert not any(n.startswith(("tritonwatch/tests", "tests/", "bench/")) for n in names)


def test_the_installed_wheel_imports_tritonwatch_and_no_generic_names(fresh_env: Path,
                                                                      tmp_path: Path) -> None:
    python = str(fresh_env / "bin" / "python")
    proc = _run([python, "-c", "import tritonwatch, tritonwatch.store.store, tritonwatch.api.app;"
                 "print(tritonwatch.__file__)"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert str(fresh_env) in proc.stdout and str(REPO) not in proc.stdout
    for name in (*_PRODUCT_FOLDERS, "tests", "bench"):
        proc = _run([python, "-c", f"import {name}"], cwd=tmp_path)
        assert proc.returncode != 0 and "ModuleNotFoundError" in proc.stderr, name
    proc = _run([str(fresh_env / "bin" / "tritonwatch"), "--version"], cwd=tmp_path)
    assert proc.returncode == 0 and proc.stdout.startswith("tritonwatch "), proc.stderr


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.triton
def test_the_demo_runs_from_an_empty_directory_with_the_installed_wheel(fresh_env: Path,
                                                                        tmp_path: Path) -> None:
    cwd = tmp_path / "empty"
    cwd.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    # The checkout's Triton environment, so the test does not download 370 MB again; where it
    # goes without the variable is test_rig's default_venv test.
    env["TRITONWATCH_TRITON_VENV"] = str(default_venv())
    env["PATH"] = f"{fresh_env / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    proc = _run([str(fresh_env / "bin" / "tritonwatch"), "demo", "--duration", "60",
                 "--listen", f"127.0.0.1:{_free_port()}"], cwd=cwd, env=env, timeout=420)
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:])
    assert "Stopped. Sent" in proc.stdout
    sent = int(proc.stdout.split("Stopped. Sent ", 1)[1].split(" ", 1)[0])
    assert sent > 0
    assert (cwd / "tritonwatch-demo" / "tritonwatch.db").stat().st_size > 0
    # Nothing was created inside the installed package.
    site = next((fresh_env / "lib").glob("python3*/site-packages"))
    assert not list(site.rglob(".venv-triton")) and not (site / "tests").exists()


def test_an_installed_package_keeps_the_triton_environment_in_the_user_cache(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import tritonwatch.rig as rig

    monkeypatch.delenv(rig.TRITON_VENV_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(rig, "REPO_ROOT", tmp_path / "site-packages")  # no checkout there
    assert rig.default_venv() == tmp_path / "cache" / "tritonwatch" / "venv-triton"
    monkeypatch.setenv(rig.TRITON_VENV_ENV, str(tmp_path / "mine"))
    assert rig.default_venv() == tmp_path / "mine"
