"""The Prometheus-shaped read API: series, labels, label values, build info and range queries.

Answers are ``{"status": "success", "data": ..., "warnings": [...]}`` as Prometheus's HTTP API
writes them (``warnings`` only when there is one, e.g. a page cut at its ``limit``); errors are
its error envelope (:mod:`api.errors`).  Selectors and queries are the subset of PromQL of
:mod:`api.promql`; a series carries its stored labels plus ``__name__`` and ``target``.

- ``GET /api/v1/series?match[]=SEL&match[]=SEL2&start=&end=&limit=&after=``: series matching
  any selector (with a sample in ``[start, end]`` when either is given), ``limit`` per page,
  the next page linked (``Link: <...>; rel="next"``).
- ``GET /api/v1/labels`` / ``GET /api/v1/label/<name>/values``, optionally ``match[]``,
  ``start``, ``end``, ``limit``.
- ``GET /api/v1/status/buildinfo``.
- ``GET /api/v1/query_range?query=...&start=&end=&step=``: a ``matrix`` (see
  :mod:`api.evaluate`).  The older ``name=`` / ``agg=`` / ``target=`` form still works (5-minute
  and hourly rollups serve its long ranges); ``query`` wins when both are given.

Only GET: POST is a write to the token check (:mod:`api.auth`).
"""

from __future__ import annotations

import platform
import time
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Path, Query, Request, Response
from fastapi.responses import JSONResponse
from starlette.datastructures import URL

from tritonwatch.api.errors import bad_param
from tritonwatch.api.evaluate import evaluate, grid, window_s
from tritonwatch.api.exporter import build_version
from tritonwatch.api.params import (
    check_resolution,
    decode_token,
    encode_token,
    parse_step,
    parse_time,
)
from tritonwatch.api.pool import ReadPool
from tritonwatch.api.promql import Selector, parse_query, parse_selector, predicate
from tritonwatch.api.render import matrix_json
from tritonwatch.schemas.config import ApiConfig
from tritonwatch.schemas.samples import make_labels
from tritonwatch.store import Query as StoreQuery
from tritonwatch.store import SeriesKey, Store

#: ``match[]`` selectors one request may give.
MAX_MATCHERS = 20

Time = Annotated[str | None, Query(max_length=64)]
Match = Annotated[list[str] | None, Query(alias="match[]", max_length=MAX_MATCHERS)]
After = Annotated[str | None, Query(max_length=8_192, description="page token from the "
                                    'Link rel="next" of the previous page')]


def success(data: Any, warnings: list[str] | None = None) -> JSONResponse:
    body: dict[str, Any] = {"status": "success", "data": data}
    if warnings:
        body["warnings"] = warnings
    return JSONResponse(body)


def truncated(limit: int) -> str:
    return f"results truncated due to limit {limit} (api.max_limit caps it)"


def page_limit(settings: ApiConfig, limit: int | None) -> int:
    if limit is None:
        return settings.default_limit
    if not 1 <= limit <= settings.max_limit:
        raise bad_param("limit", f"must be between 1 and {settings.max_limit} (api.max_limit)")
    return limit


def link_next(request: Request, response: Response, limit: int, token: str) -> None:
    """Link the page after this one (``after`` = ``token``)."""
    url = URL(str(request.url)).include_query_params(after=token, limit=limit)
    response.headers["Link"] = f'<{url.path}?{url.query}>; rel="next"'


def selectors(match: list[str] | None, *, required: bool) -> list[Selector]:
    if not match:
        if required:
            raise bad_param("match[]", "no match[] parameter provided")
        return []
    return [parse_selector(m, "match[]") for m in match]


def _names(sels: list[Selector]) -> set[str] | None:
    """The metric names the selectors can match, when every one fixes its name."""
    names = [s.name for s in sels]
    return None if not names or None in names else {n for n in names if n is not None}


def _window(start: str | None, end: str | None) -> tuple[float | None, float | None]:
    lo = None if start is None else parse_time("start", start)
    hi = None if end is None else parse_time("end", end)
    if lo is not None and hi is not None and hi < lo:
        raise bad_param("end", "end timestamp must not be before start time")
    return lo, hi


def prom_router() -> APIRouter:
    router = APIRouter(prefix="/api/v1", tags=["prometheus"])

    def deps(request: Request) -> tuple[Store, ReadPool, ApiConfig]:
        state = request.app.state
        return state.store, state.pool, state.api

    @router.get("/series")
    async def series(
        request: Request,
        match: Match = None,
        start: Time = None,
        end: Time = None,
        limit: int | None = None,
        after: After = None,
        name: Annotated[str | None, Query(max_length=200, description="deprecated: use "
                                          "match[]")] = None,
        target: Annotated[str | None, Query(max_length=200)] = None,
    ) -> Response:
        store, pool, settings = deps(request)
        n = page_limit(settings, limit)
        sels = selectors(match, required=name is None and target is None)
        lo, hi = _window(start, end)
        cursor = None
        if after is not None:
            parts = decode_token("after", after)
            if (len(parts) != 3 or not isinstance(parts[0], str)
                    or not isinstance(parts[1], str) or not isinstance(parts[2], dict)
                    or not all(isinstance(v, str) for v in parts[2].values())):
                raise bad_param("after", "not a page token of /api/v1/series")
            cursor = SeriesKey(parts[0], parts[1], make_labels(parts[2]))
        names = _names(sels) if sels else ({name} if name is not None else None)
        keys = await pool.run(
            store.series_page, StoreQuery(
                names=names, target=target, where=predicate(sels) if sels else None, start=lo,
                end=hi, max_samples=settings.max_samples), after=cursor, limit=n + 1)
        more = len(keys) > n
        keys = keys[:n]
        data = [{"__name__": k.name, "target": k.target, **dict(k.labels)} for k in keys]
        response = success(data, [truncated(n)] if more else None)
        if more:
            last = keys[-1]
            link_next(request, response, n, encode_token([last.target, last.name,
                                                          dict(last.labels)]))
        return response

    async def _label_scan(request: Request, match: list[str] | None, start: str | None,
                          end: str | None) -> list[SeriesKey]:
        store, pool, settings = deps(request)
        sels = selectors(match, required=False)
        lo, hi = _window(start, end)
        found: list[SeriesKey] = await pool.run(
            store.series_page, StoreQuery(
                names=_names(sels), where=predicate(sels) if sels else None, start=lo, end=hi,
                max_samples=settings.max_samples))
        return found

    @router.get("/labels")
    async def labels(
        request: Request, match: Match = None, start: Time = None, end: Time = None,
        limit: int | None = None,
    ) -> Response:
        n = page_limit(request.app.state.api, limit)
        keys = await _label_scan(request, match, start, end)
        names = sorted({"__name__", "target"} | {k for key in keys for k, _ in key.labels}
                       if keys else set())
        return success(names[:n], [truncated(n)] if len(names) > n else None)

    @router.get("/label/{label}/values")
    async def label_values(
        request: Request, label: Annotated[str, Path(max_length=200)],
        match: Match = None, start: Time = None, end: Time = None, limit: int | None = None,
    ) -> Response:
        n = page_limit(request.app.state.api, limit)
        keys = await _label_scan(request, match, start, end)
        values: set[str] = set()
        for key in keys:
            if label == "__name__":
                values.add(key.name)
            elif label == "target":
                values.add(key.target)
            else:
                values.update(v for k, v in key.labels if k == label)
        found = sorted(values)
        return success(found[:n], [truncated(n)] if len(found) > n else None)

    @router.get("/status/buildinfo")
    async def buildinfo() -> Response:
        return success({"version": build_version(), "revision": "", "branch": "",
                        "buildUser": "", "buildDate": "",
                        "goVersion": f"python{platform.python_version()}"})

    @router.get("/query_range")
    async def query_range(
        request: Request,
        query: Annotated[str | None, Query(max_length=10_000)] = None,
        start: Time = None,
        end: Time = None,
        step: Annotated[str, Query(max_length=64)] = "60",
        name: Annotated[str | None, Query(max_length=200, description="deprecated: use "
                                          "query")] = None,
        agg: Literal["avg", "min", "max", "sum", "last", "count"] = "avg",
        target: Annotated[str | None, Query(max_length=200)] = None,
    ) -> Response:
        store, pool, settings = deps(request)
        if query is None and name is None:
            raise bad_param("query", "no query parameter provided")
        t_start = None if start is None else parse_time("start", start)
        t_end = time.time() if end is None else parse_time("end", end)
        t_start = t_end - 3600.0 if t_start is None else t_start
        seconds = parse_step("step", step)
        check_resolution(t_start, t_end, seconds)
        if query is None:
            assert name is not None
            return await _legacy(pool, store, settings, name, t_start, t_end, seconds, agg,
                                 target)
        parsed = parse_query(query)
        sel = parsed.selector
        times = grid(t_start, t_end, seconds)

        def read() -> bytes:
            cols = store.read(StoreQuery(
                start=t_start - window_s(parsed), end=t_end, names=_names([sel]),
                target=sel.target, where=predicate([sel]), max_series=settings.max_series,
                max_samples=settings.max_samples))
            return matrix_json(evaluate(parsed, cols, times))

        return Response(await pool.run(read), media_type="application/json")

    return router


async def _legacy(pool: ReadPool, store: Store, settings: ApiConfig, name: str, start: float,
                  end: float, step: float, agg: str, target: str | None) -> Response:
    """``name=&agg=``: buckets of one series name (rollups for 5 m / 1 h multiples)."""
    def read() -> bytes:
        cols = store.read(StoreQuery(name, start=start, end=end, step=step,
                                     agg=agg,  # type: ignore[arg-type]
                                     target=target, max_series=settings.max_series,
                                     max_samples=settings.max_samples))
        bounds = cols.bounds.tolist()
        return matrix_json(
            ({"__name__": k.name, "target": k.target, **dict(k.labels)},
             cols.ts[bounds[i]:bounds[i + 1]].tolist(),
             cols.values[bounds[i]:bounds[i + 1]].tolist())
            for i, k in enumerate(cols.keys))

    return Response(await pool.run(read), media_type="application/json")

