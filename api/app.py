"""The HTTP API: health, Tritonwatch's own /metrics, and read access to the store.

Routes stay thin: they validate parameters, call one store method, and shape the answer
with response models that are separate from the tables.  Errors are raised as exceptions and
answered by :mod:`api.errors` (400 naming the parameter, 422 over a limit, 503 when the store
is down or the read pool is full).

- /healthz answers from memory on the event loop, and /metrics from the registry: neither
  touches the database nor waits for a thread (:mod:`api.pool`).
- Every store read runs in the API's :class:`~api.pool.ReadPool`.
- List answers (series, targets) take ``limit`` (default ``api.default_limit``, at most
  ``api.max_limit``) and ``after``, a page token.  A page cut short by its limit says so in
  a ``Warning`` header and links the next page (``Link: <...>; rel="next"``); the store reads
  one page (``LIMIT`` in SQL), never the whole catalogue.
- ``query_range`` refuses more than 11,000 points per series (400), more than
  ``api.max_series`` series or ``api.max_samples`` samples read (422, before reading them).
- ``api.token`` guards writes, and reads too with ``api.auth_reads`` (:mod:`api.auth`).
"""

from __future__ import annotations

import time
from collections.abc import Collection
from typing import Annotated, Literal

from fastapi import Depends, FastAPI, Query, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from pydantic import BaseModel
from starlette.datastructures import URL

from tritonwatch.api.auth import TokenAuth
from tritonwatch.api.errors import bad_param, install_error_handlers
from tritonwatch.api.exporter import Live, install_exporter
from tritonwatch.api.params import (
    check_resolution,
    decode_token,
    encode_token,
    parse_step,
    parse_time,
)
from tritonwatch.api.pool import ReadPool
from tritonwatch.api.receiver import WEBHOOK_PATH, receiver_router
from tritonwatch.api.render import range_json
from tritonwatch.api.reports import reports_router
from tritonwatch.schemas.alerting import AlertingConfig
from tritonwatch.schemas.config import ApiConfig
from tritonwatch.schemas.samples import make_labels
from tritonwatch.store import SeriesKey, Store
from tritonwatch.store.alerts import AlertStore


class TargetHealthOut(BaseModel):
    target: str
    source: str
    ts: float
    up: bool
    duration_s: float
    samples: int
    error: str | None


class SeriesOut(BaseModel):
    target: str
    name: str
    labels: dict[str, str]


class RangeOut(SeriesOut):
    points: list[tuple[float, str]]
    """``[unix seconds, value]``; values are strings as in Prometheus (``"+Inf"``, ``"NaN"``)."""


def get_store(request: Request) -> Store:
    store: Store = request.app.state.store
    return store


def get_pool(request: Request) -> ReadPool:
    pool: ReadPool = request.app.state.pool
    return pool


def get_settings(request: Request) -> ApiConfig:
    settings: ApiConfig = request.app.state.api
    return settings


StoreDep = Annotated[Store, Depends(get_store)]
PoolDep = Annotated[ReadPool, Depends(get_pool)]
SettingsDep = Annotated[ApiConfig, Depends(get_settings)]
Name = Annotated[str | None, Query(max_length=200)]
After = Annotated[str | None, Query(max_length=8_192, description="page token from the "
                                    'Link rel="next" of the previous page')]


def _limit(settings: ApiConfig, limit: int | None) -> int:
    if limit is None:
        return settings.default_limit
    if not 1 <= limit <= settings.max_limit:
        raise bad_param("limit", f"must be between 1 and {settings.max_limit} (api.max_limit)")
    return limit


def _mark_truncated(request: Request, response: Response, limit: int, token: str) -> None:
    """Tell the client its page stopped at ``limit`` and where the next one starts."""
    next_url = URL(str(request.url)).include_query_params(after=token, limit=limit)
    response.headers["Link"] = f'<{next_url.path}?{next_url.query}>; rel="next"'
    response.headers["Warning"] = f'299 tritonwatch "results truncated due to limit {limit}"'


def create_app(
    store: Store,
    *,
    registry: CollectorRegistry | None = None,
    alerting: AlertingConfig | None = None,
    api: ApiConfig | None = None,
    targets: Collection[str] | None = None,
    live: Live | None = None,
) -> FastAPI:
    """The API over ``store``.  ``targets``: the names this process collects from, the only
    ones /api/v1/targets lists (the store keeps the health of targets removed from the
    configuration); ``None`` lists every target in the store."""
    settings = api or ApiConfig()
    app = FastAPI(title="Tritonwatch", version="0.1.0")
    app.state.store = store
    app.state.registry = registry or CollectorRegistry()
    app.state.api = settings
    app.state.pool = ReadPool(settings.read_workers, settings.read_queue,
                              registry=app.state.registry)
    configured = None if targets is None else frozenset(targets)
    app.state.live = live or Live()
    install_exporter(app.state.registry, app.state.live,
                     max_series=settings.max_exported_series)
    install_error_handlers(app)
    self_authenticated = []
    if alerting is not None and alerting.receiver is not None:
        # POST /api/v1/alertmanager/webhook (api/receiver.py); absent unless configured.
        app.include_router(receiver_router(alerting.receiver, AlertStore(store)))
        self_authenticated.append(WEBHOOK_PATH)
    app.add_middleware(TokenAuth, token=settings.token, auth_reads=settings.auth_reads,
                       self_authenticated=self_authenticated)

    app.include_router(reports_router())  # /api/v1/reports (api/reports.py)

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/metrics", include_in_schema=False)
    async def metrics(request: Request) -> Response:
        return Response(generate_latest(request.app.state.registry),
                        media_type=CONTENT_TYPE_LATEST)

    @app.get("/api/v1/targets", response_model=list[TargetHealthOut])
    async def list_targets(
        request: Request,
        response: Response,
        store: StoreDep,
        pool: PoolDep,
        settings: SettingsDep,
        limit: int | None = None,
        after: After = None,
    ) -> list[TargetHealthOut]:
        n = _limit(settings, limit)
        start = None
        if after is not None:
            parts = decode_token("after", after)
            if len(parts) != 2 or not all(isinstance(p, str) for p in parts):
                raise bad_param("after", "not a page token of /api/v1/targets")
            start = (str(parts[0]), str(parts[1]))
        rows = await pool.run(store.health, targets=configured, after=start, limit=n + 1)
        if len(rows) > n:
            rows = rows[:n]
            _mark_truncated(request, response, n, encode_token([rows[-1].target,
                                                                rows[-1].source]))
        return [TargetHealthOut(**h._asdict()) for h in rows]

    @app.get("/api/v1/series", response_model=list[SeriesOut])
    async def series(
        request: Request,
        response: Response,
        store: StoreDep,
        pool: PoolDep,
        settings: SettingsDep,
        name: Name = None,
        target: Name = None,
        limit: int | None = None,
        after: After = None,
    ) -> list[SeriesOut]:
        n = _limit(settings, limit)
        start = None
        if after is not None:
            parts = decode_token("after", after)
            if (len(parts) != 3 or not isinstance(parts[0], str)
                    or not isinstance(parts[1], str) or not isinstance(parts[2], dict)
                    or not all(isinstance(v, str) for v in parts[2].values())):
                raise bad_param("after", "not a page token of /api/v1/series")
            start = SeriesKey(parts[0], parts[1], make_labels(parts[2]))
        keys = await pool.run(store.series_page, name, target=target, after=start,
                              limit=n + 1)
        if len(keys) > n:
            keys = keys[:n]
            last = keys[-1]
            _mark_truncated(request, response, n,
                            encode_token([last.target, last.name, dict(last.labels)]))
        return [SeriesOut(target=k.target, name=k.name, labels=dict(k.labels)) for k in keys]

    @app.get("/api/v1/query_range", response_model=list[RangeOut])
    async def query_range(
        store: StoreDep,
        pool: PoolDep,
        settings: SettingsDep,
        name: Annotated[str, Query(min_length=1, max_length=200)],
        start: Annotated[str | None, Query(max_length=64)] = None,
        end: Annotated[str | None, Query(max_length=64)] = None,
        step: Annotated[str, Query(max_length=64)] = "60",
        agg: Literal["avg", "min", "max", "sum", "last", "count"] = "avg",
        target: Name = None,
    ) -> Response:
        t_start = None if start is None else parse_time("start", start)
        t_end = time.time() if end is None else parse_time("end", end)
        t_start = t_end - 3600.0 if t_start is None else t_start
        seconds = parse_step("step", step)
        check_resolution(t_start, t_end, seconds)

        def read() -> bytes:
            # Read and encode in the read thread: a large answer must not hold the event loop.
            cols = store.bucket_columns(
                name, start=t_start, end=t_end, step=seconds, agg=agg, target=target,
                max_series=settings.max_series, max_samples=settings.max_samples)
            return range_json(cols)

        return Response(await pool.run(read), media_type="application/json")

    return app
