"""``/api/v1/reports``: the weekly reports kept in the store, listed and fetched.

``GET /api/v1/reports[?week=2026-W48&limit=N]`` lists them newest first (summary included), in
the API's ``{"status": "success", "data": [...]}`` envelope;
``GET /api/v1/reports/{id}?format=html|md|json`` returns one rendering exactly as it was kept
(HTML by default, the self-contained document a browser opens).
"""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, HTTPException, Query, Request, Response

from tritonwatch.api.prom import success
from tritonwatch.store import Store
from tritonwatch.store.reports import ReportStore

_MEDIA = {"html": "text/html; charset=utf-8", "md": "text/markdown; charset=utf-8",
          "json": "application/json"}


def reports_router() -> APIRouter:
    router = APIRouter(prefix="/api/v1/reports", tags=["reports"])

    def _reports(request: Request) -> ReportStore:
        store: Store = request.app.state.store
        return ReportStore(store)

    # Reads go through the API's bounded read pool (api/pool.py), as every other store read does:
    # a frozen database then costs a fast 503, not the shared thread pool.
    @router.get("")
    async def list_reports(
        request: Request,
        week: Annotated[str | None, Query(max_length=10, pattern=r"^\d{4}-W\d{2}$")] = None,
        limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    ) -> Response:
        rows = await request.app.state.pool.run(_reports(request).list, week=week, limit=limit)
        # A row as it is kept (``store.reports.StoredReport``): its fields are the JSON's.
        return success([r._asdict() for r in rows])

    @router.get("/{report_id}")
    async def get_report(
        request: Request, report_id: int,
        format: Literal["html", "md", "json"] = "html",
    ) -> Response:
        text = await request.app.state.pool.run(_reports(request).document, report_id, format)
        if text is None:
            raise HTTPException(404, f"no report with id {report_id}")
        return Response(text, media_type=_MEDIA[format])

    return router
