"""Storage: bytes per sample on disk and written, codecs compared, against Prometheus's TSDB.

    PYTHONPATH=.:.deps .venv/bin/python -m bench.storage [--hours 24] [--backend both]
        [--targets small,fleet] [--names N]

The same day of realistic Triton data (``bench.storage_data``: counters with varying traffic,
gauges, summaries with NaN while idle, a histogram, a restart, a model unloaded for two hours,
jittered scrape times) of a 116-series target scraped every 30 s and a 566-series one every
15 s, measured three ways in one run:

1. **Codecs**: the samples cut into the store's hour chunks (one per series and hour) and
   encoded by each candidate: raw (schema 3), delta-of-delta timestamps and XOR'd values with
   byte shuffling and zstd (``zstandard``; and Blosc's shuffle+zstd via ``numcodecs``), pcodec
   standalone, and pcodec in its wrapped format (``store.chunks``' choice: the file header is
   implied, so a chunk carries only pcodec's chunk metadata and page).  Bytes of chunk data
   per sample, and encode / decode time per chunk.
2. **Prometheus**: ``promtool tsdb create-blocks-from openmetrics`` on the same samples (NaN
   included: Prometheus keeps them), ``du`` of the blocks (2 h blocks: promtool 2.42 has no
   option for longer ones; a running Prometheus would compact them further, so its index share
   shrinks), chunks and index apart.
3. **tritonwatch**, on SQLite and PostgreSQL: every scrape written and flushed as ``serve``
   does, maintenance (log moves, rollups, compaction) every 5 simulated minutes, a last run an
   hour after the day so every hour is compacted.  On disk: SQLite's file after VACUUM (per
   table from ``dbstat``), PostgreSQL's tables with their indexes and TOAST after VACUUM FULL.
   Written: SQLite's write() bytes (``/proc/self/io`` wchar: WAL and checkpoints); PostgreSQL's
   WAL bytes plus the data pages its checkpointer, background writer and backends wrote.
   Per sample stored (tritonwatch skips NaN samples; the Prometheus column counts them too),
   and beside it the bytes beyond an empty store's (a page or more per table and index: a
   fixed cost, a tenth of the 116-series day on SQLite and more on PostgreSQL).
   Maintenance's share of the writes is counted apart (SQLite: write() bytes; PostgreSQL: WAL).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sqlite3
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import psycopg

from bench.storage_data import DAY_MS, Day, fleet_day, small_day
from tritonwatch.schemas.samples import make_labels
from tritonwatch.store import chunks as ck
from tritonwatch.store import open_store

HOUR_MS = 3_600_000
TABLES = ("sample_chunks", "chunk_timestamps", "sample_log", "sample_log_owners", "series",
          "rollup_chunks_5m", "rollup_chunks_1h", "meta")


def hour_chunks(day: Day) -> list[tuple[np.ndarray, np.ndarray]]:
    """Each series' stored samples (NaN skipped, as tritonwatch does) cut at hour bounds."""
    out = []
    for j in range(day.values.shape[1]):
        keep = day.present[:, j] & ~np.isnan(day.values[:, j])
        ts, v = day.ts_ms[keep], day.values[keep, j]
        hour = ts // HOUR_MS
        for h in np.unique(hour):
            m = hour == h
            out.append((ts[m], v[m]))
    return out


def _shuffle(a: np.ndarray) -> bytes:
    return np.ascontiguousarray(a.view(np.uint8).reshape(-1, 8).T).tobytes()


def _unshuffle(b: bytes, n: int) -> np.ndarray:
    return np.frombuffer(b, np.uint8).reshape(8, n).T.copy().view(np.int64).ravel()


def codecs() -> dict[str, tuple[Callable[[np.ndarray, np.ndarray], bytes],
                                Callable[[bytes, int], tuple[np.ndarray, np.ndarray]]]]:
    from pcodec import ChunkConfig, standalone

    # The zstd candidates need packages tritonwatch does not: measured where installed.
    try:
        import zstandard
    except ImportError:
        zstandard = None
    try:
        import numcodecs
    except ImportError:
        numcodecs = None

    def dod_xor(ts: np.ndarray, v: np.ndarray) -> np.ndarray:
        d1 = np.diff(ts, prepend=ts[:1])
        dd = np.diff(d1, prepend=0)
        dd[0] = ts[0]
        bits = v.view(np.int64).copy()
        bits[1:] ^= v.view(np.int64)[:-1]
        return np.concatenate([dd, bits])

    def undo(words: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
        dd, x = words[:n], words[n:]
        d1 = np.cumsum(dd[1:])
        ts = np.concatenate([dd[:1], dd[0] + np.cumsum(np.concatenate([[0], d1]))[1:]])
        return ts, np.bitwise_xor.accumulate(x).view(np.float64)

    def zstd_enc(ts: np.ndarray, v: np.ndarray) -> bytes:
        zc = zstandard.ZstdCompressor(level=3, write_checksum=False, write_content_size=False)
        w = dod_xor(ts, v)
        return bytes(zc.compress(_shuffle(w[: len(ts)]) + _shuffle(w[len(ts):])))

    def zstd_dec(b: bytes, n: int) -> tuple[np.ndarray, np.ndarray]:
        raw = zstandard.ZstdDecompressor().decompress(b, max_output_size=16 * n)
        return undo(np.concatenate([_unshuffle(raw[: 8 * n], n), _unshuffle(raw[8 * n:], n)]), n)

    def blosc_enc(ts: np.ndarray, v: np.ndarray) -> bytes:
        blosc = numcodecs.Blosc(cname="zstd", clevel=5, shuffle=numcodecs.Blosc.SHUFFLE)
        return bytes(blosc.encode(dod_xor(ts, v)))

    def blosc_dec(b: bytes, n: int) -> tuple[np.ndarray, np.ndarray]:
        blosc = numcodecs.Blosc(cname="zstd", clevel=5, shuffle=numcodecs.Blosc.SHUFFLE)
        return undo(np.frombuffer(blosc.decode(b), np.int64), n)

    def pco_enc(ts: np.ndarray, v: np.ndarray) -> bytes:
        a = bytes(standalone.simple_compress(ts, ChunkConfig(compression_level=4)))
        b = bytes(standalone.simple_compress(v, ChunkConfig(compression_level=4)))
        return len(a).to_bytes(2, "little") + a + b

    def pco_dec(b: bytes, _n: int) -> tuple[np.ndarray, np.ndarray]:
        k = int.from_bytes(b[:2], "little")
        return (standalone.simple_decompress(b[2 : 2 + k]),
                standalone.simple_decompress(b[2 + k:]))

    def store_enc(ts: np.ndarray, v: np.ndarray) -> bytes:
        return bytes(ck.compress(ck.encode(np.zeros(len(ts), np.int64), ts, v), limit=1 << 30).buf)

    def store_dec(b: bytes, n: int) -> tuple[np.ndarray, np.ndarray]:
        return ck.columns(np.array([n], np.int64), [b])

    def raw_enc(ts: np.ndarray, v: np.ndarray) -> bytes:
        return ts.tobytes() + v.tobytes()

    def raw_dec(b: bytes, n: int) -> tuple[np.ndarray, np.ndarray]:
        return ck.columns(np.array([n], np.int64), [b])

    out: dict[str, tuple[Callable[[np.ndarray, np.ndarray], bytes],
                         Callable[[bytes, int], tuple[np.ndarray, np.ndarray]]]] = {
        "raw (schema 3)": (raw_enc, raw_dec)}
    if zstandard is not None:
        out["dod+xor, shuffle, zstd-3"] = (zstd_enc, zstd_dec)
    if numcodecs is not None:
        out["dod+xor, blosc zstd-5"] = (blosc_enc, blosc_dec)
    out["pcodec standalone"] = (pco_enc, pco_dec)
    out["pcodec wrapped (chosen)"] = (store_enc, store_dec)
    return out


def compare_codecs(day: Day) -> None:
    chunks = hour_chunks(day)
    n = sum(len(ts) for ts, _ in chunks)
    print(f"\n{day.name}: {len(chunks)} hour chunks, {n:,} samples stored "
          f"({day.samples:,} exposed, NaN included)")
    print(f"  {'codec':28s} {'B/sample':>9s} {'enc us/chunk':>13s} {'dec us/chunk':>13s}")
    for name, (enc, dec) in codecs().items():
        t0 = time.perf_counter()
        blobs = [enc(ts, v) for ts, v in chunks]
        t1 = time.perf_counter()
        back = [dec(b, len(ts)) for b, (ts, _) in zip(blobs, chunks, strict=True)]
        t2 = time.perf_counter()
        for (ts, v), (got_ts, got_v) in zip(chunks, back, strict=True):
            assert np.array_equal(ts, got_ts), name
            assert np.array_equal(v.view(np.int64), np.asarray(got_v).view(np.int64)), name
        size = sum(map(len, blobs))
        print(f"  {name:28s} {size / n:9.2f} {(t1 - t0) / len(chunks) * 1e6:13.1f} "
              f"{(t2 - t1) / len(chunks) * 1e6:13.1f}")


def _labels_text(labels: dict[str, str]) -> str:
    inner = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    return "{" + inner + "}" if inner else ""


def prometheus(day: Day, work: Path) -> None:
    om = work / "day.om"
    with om.open("w") as f:
        for j, (name, labels) in enumerate(day.keys):
            head = name + _labels_text(labels) + " "
            keep = day.present[:, j]
            for ts, v in zip(day.ts_ms[keep].tolist(), day.values[keep, j].tolist(),
                             strict=True):
                text = "NaN" if v != v else repr(v)
                f.write(f"{head}{text} {ts / 1000:.3f}\n")
        f.write("# EOF\n")
    out = work / "blocks"
    subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics", "-q", str(om),
                    str(out)], check=True, timeout=600)
    total = chunks = index = 0
    for path in out.rglob("*"):
        if path.is_file():
            size = path.stat().st_size
            total += size
            if path.parent.name == "chunks":
                chunks += size
            elif path.name == "index":
                index += size
    blocks = sum(1 for p in out.iterdir() if p.is_dir())
    n = day.samples
    print(f"  Prometheus 2.42 (promtool, {blocks} blocks of 2 h): {total / n:.2f} B/sample on disk "
          f"(chunks {chunks / n:.2f}, index {index / n:.2f}) of {n:,} samples incl. NaN; "
          f"per non-NaN sample {total / day.stored_samples:.2f}")
    shutil.rmtree(out)
    om.unlink()


def _wchar() -> int:
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("wchar:"):
            return int(line.split()[1])
    return 0


def _pg_written(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CHECKPOINT")
        wal = conn.execute("SELECT wal_bytes FROM pg_stat_wal").fetchone()
        pages = conn.execute(
            "SELECT buffers_checkpoint + buffers_clean + buffers_backend FROM pg_stat_bgwriter"
        ).fetchone()
        assert wal is not None and pages is not None
        return int(wal[0]) + 8192 * int(pages[0])


def _pg_wal(url: str) -> Callable[[], int]:
    conn = psycopg.connect(url, autocommit=True)

    def wal() -> int:
        row = conn.execute("SELECT wal_bytes FROM pg_stat_wal").fetchone()
        assert row is not None
        return int(row[0])

    return wal


def ingest(day: Day, url: str, meter: Callable[[], int]) -> tuple[float, int]:
    """Writes the day as ``serve`` would; returns the seconds it took and the bytes ``meter``
    counted during maintenance runs (the rest were flushes)."""
    store = open_store(url)
    store.migrations.apply()
    names = [k[0] for k in day.keys]
    labels = [make_labels(k[1]) for k in day.keys]
    t0 = time.perf_counter()
    next_maint = int(day.ts_ms[0]) + 300_000
    maint = 0
    for k in range(len(day.ts_ms)):
        cols = np.flatnonzero(day.present[k])
        ts_ms = int(day.ts_ms[k])
        if len(cols) == len(names):
            store.write_columns("triton", ts_ms / 1000, names, labels, day.values[k])
        else:
            store.write_columns("triton", ts_ms / 1000, [names[j] for j in cols],
                                [labels[j] for j in cols], day.values[k, cols])
        store.flush()
        if ts_ms >= next_maint:
            before = meter()
            store.maintenance.rollup(ts_ms / 1000)
            maint += meter() - before
            next_maint += 300_000
    before = meter()
    store.maintenance.rollup(int(day.ts_ms[-1]) / 1000 + 3600)
    maint += meter() - before
    elapsed = time.perf_counter() - t0
    store.close()
    return elapsed, maint


def tritonwatch_sqlite(day: Day, work: Path, names: int = 0) -> None:
    path = work / "tw.db"
    url = f"sqlite:///{path}"
    before = _wchar()
    seconds, maint = ingest(day, url, _wchar)
    written = _wchar() - before
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.execute("VACUUM")
    tables = dict(conn.execute(
        "SELECT CASE WHEN name LIKE 'sqlite_autoindex_%' THEN substr(name, 19) ELSE name END, "
        "SUM(pgsize) FROM dbstat GROUP BY 1"
    ).fetchall())
    by_name = conn.execute(
        "SELECT s.name, COUNT(DISTINCT s.id), SUM(c.n), SUM(LENGTH(c.data)) FROM sample_chunks c "
        "JOIN series s ON s.id = c.series_id GROUP BY s.name ORDER BY 4 DESC LIMIT ?", (names,)
    ).fetchall()
    conn.close()
    size = path.stat().st_size
    _print_tw("SQLite", day, size, written, seconds, tables, maint, _sqlite_empty(work))
    if by_name:
        _print_names(day, by_name)
    for p in work.glob("tw.db*"):
        p.unlink()


def _print_names(day: Day, rows: list[tuple[str, int, int, int]]) -> None:
    """Where ``sample_chunks``' bytes go, by metric name: the data (timestamps named by a
    shared column excepted) per sample of that name, and its share of every stored sample's
    bytes.  What the codec cannot shrink shows here: a gauge of random floats (a utilization
    ratio) costs what its mantissas hold, whatever the codec."""
    n = day.stored_samples
    print(f"    sample_chunks data by name (the {len(rows)} largest):")
    print(f"      {'name':48s} {'series':>6s} {'samples':>8s} {'B/its sample':>12s} "
          f"{'B/all samples':>13s}")
    for name, series, samples, data in rows:
        print(f"      {name:48s} {series:6d} {samples:8d} {data / samples:12.2f} "
              f"{data / n:13.3f}")


def _sqlite_empty(work: Path) -> int:
    """Bytes of an empty store's database (the schema's pages: a page per table and index)."""
    path = work / "empty.db"
    store = open_store(f"sqlite:///{path}")
    store.migrations.apply()
    store.close()
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.execute("VACUUM")
    conn.close()
    size = path.stat().st_size
    for p in work.glob("empty.db*"):
        p.unlink()
    return size


def _pg_size(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM FULL")
        row = conn.execute(
            "SELECT sum(pg_total_relation_size(c.oid)) FROM pg_class c JOIN pg_namespace n "
            "ON n.oid = c.relnamespace WHERE n.nspname = 'public' AND c.relkind = 'r'"
        ).fetchone()
        assert row is not None
        return int(row[0])


def _pg_empty(base_url: str) -> int:
    """Bytes of an empty store's tables, indexes and TOAST (their first pages)."""
    admin = base_url.rsplit("/", 1)[0] + "/postgres"
    name = "tw_storage_empty"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        conn.execute(f'CREATE DATABASE "{name}"')
    url = base_url.rsplit("/", 1)[0] + "/" + name
    store = open_store(url)
    store.migrations.apply()
    store.close()
    return _pg_size(url)


def tritonwatch_postgres(day: Day, base_url: str, name: str) -> None:
    admin = base_url.rsplit("/", 1)[0] + "/postgres"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        conn.execute(f'CREATE DATABASE "{name}"')
    url = base_url.rsplit("/", 1)[0] + "/" + name
    before = _pg_written(url)
    seconds, maint = ingest(day, url, _pg_wal(url))
    written = _pg_written(url) - before
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM FULL")
        tables = {
            t: int(conn.execute("SELECT pg_total_relation_size(%s)", (t,)).fetchone()[0])  # type: ignore[index]
            for t in TABLES
        }
    size = _pg_size(url)
    _print_tw("PostgreSQL", day, size, written, seconds, tables, maint, _pg_empty(base_url))


def _print_tw(backend: str, day: Day, size: int, written: int, seconds: float,
              tables: dict[str, int], maint: int, empty: int) -> None:
    n = day.stored_samples
    parts = ", ".join(f"{t} {tables[t] / n:.2f}" for t in TABLES if tables.get(t))
    what = "write() bytes" if backend == "SQLite" else "WAL bytes"
    # An empty store's pages (every table and index has at least one) are a fixed cost, not
    # one per sample: a tenth of a day of one small target.  Printed apart, not subtracted.
    print(f"  tritonwatch {backend:10s}: {size / n:.2f} B/sample on disk ({parts}; "
          f"{(size - empty) / n:.2f} beyond the {empty / 1024:.0f} KiB of an empty store); "
          f"{written / n:.1f} B written per sample (of which maintenance's {what} "
          f"{maint / n:.1f}); ingest+maintenance {seconds:.0f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--hours", type=float, default=24.0)
    parser.add_argument("--backend", choices=("sqlite", "postgres", "both", "none"),
                        default="both")
    parser.add_argument("--targets", default="small,fleet")
    parser.add_argument("--codecs", action=argparse.BooleanOptionalAction, default=True,
                        help="compare the codecs first (--no-codecs: only the stores)")
    parser.add_argument("--names", type=int, default=0, metavar="N",
                        help="then, on SQLite, the N metric names taking most of the sample "
                             "chunks' bytes")
    args = parser.parse_args()
    # A UTC day's start, three days ago: the compacted spans (6 h) and rollup windows (a day)
    # then hold whole days, as they do in a store that has run for a while.  Started at the
    # last whole hour, the figures moved with the time of day the bench ran (566 series on
    # SQLite: 1.68 at one hour, 1.75 at another, the same code).
    start = (int(time.time() * 1000) - 3 * 86_400_000) // DAY_MS * DAY_MS
    makers = {"small": small_day, "fleet": fleet_day}
    days = [makers[k](start, args.hours) for k in args.targets.split(",")]
    for day in days if args.codecs else []:
        compare_codecs(day)
    pg = None
    if args.backend in ("postgres", "both"):
        from tests.fixtures_pg import running_postgres

        pg = running_postgres(durable=True)
        base_url = pg.__enter__()
    try:
        for i, day in enumerate(days):
            print(f"\n{day.name}, {args.hours:g} h:")
            with tempfile.TemporaryDirectory(prefix="tw-storage-") as tmp:
                work = Path(tmp)
                prometheus(day, work)
                if args.backend in ("sqlite", "both"):
                    tritonwatch_sqlite(day, work, args.names)
                if pg is not None:
                    tritonwatch_postgres(day, base_url, f"tw_storage_{i}")
    finally:
        if pg is not None:
            pg.__exit__(None, None, None)
    print(f"\n(2 shared cores; load average {os.getloadavg()[0]:.1f} at the end)")


if __name__ == "__main__":
    main()
