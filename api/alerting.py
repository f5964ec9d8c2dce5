"""Alert, rule, SLO and probe state in Prometheus's shapes: ``/api/v1/alerts``,
``/api/v1/rules``, ``/api/v1/slos`` and ``/api/v1/probes``.

The first three answer from memory (the alert engine and the SLO board of :mod:`api.exporter`'s
:class:`~api.exporter.Live`); a process without an engine answers empty lists.

- ``/api/v1/alerts``: ``{"alerts": [{labels, annotations, state, activeAt, value}]}``, pending
  and firing, as Prometheus.
- ``/api/v1/rules[?rule_name[]=X&type=alert]``: one group ``tritonwatch`` with every rule's
  ``state`` (inactive, pending, firing), ``health`` (ok, err, unknown before its first
  evaluation), ``lastError``, ``lastEvaluation``, ``evaluationTime``, ``duration``,
  ``keepFiringFor`` and its active alerts.  The ``generatorURL`` of every alert sent to
  Alertmanager points here (``<alerting.external_url>/api/v1/rules?rule_name[]=<rule>``).
- ``/api/v1/slos``: every SLO's latest status (per ``by`` group), refreshed after an evaluation
  at most every minute.
- ``/api/v1/probes?probe=&since=&limit=``: the latest synthetic probe requests, newest first.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request, Response

from tritonwatch.api.errors import bad_param
from tritonwatch.api.exporter import Live
from tritonwatch.api.params import parse_time
from tritonwatch.api.prom import page_limit, success, truncated
from tritonwatch.api.render import format_value
from tritonwatch.schemas.alerts import AlertState


def rfc3339(ts: float | None) -> str:
    if ts is None:
        return "0001-01-01T00:00:00Z"  # Go's zero time, as Prometheus writes "never"
    return datetime.fromtimestamp(ts, UTC).isoformat().replace("+00:00", "Z")


def _alert(s: AlertState) -> dict[str, Any]:
    return {"labels": dict(s.labels), "annotations": dict(s.annotations), "state": s.status,
            "activeAt": rfc3339(s.active_since), "value": format_value(s.value)}


def describe(rule: Any) -> str:
    """A rule's condition, written as close to PromQL as it goes (``query`` of the rule)."""
    spec = getattr(rule, "spec", None)
    slo = getattr(rule, "slo", None)
    if slo is not None:
        return (f"slo {slo.name}: error budget burn over the multiwindow tiers "
                f"(objective {slo.objective * 100:g} % over {slo.window})")
    if spec is not None and hasattr(spec, "op") and hasattr(spec, "series"):
        return (f"{spec.agg}_over_time({spec.series}[{spec.window:g}s]) {spec.op} "
                f"{spec.threshold:g}")
    if spec is not None and hasattr(spec, "series"):
        return f"regression of {spec.series}"
    return f"built-in rule {rule.name}"


def alerting_router() -> APIRouter:
    router = APIRouter(prefix="/api/v1", tags=["alerts"])

    def live(request: Request) -> Live:
        found: Live = request.app.state.live
        return found

    @router.get("/alerts")
    async def alerts(request: Request) -> Response:
        engine = live(request).engine
        states = [] if engine is None else engine.states()
        return success({"alerts": [_alert(s) for s in states
                                   if s.status in ("pending", "firing")]})

    @router.get("/rules")
    async def rules(
        request: Request,
        rule_name: Annotated[list[str] | None, Query(alias="rule_name[]", max_length=100)] = None,
        type: Annotated[str | None, Query(max_length=10)] = None,
    ) -> Response:
        if type not in (None, "alert", "record"):
            raise bad_param("type", f"must be alert or record, got {type[:10]!r}")
        engine = live(request).engine
        if engine is None or type == "record":
            return success({"groups": []})
        wanted = set(rule_name or ())
        by_rule: dict[str, list[AlertState]] = {}
        for s in engine.states():
            if s.status in ("pending", "firing"):
                by_rule.setdefault(s.rule, []).append(s)
        out: list[dict[str, Any]] = []
        last = 0.0
        took = 0.0
        for rule in engine.rules:
            if wanted and rule.name not in wanted:
                continue
            active = by_rule.get(rule.name, [])
            run = engine.runs.get(rule.name)
            state = ("firing" if any(a.status == "firing" for a in active)
                     else "pending" if active else "inactive")
            out.append({
                "state": state, "name": rule.name, "query": describe(rule),
                "duration": rule.for_s, "keepFiringFor": rule.keep_firing_for_s,
                "labels": {}, "annotations": {}, "alerts": [_alert(a) for a in active],
                "health": "unknown" if run is None else "ok" if run.error is None else "err",
                "lastError": "" if run is None or run.error is None else run.error,
                "evaluationTime": 0.0 if run is None else run.duration_s,
                "lastEvaluation": rfc3339(None if run is None else run.at),
                "type": "alerting",
            })
            if run is not None:
                last = max(last, run.at)
                took += run.duration_s
        group = {"name": "tritonwatch", "file": "tritonwatch", "rules": out,
                 "interval": engine.eval_interval, "limit": 0,
                 "evaluationTime": took,
                 "lastEvaluation": rfc3339(last or None)}
        return success({"groups": [group] if out or not wanted else []})

    @router.get("/slos")
    async def slos(request: Request) -> Response:
        board = live(request).slos
        data = []
        for entry in [] if board is None else board.entries():
            slo = entry.slo
            data.append({
                "name": slo.name, "description": slo.description, "objective": slo.objective,
                "window": slo.window, "sli": slo.sli.kind, "refreshedAt": rfc3339(
                    entry.refreshed_at) if entry.refreshed_at else None,
                "error": entry.error,
                "statuses": [{
                    "group": dict(s.group), "good": s.good, "total": s.total,
                    "sli": s.compliance, "errorBudgetRemaining": s.remaining,
                    "errorBudgetConsumed": s.consumed, "burnRate": s.current_burn,
                    "burnWindowSeconds": s.burn_window_s,
                    "exhaustionInSeconds": s.exhaustion_in_s, "met": s.met,
                    "page": s.page, "ticket": s.ticket,
                    "tiers": [{"name": t.name, "severity": t.severity, "factor": t.factor,
                               "longBurn": t.long_burn, "shortBurn": t.short_burn,
                               "firing": t.firing} for t in s.tiers],
                } for s in entry.statuses],
            })
        return success(data)

    @router.get("/probes")
    async def probes(
        request: Request,
        probe: Annotated[str | None, Query(max_length=200)] = None,
        since: Annotated[str | None, Query(max_length=64)] = None,
        limit: int | None = None,
    ) -> Response:
        settings = request.app.state.api
        n = page_limit(settings, limit)
        start = time.time() - 3600.0 if since is None else parse_time("since", since)
        rows = await request.app.state.pool.run(
            request.app.state.store.probe_results, probe=probe, start=start, limit=n + 1,
            newest_first=True)
        newest = list(rows)
        data = [{"probe": r.probe, "target": r.target, "model": r.model,
                 "protocol": r.protocol, "ts": r.ts, "ok": r.ok, "tokens": r.tokens,
                 "ttft_s": r.ttft_s, "itl_s": r.itl_s, "tpot_s": r.tpot_s, "e2e_s": r.e2e_s,
                 "error_kind": r.error_kind, "error_code": r.error_code,
                 "error_message": r.error_message} for r in newest[:n]]
        return success(data, [truncated(n)] if len(newest) > n else None)  # newest n

    return router
