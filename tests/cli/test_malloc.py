"""``tritonwatch.memory.tune_malloc`` and ``release_free_memory``: freed heap pages go back.

Runs in a child process: tune_malloc() changes the allocator for the whole process, which must
happen before any thread starts, and the RSS it measures must not be the test runner's.
"""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import textwrap

CHILD = textwrap.dedent("""
    import gc
    from tritonwatch import memory
    memory.tune_malloc()
    assert memory.can_trim(), "glibc's malloc_trim not found"

    def rss_kib():
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))

    # 200 MB of 16 KiB blocks (below the mapping threshold: they come from the heap), then
    # every other one freed: the holes stay resident until trimmed.
    blocks = [bytearray(16 * 1024) for _ in range(12_800)]
    for b in blocks:
        b[::4096] = b"x" * len(b[::4096])  # touch every page
    del blocks[::2]
    gc.collect()
    before = rss_kib()
    memory.release_free_memory()
    after = rss_kib()
    print(before, after)
""")


def test_release_free_memory_hands_heap_holes_back() -> None:
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True,
                         check=True, timeout=120)
    before, after = map(int, out.stdout.split())
    # About 100 MB of holes (77 MB came back here; without the trim, none).  The allocator
    # keeps some, and RSS is noisy by a few MB.
    assert before - after > 40 * 1024, (before, after)


REPORT_CHILD = textwrap.dedent("""
    import logging, sqlite3
    from tritonwatch import memory
    memory.tune_malloc()
    db = sqlite3.connect(":memory:")
    db.execute("CREATE TABLE t (x)")
    db.executemany("INSERT INTO t VALUES (?)", [(i,) for i in range(10_000)])
    r = memory.report()
    assert r.rss > 10 * 2**20, r
    assert r.heap > 0 and r.heap_used > 0 and r.heap_used + r.heap_free <= r.heap, r
    assert r.sqlite > 0, r  # the sqlite3 module's own library, holding the table's pages
    assert r.python_blocks > 1000, r
    logging.basicConfig(level=logging.DEBUG, format="%(name)s %(message)s")
    memory.release_free_memory()
""")


def test_memory_report_names_where_the_memory_is_at_debug() -> None:
    out = subprocess.run([sys.executable, "-c", REPORT_CHILD], capture_output=True, text=True,
                         check=True, timeout=120)
    line = next(x for x in out.stderr.splitlines() if x.startswith("tritonwatch.memory "))
    assert "after trim; malloc heap" in line and "SQLite" in line, out.stderr
    # Read back as ``bench.fleet --serve-log`` reads a serve log.
    from tritonwatch import memory

    seen = memory.read_trim_line(line)
    assert seen is not None, line
    assert seen.rss > 0 and seen.before > 0 and seen.python_blocks > 1000, seen
    assert seen.heap_used <= seen.heap and seen.heap_free <= seen.heap, seen
    assert memory.read_trim_line(line.replace("after trim", "before trim")) is None


PEAKS_CHILD = textwrap.dedent("""
    import logging, threading
    from tritonwatch import memory
    from tritonwatch.store.fairlock import FairLock
    logging.basicConfig(level=logging.DEBUG, format="%(name)s %(message)s")
    done = threading.Event()
    gate = FairLock()
    gate.acquire()  # held by this thread until the peak is logged

    def allocating_thread():
        block = b"x" * (64 << 20)  # 64 MiB, every page touched
        with gate:  # waits in tritonwatch's own code, with the block held
            del block

    class Seen(logging.Handler):
        def emit(self, record):
            if "high-water" in record.getMessage():
                done.set()

    logging.getLogger("tritonwatch.memory").addHandler(Seen())
    idler = threading.Thread(target=done.wait, name="idler", daemon=True)
    idler.start()
    assert memory.watch_peaks(done, poll_s=0.05, step=16 << 20) is not None
    worker = threading.Thread(target=allocating_thread, name="allocator")
    worker.start()
    done.wait(60)  # the watcher logs from its own thread (at most 60 s: a busy machine)
    gate.release()
    worker.join(60)
""")


def test_each_new_rss_high_water_mark_is_logged_with_where_the_threads_are_at_debug() -> None:
    out = subprocess.run([sys.executable, "-c", PEAKS_CHILD], capture_output=True, text=True,
                         check=True, timeout=120)
    line = next(x for x in out.stderr.splitlines() if "high-water" in x)
    # The allocating thread is named, in tritonwatch's code and in the function that holds the
    # block; a thread with only the standard library on its stack is counted, not listed.
    assert "[allocator]" in line and "fairlock.py" in line, out.stderr
    assert "allocating_thread" in line, line
    assert "[idler]" not in line and "idle thread(s)" in line, line
    # The rise since the last mark logged (here the start): the 64 MiB block, at least the step.
    rose = float(re.search(r"high-water [0-9.]+ MiB \(\+([0-9.]+)\)", line).group(1))  # type: ignore[union-attr]
    assert 16 <= rose < 1024, line
    # Read back as ``bench.fleet --serve-log`` reads a serve log.
    from tritonwatch import memory

    seen = memory.read_peak_line(line)
    assert seen is not None and seen.rose == rose and seen.rss >= rose, line
    assert seen.where.startswith("[") and "[allocator]" in seen.where, seen
    assert memory.read_peak_line(line.replace("high-water", "low-water")) is None


def test_no_peak_watcher_without_debug_logging() -> None:
    import logging
    import threading

    from tritonwatch import memory

    logger = logging.getLogger("tritonwatch.memory")
    level = logger.level
    logger.setLevel(logging.INFO)
    try:
        assert memory.watch_peaks(threading.Event()) is None
    finally:
        logger.setLevel(level)


def test_serve_leaves_httpx_command_line_client_and_rich_out(tmp_path) -> None:
    # The real command line, `tritonwatch serve`, in a fresh interpreter, up to where serve
    # would start (asyncio.run replaced): serve's modules are loaded, httpx among them, but
    # not httpx's command-line client, nor rich or pygments (the probe command's, which the
    # parser used to import for every command); httpx still works, with its stub main.
    with socket.socket() as sock:  # a free port: serve checks it can listen there
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    config = tmp_path / "tw.yaml"
    config.write_text(f"targets: []\nstore:\n  url: sqlite:///{tmp_path}/tw.db\n"
                      f"api:\n  listen: 127.0.0.1:{port}\n")
    code = textwrap.dedent("""
        import asyncio, sys
        seen = {}
        def fake_run(coro):
            coro.close()
            seen["modules"] = {m for m, v in sys.modules.items() if v is not None}
        asyncio.run = fake_run
        from tritonwatch.cli import main
        main(["serve", "--config", sys.argv[1]])
        loaded = seen["modules"]
        assert {"tritonwatch.serve", "httpx", "fastapi"} <= loaded, sorted(loaded)
        assert not {"rich", "pygments", "httpx._main"} & loaded, sorted(loaded)
        import httpx
        assert callable(httpx.main) and httpx.Client is not None
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", code, str(config)], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
    # Imported without the command line, serve's modules do bring them in: the check above
    # can fail.
    out = subprocess.run([sys.executable, "-c", "import sys, tritonwatch.serve; "
                          "print('rich' in sys.modules, 'pygments' in sys.modules)"],
                         capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "True True", out.stderr
