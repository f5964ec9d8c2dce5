"""The single-writer lock (store/writer_lock.py) on both backends."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import pytest

from tritonwatch.store import WriterLockHeld
from tritonwatch.store import writer_lock as wl


def test_sqlite_lock_names_its_holder_and_is_free_once_released(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/tw.db"
    held = wl.acquire(url)
    assert held is not None
    with pytest.raises(WriterLockHeld) as caught:
        wl.acquire(url)  # another open file: flock refuses even within one process
    message = str(caught.value)
    assert f"pid {os.getpid()} on {socket.gethostname()}" in message
    assert f"{tmp_path}/tw.db" in message and "already in use" in message
    held.release()
    held.release()  # idempotent
    again = wl.acquire(url)
    assert again is not None
    again.release()
    assert (tmp_path / "tw.db.lock").exists()  # the file stays; only the lock matters


@pytest.mark.postgres
def test_postgres_lock_names_its_holder_and_can_be_turned_off(postgres_db_url: str) -> None:
    held = wl.acquire(postgres_db_url)
    assert held is not None
    try:
        with pytest.raises(WriterLockHeld) as caught:
            wl.acquire(postgres_db_url)
        assert f"'tritonwatch serve pid={os.getpid()} host=" in caught.value.holder
        assert wl.acquire(postgres_db_url, postgres=False) is None
    finally:
        held.release()
    # The server drops a session's advisory locks once its backend has ended, which may be a
    # moment after the client closed it: taken again within a bounded wait.
    deadline = time.monotonic() + 30
    while True:
        try:
            again = wl.acquire(postgres_db_url)
            break
        except WriterLockHeld:
            assert time.monotonic() < deadline, "the released lock stayed held"
            time.sleep(0.2)
    assert again is not None
    again.release()
