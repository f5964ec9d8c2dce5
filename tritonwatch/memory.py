"""The process's memory: how the garbage collector and glibc's allocator are tuned for a
long-running collector, freed heap pages handed back, and where the memory is (for ``-vv``).

A fleet's collector holds a few hundred MB of long-lived state (series ids, derive baselines,
alert windows) next to a steady churn of short-lived scrape bodies, parse results and flush
arrays; the defaults of both CPython's collector and glibc's malloc are tuned for neither.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import gc
import logging
import os
import re
import sys
import threading
import time
import tracemalloc
from collections.abc import Callable
from types import FrameType
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from apscheduler.schedulers.asyncio import AsyncIOScheduler

log = logging.getLogger(__name__)

#: How often the process hands freed heap pages back (:func:`release_free_memory`).  Every
#: flush interval (15 s by default) frees a flush's worth of heap; trimmed only every 15 s, the next
#: flush's and alert evaluation's transients came on top of pages not yet handed back.
#: Measured at 1,000 targets, 8 to 10 minutes each (AMD EPYC, 2 cores): the minutes' RSS
#: high-water marks 271-273 MiB at 15 s and 265-269 at 5 s over the first 5 minutes.  Not
#: free: pages handed back are faulted in again.  A 40-minute run at 5 s (with the smaller
#: flush groups of ``store.flush``) averaged 28.1 % of a core over its steady minutes, the
#: run before at 15 s 26.4 %; the two changes were not timed apart there.
TRIM_INTERVAL_S = 5.0


def tune_gc() -> None:
    """Fit CPython's cyclic garbage collector to a long-running collector process.

    Every scrape allocates thousands of small tuples that live until the next scrape or flush.
    With the default thresholds (700 allocations) they trigger a collection every few hundred
    lines parsed, and the survivors are rescanned in the older generations again and again:
    measured here, that tripled the parse time of a 2,900-series payload (5.8 ms -> 2.2 ms per
    scrape).  The data itself is acyclic and freed by reference counting, so collecting rarely
    loses nothing; freezing moves the start-up objects (modules, config, caches) out of every
    future collection.  Call once, after start-up and before the first scrape.
    """
    gc.freeze()
    gc.set_threshold(50_000, 20, 100)


def skip_unused_imports() -> None:
    """Keep modules that ``serve`` never runs out of its process; call before anything imports
    ``httpx``.

    ``import httpx`` imports its command-line client (``httpx._main``: rich, pygments and
    click) whenever they are installed, as they are beside tritonwatch (its own progress
    bars, uvicorn): measured, the collector's imports took 91.7 MiB of RSS with it and 87.6
    without.  A None in ``sys.modules`` makes that import fail, and httpx then defines the
    stub ``main`` it has for an install without them.
    """
    if "httpx" not in sys.modules and "httpx._main" not in sys.modules:
        sys.modules["httpx._main"] = None  # type: ignore[assignment]  # the import system's "absent"


def tune_malloc() -> None:
    """Cap glibc's malloc arenas at two (what ``MALLOC_ARENA_MAX=2`` does) and serve every
    allocation of 256 KiB or more from its own mapping, where glibc runs.

    glibc gives every thread that allocates its own arena (up to 8 per core) and memory freed
    in one arena is not reused by another.  The scrapes are parsed in a pool of worker threads
    and their bodies read on the event loop, so a fleet's memory ends up spread thin over many
    arenas: measured at 300 targets, two arenas cut the collector's RSS growth by 30 %
    (145 -> 102 MB) at no measurable CPU cost.

    glibc also raises its mapping threshold each time a mapped block is freed, so after the
    first flush the large, short-lived arrays of flushes, rollups and alert windows come from
    the heap, whose freed space mostly stays resident.  A fixed threshold (which also turns
    that adjustment off) returns them to the system when freed: measured at 1,000 targets,
    RSS after 30 scrapes of each 431 MiB instead of 489 MiB.  Call before any thread starts;
    a no-op elsewhere (musl, macOS).
    """
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return
    mallopt(_M_ARENA_MAX, 2)
    mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD)
    mallopt(_M_TRIM_THRESHOLD, 4 * _MMAP_THRESHOLD)
    global _malloc_trim, _mallinfo2
    _malloc_trim = getattr(libc, "malloc_trim", None)
    _mallinfo2 = getattr(libc, "mallinfo2", None)  # glibc 2.33+
    if _mallinfo2 is not None:
        _mallinfo2.restype = _MallInfo2


_malloc_trim: Callable[[int], int] | None = None
_mallinfo2: Callable[[], _MallInfo2] | None = None


def can_trim() -> bool:
    """Whether :func:`tune_malloc` found glibc's ``malloc_trim``."""
    return _malloc_trim is not None


def install_trim(scheduler: AsyncIOScheduler) -> None:
    """Schedule :func:`release_free_memory` every :data:`TRIM_INTERVAL_S` (where it can run).

    With the grace time of the collector's jobs (a whole interval): under APScheduler's
    default of 1 s, any stall of the event loop longer than that when the trim was due (a
    large flush, a long parse) turned the run into a *missed* one, logged as a warning.
    """
    if not can_trim():
        return
    scheduler.add_job(
        asyncio.to_thread, "interval", args=[release_free_memory],
        seconds=TRIM_INTERVAL_S, id="memory:trim", name="memory:trim",
        coalesce=True, max_instances=1, misfire_grace_time=int(TRIM_INTERVAL_S),
        replace_existing=True,
    )


def release_free_memory() -> None:
    """Hand the free pages inside glibc's heaps back to the system (``malloc_trim(0)``).

    The heap only shrinks from its top by itself; pages freed in its middle stay resident.
    Every scrape leaves such holes (its body, parts and arrays are freed while the
    buffered samples around them live until the next flush).  Measured at 1,000 targets
    after 24 scrapes each: 38 MiB of 131 MiB of heap given back, in a few milliseconds.
    A no-op where :func:`tune_malloc` found no glibc.  With debug logging on, logs where the
    memory is before and after (:func:`report`): what a creeping RSS is made of.
    """
    if _malloc_trim is None:
        return
    if not log.isEnabledFor(logging.DEBUG):
        _malloc_trim(0)
        return
    before = report()
    _malloc_trim(0)
    after = report()
    log.debug("memory: RSS %.1f -> %.1f MiB after trim; malloc heap %.1f MiB (%.1f in use, "
              "%.1f free), %.1f MiB mapped; SQLite %.1f MiB; %d blocks in CPython's arenas",
              before.rss / _MIB, after.rss / _MIB, after.heap / _MIB, after.heap_used / _MIB,
              after.heap_free / _MIB, after.mapped / _MIB, after.sqlite / _MIB,
              after.python_blocks)
    log_allocation_sites()


#: How often :func:`watch_peaks` reads the RSS, and by how much a new high-water mark must
#: pass the last one logged to be logged.
PEAK_POLL_S = 0.2
PEAK_STEP_BYTES = 8 * 1024 * 1024


def watch_peaks(stop: threading.Event, *, poll_s: float = PEAK_POLL_S,
                step: int = PEAK_STEP_BYTES) -> threading.Thread | None:
    """With debug logging on, start a thread that logs each new RSS high-water mark (``step``
    above the last one logged) with where each thread running tritonwatch's code was at that
    moment (:func:`where_threads_are`).

    A fleet's peak lasts a second or less, between the reports of
    :func:`release_free_memory`; the high-water mark an operator reads in ``VmHWM`` says how
    high, not what.  Polling ``/proc/self/statm`` costs microseconds; the stacks are read only
    on a new peak.  Returns the thread, or None when debug logging is off.
    """
    if not log.isEnabledFor(logging.DEBUG):
        return None

    start = _rss()  # now, not when the thread first runs: what is allocated meanwhile counts
    _sqlite_memory()  # its library looked up here, not in the watcher at the first peak

    def run() -> None:
        logged = start
        while not stop.wait(poll_s):
            rss = _rss()
            if rss < logged + step:
                continue
            rose, logged = rss - logged, rss
            try:
                now = report()
                log.debug("memory: RSS high-water %.1f MiB (+%.1f): malloc heap %.1f MiB in "
                          "use, %.1f mapped, SQLite %.1f, %d CPython blocks; %s", rss / _MIB,
                          rose / _MIB, now.heap_used / _MIB, now.mapped / _MIB,
                          now.sqlite / _MIB, now.python_blocks, where_threads_are())
            except Exception:  # a diagnostic: it must not end, nor take anything with it
                log.debug("memory: the peak watcher could not report", exc_info=True)

    thread = threading.Thread(target=run, name="memory:peaks", daemon=True)
    thread.start()
    return thread


def where_threads_are(depth: int = 8) -> str:
    """Each thread running tritonwatch's code (its own, or a bench's): its name and its
    innermost ``depth`` frames, innermost first, one line; idle pool threads (only the
    standard library and other packages on their stacks) are counted, not listed."""
    names = {t.ident: t.name for t in threading.enumerate()}
    me = threading.get_ident()
    parts = []
    idle = 0
    for ident, frame in sys._current_frames().items():
        if ident == me:
            continue
        stack: list[FrameType] = []
        f: FrameType | None = frame
        while f is not None:
            stack.append(f)
            f = f.f_back
        if not any(x.f_code.co_filename.startswith((_OWN, _BENCH)) for x in stack):
            idle += 1
            continue
        parts.append(f"[{names.get(ident, ident)}] " + " < ".join(
            f"{_short(x.f_code.co_filename)}:{x.f_lineno} {x.f_code.co_name}"
            for x in stack[:depth]))
    return " | ".join([*parts, f"{idle} idle thread(s)"])


# Where tritonwatch's modules are (installed, or this checkout's: the package's folder as
# imported, not resolved, so that its linked subpackages are in it) and the benches'.
_OWN = os.path.dirname(os.path.abspath(__file__)) + os.sep
_BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench") + os.sep


def _short(filename: str) -> str:
    # The last two parts of the path: "store/samplelog.py", "asyncio/base_events.py".
    return "/".join(filename.rsplit("/", 2)[-2:])


#: How often :func:`log_allocation_sites` logs (seconds): a snapshot of a fleet's millions of
#: blocks takes seconds.
SITES_INTERVAL_S = 120.0
_sites_logged = [0.0]


def log_allocation_sites(top: int = 25) -> None:
    """With ``PYTHONTRACEMALLOC=N`` set (Python traces every allocation, at about twice the
    CPU), log the ``top`` source lines holding the most memory, every
    :data:`SITES_INTERVAL_S`: where a fleet's memory is, line by line (``-vv`` only)."""
    now = time.monotonic()
    if not tracemalloc.is_tracing() or now - _sites_logged[0] < SITES_INTERVAL_S:
        return
    _sites_logged[0] = now
    stats = tracemalloc.take_snapshot().statistics("lineno")
    total = sum(s.size for s in stats)
    log.debug("memory: %.1f MiB in %d blocks traced; the top %d lines:", total / _MIB,
              sum(s.count for s in stats), top)
    for stat in stats[:top]:
        frame = stat.traceback[0]
        log.debug("memory:   %7.2f MiB %8d blocks %s:%d", stat.size / _MIB, stat.count,
                  frame.filename, frame.lineno)


class TrimLine(NamedTuple):
    """One memory report of :func:`release_free_memory` as logged, read back (MiB)."""

    before: float  # RSS before the trim
    rss: float  # and after it
    heap: float
    heap_used: float
    heap_free: float
    mapped: float
    sqlite: float
    python_blocks: int


class PeakLine(NamedTuple):
    """One new high-water mark of :func:`watch_peaks` as logged, read back."""

    rss: float  # MiB
    rose: float  # MiB above the last mark logged
    where: str  # the threads in tritonwatch's code (:func:`where_threads_are`)


# What the two log lines say, read back by :func:`read_trim_line` and :func:`read_peak_line`
# (``bench.fleet --serve-log`` summarises a fleet run's memory with them); next to the
# formats they read, which ``tests/cli/test_malloc.py`` holds them to.
_NUM = r"([0-9.]+)"
_TRIM_LINE = re.compile(
    rf"memory: RSS {_NUM} -> {_NUM} MiB after trim; malloc heap {_NUM} MiB \({_NUM} in use, "
    rf"{_NUM} free\), {_NUM} MiB mapped; SQLite {_NUM} MiB; ([0-9]+) blocks")
_PEAK_LINE = re.compile(rf"memory: RSS high-water {_NUM} MiB \(\+{_NUM}\): .*? blocks; (.*)$")


def read_trim_line(line: str) -> TrimLine | None:
    """The memory report in a line of the debug log, or None where it holds none."""
    m = _TRIM_LINE.search(line)
    if m is None:
        return None
    before, rss, heap, used, free, mapped, sqlite = (float(x) for x in m.groups()[:7])
    return TrimLine(before, rss, heap, used, free, mapped, sqlite, int(m[8]))


def read_peak_line(line: str) -> PeakLine | None:
    """The high-water mark in a line of the debug log, or None where it holds none."""
    m = _PEAK_LINE.search(line)
    return None if m is None else PeakLine(float(m[1]), float(m[2]), m[3].strip())


class Report(NamedTuple):
    """Where the process's memory is, in bytes (0 where the platform cannot tell)."""

    rss: int
    heap: int  # glibc's heaps (brk and arenas)
    heap_used: int
    heap_free: int  # freed inside the heaps: resident until trimmed or reused
    mapped: int  # blocks glibc mapped on their own (at least the mapping threshold)
    sqlite: int  # what SQLite's allocator holds (page caches, statements)
    python_blocks: int  # live blocks in CPython's own arenas (0 under PYTHONMALLOC=malloc)


def report() -> Report:
    """The process's memory now (see :class:`Report`)."""
    heap = heap_used = heap_free = mapped = 0
    if _mallinfo2 is not None:
        info = _mallinfo2()
        heap, heap_used, heap_free = info.arena, info.uordblks, info.fordblks
        mapped = info.hblkhd
    return Report(_rss(), heap, heap_used, heap_free, mapped, _sqlite_memory(),
                  sys.getallocatedblocks())


def _rss() -> int:
    try:
        with open("/proc/self/statm", encoding="ascii") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return 0


def _sqlite_memory() -> int:
    # The sqlite3 module's own library, where it is a shared one (Debian's, python.org's
    # builds); a statically linked one cannot be asked.
    global _sqlite_used
    if _sqlite_used is None:
        try:
            lib = ctypes.CDLL(ctypes.util.find_library("sqlite3") or "libsqlite3.so.0")
            used = lib.sqlite3_memory_used
            used.restype = ctypes.c_int64
            _sqlite_used = used
        except (OSError, AttributeError):
            _sqlite_used = lambda: 0  # noqa: E731
    return int(_sqlite_used())


_sqlite_used: Callable[[], int] | None = None
_MIB = 1024 * 1024
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


class _MallInfo2(ctypes.Structure):
    # glibc malloc.h: struct mallinfo2 (size_t fields; mallinfo's ints overflow at 2 GiB).
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


# glibc malloc.h
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8
_MMAP_THRESHOLD = 256 * 1024
