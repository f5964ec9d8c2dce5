"""The store's small tables: target health, model configs and probe results, as statements.

``Store`` buffers health and probe rows like samples (``store.buffer``) and runs these in its
transactions; nothing here holds state.  Texts a target or a model server wrote (error
messages, codes) go through ``db_text``: one NUL byte in them made PostgreSQL refuse the whole
health transaction, every flush, so every target's health froze.  Names come from the validated
configuration.
"""

from __future__ import annotations

import json
from collections.abc import Container, Mapping
from contextlib import closing
from typing import Any

from sqlalchemy import Connection, Select, literal, select, tuple_

from tritonwatch.schemas import tables as t
from tritonwatch.schemas.probes import ProbeResult
from tritonwatch.schemas.samples import TargetHealth
from tritonwatch.schemas.untrusted import db_text
from tritonwatch.store.write import dialect_insert

#: Where a (target, source) was up last: what decides whether a health row is a flip.
HealthUp = dict[tuple[str, str], bool]

_HEALTH_UPDATED = ("ts", "up", "duration_s", "samples", "error")


def probe_row(r: ProbeResult) -> dict[str, Any]:
    return {
        "probe": r.probe, "target": r.target, "model": r.model, "protocol": r.protocol,
        "ts": round(r.ts * 1000), "ok": r.ok, "tokens": r.tokens, "ttft_s": r.ttft_s,
        "itl_s": r.itl_s, "tpot_s": r.tpot_s, "e2e_s": r.e2e_s, "tokens_per_s": r.tokens_per_s,
        "error_kind": r.error_kind, "error_code": db_text(r.error_code, 200),
        "error_message": db_text(r.error_message), "request_id": db_text(r.request_id, 200),
    }


def _health_row(h: TargetHealth) -> dict[str, Any]:
    return {
        "target": h.target, "source": h.source, "ts": round(h.ts * 1000), "up": h.up,
        "duration_s": h.duration_s, "samples": h.samples, "error": db_text(h.error),
    }


def write_health(conn: Connection, pending: list[TargetHealth], known: HealthUp | None) -> HealthUp:
    """Upsert each (target, source)'s latest row and log its up/down flips; returns where each
    is up now (``known``: what the last call returned, None to read it)."""
    th, thl = t.target_health, t.target_health_log
    if known is None:
        known = {
            (r.target, r.source): bool(r.up)
            for r in conn.execute(select(th.c.target, th.c.source, th.c.up))
        }
    known = dict(known)
    latest: dict[tuple[str, str], dict[str, Any]] = {}
    flips: list[dict[str, Any]] = []
    for h in pending:
        values = _health_row(h)
        key = (h.target, h.source)
        prev = known.get(key)
        if prev is None or prev != h.up:
            flips.append(values)
        known[key] = h.up
        latest[key] = values
    stmt = dialect_insert(conn, th)
    conn.execute(
        stmt.on_conflict_do_update(
            index_elements=[th.c.target, th.c.source],
            set_={k: stmt.excluded[k] for k in _HEALTH_UPDATED},
        ),
        list(latest.values()),
    )
    if flips:
        conn.execute(dialect_insert(conn, thl).on_conflict_do_nothing(), flips)
    return known


def health_stmt(after: tuple[str, str] | None) -> Select[Any]:
    th = t.target_health
    stmt = select(th).order_by(th.c.target, th.c.source)
    if after is not None:
        stmt = stmt.where(tuple_(th.c.target, th.c.source)
                          > tuple_(literal(after[0]), literal(after[1])))
    return stmt


def health_log_stmt(target: str | None, since: float | None) -> Select[Any]:
    thl = t.target_health_log
    stmt = select(thl).order_by(thl.c.ts, thl.c.target, thl.c.source)
    if target is not None:
        stmt = stmt.where(thl.c.target == target)
    if since is not None:
        stmt = stmt.where(thl.c.ts >= round(since * 1000))
    return stmt


def read_health(
    conn: Connection, stmt: Select[Any], *, targets: Container[str] | None, limit: int | None,
) -> list[TargetHealth]:
    out: list[TargetHealth] = []
    # Streamed and cut at ``limit``: the table keeps every target ever scraped.
    with closing(conn.execute(stmt.execution_options(yield_per=1000))) as rows:
        for r in rows:
            if targets is not None and r.target not in targets:
                continue
            out.append(TargetHealth(r.target, r.source, r.ts / 1000, bool(r.up),
                                    r.duration_s, r.samples, r.error))
            if limit is not None and len(out) >= limit:
                break
    return out


def put_model_config(
    conn: Connection, target: str, model: str, config: Mapping[str, Any], fetched_at: float
) -> None:
    mc = t.model_configs
    values = {
        "target": target,
        "model": model,
        "fetched_at": round(fetched_at * 1000),
        "config": json.dumps(config, sort_keys=True, separators=(",", ":")),
    }
    stmt = dialect_insert(conn, mc).values(**values)
    # The same config written again keeps its time: ``fetched_at`` is when this content was
    # first seen, so a collector restart (which writes every config it reads) is not a config
    # change to the regression rules' deploy events (alerts/baseline.py).
    conn.execute(
        stmt.on_conflict_do_update(
            index_elements=[mc.c.target, mc.c.model],
            set_={"fetched_at": stmt.excluded.fetched_at, "config": stmt.excluded.config},
            where=mc.c.config != stmt.excluded.config,
        )
    )


def model_configs(
    conn: Connection, target: str | None, *, times: bool = False
) -> dict[tuple[str, str], Any]:
    """``{(target, model): config}`` (``times``: ``fetched_at`` instead of the config)."""
    mc = t.model_configs
    stmt = select(mc.c.target, mc.c.model, mc.c.fetched_at if times else mc.c.config)
    if target is not None:
        stmt = stmt.where(mc.c.target == target)
    if times:
        return {(r.target, r.model): r.fetched_at / 1000 for r in conn.execute(stmt)}
    return {(r.target, r.model): json.loads(r.config) for r in conn.execute(stmt)}


def probe_results(
    conn: Connection, *, probe: str | None, start: float | None, end: float | None,
    limit: int, newest_first: bool,
) -> list[ProbeResult]:
    tbl = t.probe_results
    stmt = select(tbl)
    if probe is not None:
        stmt = stmt.where(tbl.c.probe == probe)
    if start is not None:
        stmt = stmt.where(tbl.c.ts >= round(start * 1000))
    if end is not None:
        stmt = stmt.where(tbl.c.ts <= round(end * 1000))
    order = (tbl.c.ts.desc(), tbl.c.id.desc()) if newest_first else (tbl.c.ts, tbl.c.id)
    stmt = stmt.order_by(*order).limit(limit)
    return [
        ProbeResult(
            probe=r.probe, target=r.target, model=r.model, protocol=r.protocol,
            ts=r.ts / 1000, ok=bool(r.ok), tokens=r.tokens, ttft_s=r.ttft_s,
            itl_s=r.itl_s, tpot_s=r.tpot_s, e2e_s=r.e2e_s, error_kind=r.error_kind,
            error_code=r.error_code, error_message=r.error_message,
            request_id=r.request_id,
        )
        for r in conn.execute(stmt)
    ]
