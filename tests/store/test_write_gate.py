"""The store's write gate (``store.fairlock``): writers of the process take turns with
maintenance's back-to-back transactions instead of polling SQLite's busy handler."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tritonwatch.schemas.alerts import AlertEvent, fingerprint
from tritonwatch.schemas.samples import make_labels
from tritonwatch.store import open_store
from tritonwatch.store.alerts import AlertStore
from tritonwatch.store.engine import transaction
from tritonwatch.store.fairlock import FairLock
from tritonwatch.store.store import engine_of

WAIT_S = 60.0  # a bound on waits for the other thread, never reached when things work


def _wait_for(cond: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(0.001)


def test_a_waiter_gets_the_lock_before_its_holder_takes_it_again() -> None:
    lock = FairLock()
    order: list[str] = []
    lock.acquire()

    def wait_for_it() -> None:
        with lock:
            order.append("waiter")

    waiter = threading.Thread(target=wait_for_it)
    waiter.start()
    _wait_for(lambda: lock.waiting() == 1, "the waiter to queue")
    for _ in range(3):  # release and take it back at once, as maintenance does
        lock.release()
        lock.acquire()
        order.append("holder")
    lock.release()
    waiter.join(WAIT_S)
    assert order[0] == "waiter"
    assert not lock.locked()


def test_a_try_does_not_jump_the_queue_and_misuse_is_refused() -> None:
    lock = FairLock()
    assert lock.acquire(blocking=False)
    assert not lock.acquire(blocking=False)  # held
    got = threading.Event()

    def wait_for_it() -> None:
        with lock:
            got.set()

    waiter = threading.Thread(target=wait_for_it)
    waiter.start()
    _wait_for(lambda: lock.waiting() == 1, "the waiter to queue")
    lock.release()
    got.wait(WAIT_S)
    waiter.join(WAIT_S)
    assert got.is_set()
    with lock:
        assert lock.locked()
    with pytest.raises(RuntimeError, match="unlocked"):
        lock.release()


def test_an_alert_save_gets_its_turn_between_maintenance_transactions(tmp_path: Path) -> None:
    # Maintenance (here a thread doing what each of its steps does: the gate, then a write
    # transaction) keeps SQLite's write lock nearly all the time; the save's busy timeout
    # (0.2 s) is far shorter than the run.  Through the gate it gets the next turn.
    store = open_store(f"sqlite:///{tmp_path}/tw.db", timeout_s=0.2)
    store.migrations.apply()
    engine, gate = engine_of(store), store.maintenance._gate  # what maintenance holds
    stop = threading.Event()
    turns = [0]

    def maintenance() -> None:
        while not stop.is_set():
            with gate, transaction(engine, write=True) as conn:
                conn.exec_driver_sql("CREATE TABLE IF NOT EXISTS busy (x INTEGER)")
                conn.exec_driver_sql("INSERT INTO busy VALUES (1)")
                time.sleep(0.05)  # a transaction's work, the write lock held
            turns[0] += 1

    worker = threading.Thread(target=maintenance)
    worker.start()
    try:
        _wait_for(lambda: turns[0] >= 3, "maintenance to run")
        labels = make_labels({"alertname": "X"})
        alerts = AlertStore(store)
        for i in range(5):
            alerts.append_events([AlertEvent(
                ts=1000.0 + i, fingerprint=fingerprint(labels), labels=labels, annotations=(),
                status="firing", starts_at=1000.0, ends_at=None, source="test", group_key="g",
            )])
    finally:
        stop.set()
        worker.join(WAIT_S)
    assert len(AlertStore(store).events()) == 5
    store.close()
