"""Spill files: what the store would not take at shutdown, kept on disk for the next start.

``serve`` ends with a final flush; when the database does not answer by the shutdown deadline,
whatever is still buffered (:meth:`Store.drain`: samples, target health, probe results) is
written here instead of being lost, and the next ``serve`` on the same store writes it to the
database before it starts scraping (:func:`reingest`), then deletes the file.

Format: JSON lines, one file per shutdown, ``spill-<UTC time>-<pid>.jsonl``::

    {"tritonwatch_spill": 1, "store": "<redacted URL>", "written_at": ..., "samples": N, ...}
    {"layout": 0, "names": [...], "labels": [[["model", "m"], ...], ...]}
    {"scrape": 0, "target": "a", "ts_ms": 1700000000000, "values": "<base64 float64 LE>"}
    {"health": ["a", "metrics", 1700000000.0, true, 0.01, 42, null]}
    {"probe": {"probe": "p", "ts": 1700000000000, ...}}
    {"end": {"samples": N, "health": H, "probe_results": P}}

A layout (a scrape's series names and label sets) is written once however many buffered
scrapes share it, as in the buffer itself; values travel as the raw float64 bytes, which keeps
NaN and infinities exact and writes a million samples in well under a second.  The file is
written under a temporary name and renamed when complete, so a file with the final name is
whole; one that does not read back (edited, truncated by a full disk) is renamed ``*.bad`` with
an error naming it and the line, and never blocks a start.

A spill belongs to the store it came from: its header names the store (redacted URL), and a
file of another store is left alone, with a warning.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from tritonwatch.schemas.config import DEFAULT_DATA_DIR
from tritonwatch.schemas.samples import Labels, TargetHealth
from tritonwatch.store.engine import parse_url
from tritonwatch.store.errors import StoreError
from tritonwatch.store.flush import BufferedScrape
from tritonwatch.store.store import Pending, Store

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
PATTERN = "spill-*.jsonl"
_LE_F64 = np.dtype("<f8")


class SpillError(ValueError):
    """A spill file that does not read back; the message names the file and the line."""


def default_dir(url: str) -> Path:
    """``spill/`` beside a SQLite file, ``tritonwatch-data/spill`` for PostgreSQL."""
    parsed = parse_url(url)
    if parsed.get_backend_name() == "sqlite" and parsed.database:
        return Path(parsed.database).parent / "spill"
    return DEFAULT_DATA_DIR / "spill"


def write(directory: Path, store: str, pending: Pending) -> Path:
    """Write ``pending`` (of the store whose redacted URL is ``store``) to a new spill file in
    ``directory`` (created); returns its path.  Raises OSError if it cannot be written."""
    directory.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    path = directory / f"spill-{stamp}-{os.getpid()}.jsonl"
    n = 0
    while path.exists():  # never over another spill (same second, same process)
        n += 1
        path = directory / f"spill-{stamp}-{os.getpid()}-{n}.jsonl"
    tmp = directory / f".{path.name}.tmp"
    counts = {"samples": pending.samples, "health": len(pending.health),
              "probe_results": len(pending.probe_rows)}
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            _line(f, {"tritonwatch_spill": FORMAT_VERSION, "store": store,
                      "written_at": time.time(), **counts})
            layouts: dict[tuple[int, int], int] = {}
            for target, ts_ms, names, labels, values, _ in pending.scrapes:
                # The buffer shares one names list and one labels list between a target's
                # scrapes while its series do not change: so does the file.
                key = (id(names), id(labels))
                layout = layouts.get(key)
                if layout is None:
                    layout = layouts[key] = len(layouts)
                    _line(f, {"layout": layout, "names": names,
                              "labels": [list(map(list, lab)) for lab in labels]})
                data = base64.b64encode(values.astype(_LE_F64, copy=False).tobytes())
                _line(f, {"scrape": layout, "target": target, "ts_ms": ts_ms,
                          "values": data.decode("ascii")})
            for h in pending.health:
                _line(f, {"health": list(h)})
            for row in pending.probe_rows:
                _line(f, {"probe": row})
            _line(f, {"end": counts})
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(directory)
    return path


def _line(f: Any, record: dict[str, Any]) -> None:
    f.write(json.dumps(record, separators=(",", ":")))
    f.write("\n")


def _fsync_dir(directory: Path) -> None:
    # The rename itself must survive a crash, or the next start finds nothing.
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def read(path: Path) -> tuple[str, Pending]:
    """The store a spill file belongs to (redacted URL) and its content.

    Raises SpillError naming the file and line for anything but a whole, well-formed file,
    OSError if it cannot be read.
    """
    scrapes: list[BufferedScrape] = []
    health: list[TargetHealth] = []
    probes: list[dict[str, Any]] = []
    layouts: dict[int, tuple[list[str], list[Labels]]] = {}
    store: str | None = None
    end: dict[str, Any] | None = None
    with open(path, encoding="utf-8") as f:
        for number, text in enumerate(f, 1):
            try:
                record = json.loads(text)
                if end is not None:
                    raise ValueError("data after the end record")
                if number == 1:
                    if record.get("tritonwatch_spill") != FORMAT_VERSION:
                        raise ValueError(f"not a version {FORMAT_VERSION} spill file")
                    store = str(record["store"])
                elif "scrape" in record:
                    names, labels = layouts[int(record["scrape"])]
                    values = np.frombuffer(base64.b64decode(record["values"], validate=True),
                                           _LE_F64).astype(np.float64)
                    if len(values) != len(names):
                        raise ValueError(f"{len(values)} values for {len(names)} series")
                    scrapes.append((str(record["target"]), int(record["ts_ms"]), names, labels,
                                    values, int(np.count_nonzero(np.isnan(values)))))
                elif "layout" in record:
                    names = [str(n) for n in record["names"]]
                    labels = [tuple((str(k), str(v)) for k, v in lab) for lab in record["labels"]]
                    if len(names) != len(labels):
                        raise ValueError(f"{len(names)} names for {len(labels)} label sets")
                    layouts[int(record["layout"])] = (names, labels)
                elif "health" in record:
                    target, source, ts, up, duration, samples, error = record["health"]
                    health.append(TargetHealth(str(target), str(source), float(ts), bool(up),
                                               float(duration), int(samples),
                                               None if error is None else str(error)))
                elif "probe" in record:
                    probes.append(dict(record["probe"]))
                elif "end" in record:
                    end = dict(record["end"])
                else:
                    raise ValueError("unknown record")
            except (ValueError, KeyError, TypeError, IndexError) as exc:
                raise SpillError(f"spill file {path}, line {number}: {exc!r}") from None
    pending = Pending(scrapes, health, probes)
    if store is None or end is None:
        raise SpillError(f"spill file {path} is incomplete (no end record)")
    found = {"samples": pending.samples, "health": len(health), "probe_results": len(probes)}
    if end != found:
        raise SpillError(f"spill file {path}: holds {found}, its end record says {end}")
    return store, pending


def files(directory: Path) -> list[Path]:
    """The spill files in ``directory``, oldest first."""
    if not directory.is_dir():
        return []
    return sorted(directory.glob(PATTERN))


def reingest(store: Store, directory: Path) -> int:
    """Write every spill file of ``store`` in ``directory`` to it, oldest first, deleting each
    once flushed; returns the number of samples written.

    Raises StoreError if a flush fails: that file (and the later ones) stay for the next start,
    and nothing of it stays buffered.  Files of another store are left alone (a warning);
    unreadable ones are renamed ``*.bad`` (an error naming the file and line).
    """
    total = 0
    for path in files(directory):
        try:
            origin, pending = read(path)
        except (SpillError, OSError) as exc:
            bad = path.with_name(path.name + ".bad")
            log.error("store: %s; renamed to %s, not stored", exc, bad.name)
            path.replace(bad)
            continue
        if origin != store.url_redacted:
            log.warning("store: spill file %s belongs to %s, not to %s; left in place",
                        path, origin, store.url_redacted)
            continue
        store.restore(pending)
        try:
            store.flush()
        except StoreError:
            store.drain()  # still in the file, which the next start reads again
            raise
        path.unlink()
        total += pending.samples
        log.warning("store: wrote %s from spill file %s to %s (kept at the last shutdown)",
                    pending.describe(), path, store.url_redacted)
    return total
