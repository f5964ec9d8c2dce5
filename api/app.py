"""The HTTP API: health, Tritonwatch's own /metrics, and read access to the store.

Routes stay thin: they validate parameters, call one store method, and shape the answer
with response models that are separate from the tables.  HTTPException is raised only here.
"""

from __future__ import annotations

import time
from typing import Annotated, Literal

from fastapi import Depends, FastAPI, HTTPException, Query, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from pydantic import BaseModel

from tritonwatch.api.receiver import receiver_router
from tritonwatch.api.reports import reports_router
from tritonwatch.schemas.alerting import AlertingConfig
from tritonwatch.store import QueryError, Store
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
    points: list[tuple[float, float]]


def get_store(request: Request) -> Store:
    store: Store = request.app.state.store
    return store


StoreDep = Annotated[Store, Depends(get_store)]


def create_app(
    store: Store,
    *,
    registry: CollectorRegistry | None = None,
    alerting: AlertingConfig | None = None,
) -> FastAPI:
    app = FastAPI(title="Tritonwatch", version="0.1.0")
    app.state.store = store
    app.state.registry = registry or CollectorRegistry()
    if alerting is not None and alerting.receiver is not None:
        # POST /api/v1/alertmanager/webhook (api/receiver.py); absent unless configured.
        app.include_router(receiver_router(alerting.receiver, AlertStore(store)))

    app.include_router(reports_router())  # /api/v1/reports (api/reports.py)

    @app.get("/healthz")
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/metrics", include_in_schema=False)
    def metrics(request: Request) -> Response:
        return Response(generate_latest(request.app.state.registry),
                        media_type=CONTENT_TYPE_LATEST)

    @app.get("/api/v1/targets", response_model=list[TargetHealthOut])
    def targets(store: StoreDep) -> list[TargetHealthOut]:
        return [TargetHealthOut(**h._asdict()) for h in store.health()]

    @app.get("/api/v1/series", response_model=list[SeriesOut])
    def series(
        store: StoreDep,
        name: Annotated[str | None, Query(max_length=200)] = None,
        target: Annotated[str | None, Query(max_length=200)] = None,
    ) -> list[SeriesOut]:
        return [
            SeriesOut(target=k.target, name=k.name, labels=dict(k.labels))
            for k in store.series(name, target=target)
        ]

    @app.get("/api/v1/query_range", response_model=list[RangeOut])
    def query_range(
        store: StoreDep,
        name: Annotated[str, Query(min_length=1, max_length=200)],
        start: float | None = None,
        end: float | None = None,
        step: Annotated[float, Query(gt=0)] = 60.0,
        agg: Literal["avg", "min", "max", "sum", "last", "count"] = "avg",
        target: Annotated[str | None, Query(max_length=200)] = None,
    ) -> list[RangeOut]:
        end = time.time() if end is None else end
        start = end - 3600.0 if start is None else start
        if end <= start:
            raise HTTPException(400, "end must be after start")
        if (end - start) / step > 11_000:
            raise HTTPException(400, "too many points: raise step or shorten the range")
        try:
            rows = store.buckets(name, start=start, end=end, step=step, agg=agg, target=target)
        except QueryError as exc:
            raise HTTPException(400, str(exc)) from None
        return [
            RangeOut(target=r.target, name=r.name, labels=dict(r.labels),
                     points=list(zip(r.ts, r.values, strict=True)))
            for r in rows
        ]

    return app
