"""pytest plugin: a throwaway PostgreSQL server for the session, a fresh database per test.

Loaded from ``tests/conftest.py`` with ``pytest_plugins = ["tests.fixtures_pg"]``.

The server is a real PostgreSQL (initdb + pg_ctl from the local install), listening only on
127.0.0.1 with trust authentication, with durability switched off (fsync, synchronous_commit,
full_page_writes) because its data dies with the session anyway.  Missing binaries fail the
tests, never skip them: a contract suite that silently loses its PostgreSQL half is worse than
a red run.

``running_postgres()`` is usable outside pytest too (bench/ingest_store.py).
"""

from __future__ import annotations

import glob
import itertools
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager

import psycopg
import pytest
from psycopg import sql

INSTALL_HINT = (
    "PostgreSQL server binaries (initdb, pg_ctl) were not found. Install them with "
    "`apt-get install postgresql` (Debian/Ubuntu) or point $PG_BINDIR at the directory "
    "holding initdb and pg_ctl."
)

TEMPLATE_DB = "tritonwatch_template"
SESSION_DB = "tritonwatch"


class PostgresUnavailable(RuntimeError):
    """The local PostgreSQL could not be found or started."""


def find_bindir() -> str:
    """The directory holding initdb and pg_ctl: $PG_BINDIR, PATH, or the newest Debian one."""
    candidates = []
    if os.environ.get("PG_BINDIR"):
        candidates.append(os.environ["PG_BINDIR"])
    if on_path := shutil.which("initdb"):
        candidates.append(os.path.dirname(on_path))
    # Debian keeps server binaries out of PATH; prefer the newest major version.
    candidates += sorted(
        glob.glob("/usr/lib/postgresql/*/bin"),
        key=lambda p: int(p.split("/")[-2]) if p.split("/")[-2].isdigit() else 0,
        reverse=True,
    )
    for bindir in candidates:
        if all(os.access(os.path.join(bindir, b), os.X_OK) for b in ("initdb", "pg_ctl")):
            return bindir
    raise PostgresUnavailable(INSTALL_HINT)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _as_postgres(cmd: Sequence[str]) -> list[str]:
    # initdb and postgres refuse to run as root; drop to the `postgres` OS user when we are.
    if os.geteuid() != 0:
        return list(cmd)
    if runuser := shutil.which("runuser"):
        return [runuser, "-u", "postgres", "--", *cmd]
    return ["su", "postgres", "-s", "/bin/sh", "-c", " ".join(map(_quote, cmd))]


def _quote(arg: str) -> str:
    return "'" + arg.replace("'", "'\"'\"'") + "'"


def _run(cmd: Sequence[str], *, what: str, log_path: str | None = None) -> None:
    proc = subprocess.run(_as_postgres(cmd), capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        detail = (proc.stdout + proc.stderr).strip()
        if log_path and os.path.exists(log_path):
            with open(log_path, encoding="utf-8", errors="replace") as f:
                detail += "\n--- server log ---\n" + f.read()[-4000:]
        raise PostgresUnavailable(f"{what} failed (exit {proc.returncode}):\n{detail}")


@contextmanager
def running_postgres(*, durable: bool = False) -> Iterator[str]:
    """Start a PostgreSQL server in a temp dir; yields the URL of its ``tritonwatch`` database.

    ``durable=True`` keeps fsync and synchronous commit on (for benchmarks).
    """
    bindir = find_bindir()
    base = tempfile.mkdtemp(prefix="tritonwatch-pg-")
    try:
        if os.geteuid() == 0:
            shutil.chown(base, "postgres", "postgres")
        data, log_path = os.path.join(base, "data"), os.path.join(base, "server.log")
        _run(
            [
                os.path.join(bindir, "initdb"),
                "-D",
                data,
                "-U",
                "postgres",
                "--auth=trust",
                "--encoding=UTF8",
                "--locale=C",
                "--no-sync",
            ],
            what="initdb",
        )
        port = _free_port()
        options = [
            f"-p {port}",
            "-c listen_addresses=127.0.0.1",
            f"-c unix_socket_directories={base}",
            "-c max_connections=200",
        ]
        if not durable:
            options += ["-c fsync=off", "-c synchronous_commit=off", "-c full_page_writes=off"]
        pg_ctl = os.path.join(bindir, "pg_ctl")
        _run(
            [
                pg_ctl,
                "-D",
                data,
                "-l",
                log_path,
                "-o",
                " ".join(options),
                "-w",
                "-t",
                "60",
                "start",
            ],
            what="pg_ctl start",
            log_path=log_path,
        )
        try:
            admin = f"postgresql://postgres@127.0.0.1:{port}/postgres"
            with psycopg.connect(admin, autocommit=True) as conn:
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(TEMPLATE_DB)))
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(SESSION_DB)))
            yield f"postgresql://postgres@127.0.0.1:{port}/{SESSION_DB}"
        finally:
            _run([pg_ctl, "-D", data, "-m", "fast", "-w", "stop"], what="pg_ctl stop")
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _with_database(url: str, name: str) -> str:
    return url.rsplit("/", 1)[0] + "/" + name


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """URL of a throwaway PostgreSQL database (``postgresql://postgres@127.0.0.1:PORT/...``)."""
    with ExitStack() as stack:
        try:
            url = stack.enter_context(running_postgres())
        except PostgresUnavailable as exc:
            pytest.fail(str(exc), pytrace=False)
        yield url


_counter = itertools.count()


@pytest.fixture
def postgres_db_url(postgres_url: str) -> Iterator[str]:
    """A fresh, empty database for one test (cloned from an empty template), dropped after."""
    name = f"tw_test_{os.getpid()}_{next(_counter)}"
    admin = _with_database(postgres_url, "postgres")
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(
            sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                sql.Identifier(name), sql.Identifier(TEMPLATE_DB)
            )
        )
    yield _with_database(postgres_url, name)
    with psycopg.connect(admin, autocommit=True) as conn:
        # FORCE: a test that failed half-way may have left its connections open.
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )
