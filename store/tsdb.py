"""Time series on a Prometheus-compatible TSDB: the ``Query`` reads answered by PromQL.

With ``store.timeseries`` configured, samples leave through remote-write (wired in
``tritonwatch/serve.py``) and :class:`TsdbReader` answers ``Store.read`` / ``increase`` /
``rate`` / ``series`` / ``series_page`` over the Prometheus HTTP API of VictoriaMetrics,
Mimir, Thanos or Prometheus, with the same answers as the SQL ``Reader``:

- raw samples: ``sel[w]`` as an instant query at ``end`` (``w`` = the window plus 1 ms, so
  both ends are in whether the server's range is left-open (Prometheus 3, VictoriaMetrics) or
  closed (Prometheus 2); samples before ``start`` are dropped here).  Plain PromQL rather than
  VictoriaMetrics' ``/api/v1/export``, so that every Prometheus-compatible backend answers it.
- buckets: ``<agg>_over_time(sel[step])`` (``last`` is ``last_over_time``) by ``query_range``
  evaluated at ``bucket start + step - 1 ms``: its range ``(t - step, t]`` is exactly the SQL
  bucket ``[start, start + step)`` in milliseconds, stamped with its start.  Buckets cut by
  the window's ends (the SQL store reads only samples inside it) are instant queries over the
  part inside.  One query per metric name: PromQL functions drop ``__name__``.
- increase and rate: from the raw samples, reset-aware and without extrapolation, as the SQL
  store computes them.  PromQL's ``increase``/``rate`` extrapolate to the window's edges and
  would disagree with derived SLIs and with the contract every backend passes.
- series: ``/api/v1/series`` with the same matchers.

Label values are data: every matcher value is a PromQL string literal, quoted and escaped
(:func:`quote`), never pasted into the query text.  The stored series ``target`` is the
``target`` label (a stored label ``target`` travels as ``exported_target``, as the
remote-write encoder sends it).  Responses are read up to ``max_response_bytes``; errors name
the endpoint with userinfo and query masked.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import urlencode, urlsplit, urlunsplit

import httpx
import numpy as np

from tritonwatch.schemas.remote_write import TimeseriesConfig
from tritonwatch.schemas.samples import label_value, labels_json, make_labels
from tritonwatch.store.errors import LimitExceeded, QueryError, StoreError
from tritonwatch.store.query import AGGS
from tritonwatch.store.reads import Query, page_window
from tritonwatch.store.values import SeriesColumns, SeriesKey

#: Default bound on one response body (a raw read of many series is the big one).
DEFAULT_MAX_RESPONSE_BYTES = 256 * 1024**2
#: Points per series per ``query_range`` call (Prometheus refuses more than 11,000).
MAX_POINTS = 10_000
_FUNCS = {agg: f"{agg}_over_time" for agg in AGGS}
_NAME_BAD = re.compile(r"[^a-zA-Z0-9_:]")
_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
#: The end of "all time" for series listings (year 2100): a TSDB lists by time range.
_ALL_END_S = 4_102_444_800
#: ... and its start: VictoriaMetrics reads ``start=0`` as "not given" (then: a day before end).
_ALL_START_MS = 1000
_FORM = {"Content-Type": "application/x-www-form-urlencoded"}
_EMPTY = SeriesColumns([], np.zeros(1, np.int64), np.empty(0), np.empty(0))


def redact_url(url: str) -> str:
    """``url`` with userinfo and query masked: safe for logs and error messages."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    if parts.username is not None or parts.password is not None:
        host = f"***@{host}"
    return urlunsplit((parts.scheme, host, parts.path, "***" if parts.query else "", ""))


def quote(value: str) -> str:
    """``value`` as a PromQL double-quoted string literal (Go escapes: ``\\"``, ``\\\\``,
    ``\\n``, ``\\uXXXX`` for control characters; other Unicode as is)."""
    return json.dumps(value, ensure_ascii=False)


def metric_name(name: str) -> str:
    """The ``__name__`` a stored series name has in the TSDB (as the remote-write encoder
    sends it)."""
    return _NAME_BAD.sub("_", name) or "_"


def _label(key: str) -> str:
    if not _LABEL_NAME.match(key):
        raise QueryError(f"{key!r} is not a label name a TSDB can match ([a-zA-Z_][a-zA-Z0-9_]*)")
    return "exported_" + key if key in ("target", "__name__") else key


def selector(q: Query, *, name: str | None = None) -> str | None:
    """The PromQL series selector of ``q`` (``name``: this metric name instead of ``q``'s);
    None when it selects nothing (an empty ``names``)."""
    parts: list[str] = []
    if name is not None:
        parts.append(f"__name__={quote(metric_name(name))}")
    else:
        names = None if q.names is None else set(q.names)
        if q.name is not None:
            names = {q.name} if names is None else names & {q.name}
        if names is not None:
            if not names:
                return None
            if len(names) == 1:
                parts.append(f"__name__={quote(metric_name(next(iter(names))))}")
            else:
                alts = "|".join(re.escape(metric_name(n)) for n in sorted(names))
                parts.append(f"__name__=~{quote(alts)}")
    if q.target is not None:
        parts.append(f"target={quote(q.target)}")
    for key, value in sorted((q.match or {}).items()):
        parts.append(f"{_label(key)}={quote(value)}")
    if not any(not p.endswith('=""') for p in parts):
        # PromQL refuses a selector that matches the empty label set; this one does not.
        parts.insert(0, '__name__=~".+"')
    return "{" + ",".join(parts) + "}"


def key_of(metric: Mapping[str, str]) -> SeriesKey:
    """The stored series key of a TSDB label set (the encoder's mapping undone)."""
    labels: dict[str, str] = {}
    for key, value in metric.items():
        if key in ("__name__", "target"):
            continue
        labels[key.removeprefix("exported_") if key in (
            "exported_target", "exported___name__") else key] = value
    return SeriesKey(metric.get("target", ""), metric.get("__name__", ""), make_labels(labels))


def _ms(ms: int) -> str:
    return f"{ms / 1000:.3f}"


class TsdbReader:
    """Answers ``Query`` reads from the Prometheus HTTP API at ``query_url`` (the root before
    ``/api/v1/``, e.g. ``http://vmselect:8481/select/0/prometheus``).  Thread-safe."""

    def __init__(
        self, query_url: str, *, headers: Mapping[str, str] | None = None,
        auth: tuple[str, str] | None = None, timeout_s: float = 30.0,
        max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
    ) -> None:
        self.url_redacted = redact_url(query_url)
        self._root = urlsplit(query_url)
        self._max_bytes = max_response_bytes
        self._http = httpx.Client(headers=dict(headers or {}), auth=auth,
                                  timeout=httpx.Timeout(timeout_s))

    @classmethod
    def from_config(cls, config: TimeseriesConfig) -> TsdbReader:
        """The reader of ``store.timeseries`` (its auth, headers, timeout and size bound)."""
        auth = config.basic_auth
        return cls(config.query_url, headers=config.auth_headers(),
                   auth=None if auth is None else (auth.username, auth.password),
                   timeout_s=config.timeout, max_response_bytes=config.max_response_size)

    def close(self) -> None:
        self._http.close()

    # --- HTTP --------------------------------------------------------------------------------

    def _api(self, path: str, params: list[tuple[str, str]]) -> Any:
        """``data`` of a Prometheus API answer; StoreError naming the endpoint otherwise."""
        root = self._root
        url = urlunsplit((root.scheme, root.netloc, root.path.rstrip("/") + path, root.query, ""))
        where = redact_url(url)
        try:
            # A form body: matchers can be long, and ``match[]`` repeats.
            with self._http.stream("POST", url, content=urlencode(params),
                                   headers=_FORM) as resp:
                body = bytearray()
                for part in resp.iter_bytes():
                    body += part
                    if len(body) > self._max_bytes:
                        raise LimitExceeded(
                            f"{where}: the answer exceeds {self._max_bytes:,} bytes",
                            what="bytes", limit=self._max_bytes)
        except httpx.TimeoutException as exc:
            raise StoreError(f"query on {where} timed out ({type(exc).__name__})",
                             url=self.url_redacted) from exc
        except httpx.HTTPError as exc:
            raise StoreError(f"query on {where} failed: {type(exc).__name__}",
                             url=self.url_redacted) from exc
        try:
            doc = json.loads(body)
        except ValueError:
            doc = None
        if resp.status_code >= 400 or not isinstance(doc, dict) or doc.get("status") != "success":
            reason = doc.get("error") if isinstance(doc, dict) else bytes(body[:200]).decode(
                "utf-8", "replace")
            message = f"query on {where} failed: HTTP {resp.status_code}: {reason}"
            if resp.status_code in (400, 422):
                raise QueryError(message)
            raise StoreError(message, url=self.url_redacted)
        return doc.get("data")

    def _instant(self, expr: str, at_ms: int) -> list[dict[str, Any]]:
        data = self._api("/api/v1/query", [("query", expr), ("time", _ms(at_ms)),
                                            ("nocache", "1")])
        return list(data.get("result") or [])

    def _range(self, expr: str, lo_ms: int, hi_ms: int, step_ms: int) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        at = lo_ms
        while at <= hi_ms:
            end = min(hi_ms, at + (MAX_POINTS - 1) * step_ms)
            data = self._api("/api/v1/query_range", [
                ("query", expr), ("start", _ms(at)), ("end", _ms(end)),
                ("step", str(step_ms / 1000)), ("nocache", "1")])
            out.extend(data.get("result") or [])
            at = end + step_ms
        return out

    def _series(self, sel: str, lo_ms: int, hi_ms: int, limit: int | None) -> list[SeriesKey]:
        params = [("match[]", sel), ("start", _ms(lo_ms)), ("end", _ms(hi_ms))]
        if limit is not None:
            params.append(("limit", str(limit)))
        data = self._api("/api/v1/series", params)
        return sorted({key_of(m) for m in data or []})

    # --- reads -------------------------------------------------------------------------------

    def find(self, q: Query, *, window: tuple[int, int] | None = None) -> list[SeriesKey]:
        """The series ``q`` selects, sorted by key (``max_series``: LimitExceeded past it)."""
        sel = selector(q)
        if sel is None:
            return []
        lo, hi = window or (_ALL_START_MS, _ALL_END_S * 1000)
        filtered = q.where is not None or bool(q.match)
        limit = None if q.max_series is None or filtered else q.max_series + 1
        keys = self._series(sel, lo, hi, limit)
        if q.match:  # a TSDB matches `""` as absent too; kept for a label named like ours
            keys = [k for k in keys if all(label_value(k.labels, a, "") == b
                                           for a, b in q.match.items())]
        if q.where is not None:
            where = q.where
            keys = [k for k in keys if where(k.target, k.name, k.labels)]
        if q.max_series is not None and len(keys) > q.max_series:
            raise LimitExceeded(f"the query selects more than {q.max_series:,} series",
                                what="series", limit=q.max_series)
        return keys

    def read(self, q: Query) -> SeriesColumns:
        lo, hi = q.window()
        if q.step is None:
            if q.agg is not None:
                raise QueryError(f"agg {q.agg!r} needs a step")
            return self._raw(q, lo, hi)
        if q.agg not in AGGS:
            raise QueryError(f"agg must be one of {sorted(AGGS)}, got {q.agg!r}")
        if not math.isfinite(q.step) or round(q.step * 1000) < 1:
            raise QueryError(f"step must be a positive number of seconds, got {q.step!r}")
        return self._buckets(q, lo, hi, round(q.step * 1000), q.agg)

    def _check_samples(self, q: Query, keys: list[SeriesKey], lo: int, hi: int) -> None:
        if q.max_samples is None or not keys:
            return
        total = 0.0
        for name in sorted({k.name for k in keys}):
            sel = selector(q, name=name)
            for r in self._instant(f"sum(count_over_time({sel}[{hi - lo + 1}ms]))", hi):
                total += float(r["value"][1])
        if total > q.max_samples:
            raise LimitExceeded(f"the query would read more than {q.max_samples:,} samples",
                                what="samples", limit=q.max_samples)

    def _raw(self, q: Query, lo: int, hi: int) -> SeriesColumns:
        keys = self.find(q, window=(lo, hi))
        if not keys:
            return _EMPTY
        self._check_samples(q, keys, lo, hi)
        wanted = set(keys)
        found: dict[SeriesKey, tuple[list[float], list[float]]] = {}
        for name in sorted({k.name for k in keys}):
            for r in self._instant(f"{selector(q, name=name)}[{hi - lo + 1}ms]", hi):
                key = key_of(r["metric"])
                if key not in wanted:
                    continue
                ts, vs = found.setdefault(key, ([], []))
                for t, v in r.get("values") or ():
                    if round(float(t) * 1000) < lo:
                        continue
                    if ts and ts[-1] == float(t):
                        # A TSDB keeps samples of equal timestamps (VictoriaMetrics without
                        # deduplication); the SQL store keeps one.  Which one it returns last
                        # is the TSDB's choice (VictoriaMetrics: the greatest).
                        vs[-1] = float(v)
                        continue
                    ts.append(float(t))
                    vs.append(float(v))
        return _columns(found)

    def _buckets(self, q: Query, lo: int, hi: int, step: int, agg: str) -> SeriesColumns:
        keys = self.find(q, window=(lo, hi))
        if not keys:
            return _EMPTY
        self._check_samples(q, keys, lo, hi)
        wanted = set(keys)
        first, last = lo // step * step, hi // step * step
        full_lo = first if first >= lo else first + step
        full_hi = last if last + step - 1 <= hi else last - step
        func = _FUNCS[agg]
        found: dict[SeriesKey, tuple[list[float], list[float]]] = {}

        def add(result: Iterable[dict[str, Any]], name: str, shift_ms: int) -> None:
            for r in result:
                key = key_of({**r["metric"], "__name__": metric_name(name)})
                if key not in wanted:
                    continue
                ts, vs = found.setdefault(key, ([], []))
                points = r.get("values") or ([r["value"]] if "value" in r else [])
                for t, v in points:
                    ts.append((round(float(t) * 1000) - shift_ms) / 1000)
                    vs.append(float(v))

        for name in sorted({k.name for k in keys}):
            sel = selector(q, name=name)
            if full_lo <= full_hi:
                add(self._range(f"{func}({sel}[{step}ms])", full_lo + step - 1,
                                full_hi + step - 1, step), name, step - 1)
            # The window's ends cut these: aggregate only the part inside it.
            for start in sorted({b for b in (first, last) if b < full_lo or b > full_hi}):
                at = min(start + step - 1, hi)
                width = at - max(start, lo) + 1
                add(self._instant(f"{func}({sel}[{width}ms])", at), name, at - start)
        for ts, vs in found.values():
            order = sorted(range(len(ts)), key=ts.__getitem__)
            ts[:], vs[:] = [ts[i] for i in order], [vs[i] for i in order]
        return _columns(found)

    def increase(self, q: Query) -> list[tuple[SeriesKey, float, int, int]]:
        """As ``query.increase``: reset-aware over the raw samples in the window."""
        cols = self._raw(q, *q.window())
        out = []
        for i, key in enumerate(cols.keys):
            a, b = int(cols.bounds[i]), int(cols.bounds[i + 1])
            if b - a < 2:
                continue
            v = cols.values[a:b]
            with np.errstate(invalid="ignore", over="ignore"):
                step = np.where(v[1:] >= v[:-1], v[1:] - v[:-1], v[1:])
                inc = float(np.maximum(step, 0.0).sum())
            out.append((key, inc, round(float(cols.ts[a]) * 1000),
                        round(float(cols.ts[b - 1]) * 1000)))
        return out

    def series_page(self, q: Query, *, after: SeriesKey | None,
                    limit: int | None) -> list[SeriesKey]:
        window = page_window(q)
        if window is not None:
            window = (max(window[0], _ALL_START_MS), min(window[1], _ALL_END_S * 1000))
        keys = self.find(Query(q.name, names=q.names, target=q.target, where=q.where),
                         window=window)
        order = sorted(keys, key=lambda k: (k.target, k.name, labels_json(k.labels)))
        if after is not None:
            cursor = (after.target, after.name, labels_json(after.labels))
            order = [k for k in order if (k.target, k.name, labels_json(k.labels)) > cursor]
        if window is not None and order:
            order = self._with_samples(q, order, window)
        return order if limit is None else order[:limit]

    def _with_samples(self, q: Query, keys: list[SeriesKey],
                      window: tuple[int, int]) -> list[SeriesKey]:
        lo, hi = window
        counts: dict[SeriesKey, float] = {}
        for name in sorted({k.name for k in keys}):
            sel = selector(Query(target=q.target), name=name)
            for r in self._instant(f"count_over_time({sel}[{hi - lo + 1}ms])", hi):
                counts[key_of({**r["metric"], "__name__": metric_name(name)})] = float(
                    r["value"][1])
        if q.max_samples is not None and sum(counts.values()) > q.max_samples:
            raise LimitExceeded(f"the query would read more than {q.max_samples:,} samples",
                                what="samples", limit=q.max_samples)
        return [k for k in keys if counts.get(k, 0) > 0]


def _columns(found: Mapping[SeriesKey, tuple[list[float], list[float]]]) -> SeriesColumns:
    keys = sorted(k for k, (ts, _) in found.items() if ts)
    if not keys:
        return _EMPTY
    bounds = np.zeros(len(keys) + 1, np.int64)
    np.cumsum([len(found[k][0]) for k in keys], out=bounds[1:])
    return SeriesColumns(keys, bounds,
                         np.array([t for k in keys for t in found[k][0]], np.float64),
                         np.array([v for k in keys for v in found[k][1]], np.float64))
