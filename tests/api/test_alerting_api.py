"""/api/v1/alerts, /api/v1/rules, /api/v1/slos and /api/v1/probes (api/alerting.py) through
uvicorn, and the generatorURL of a sent alert answering 200."""

from __future__ import annotations

import yaml

from tests.api.test_exporter import RULES, T0, fill_store
from tests.api.test_prom_api import ok, served
from tritonwatch.alerts.engine import Engine
from tritonwatch.alerts.notify.dispatch import Dispatcher
from tritonwatch.alerts.rules import SloBurnRule, rules_from_file
from tritonwatch.alerts.status import SloBoard
from tritonwatch.api.app import create_app
from tritonwatch.api.exporter import Live
from tritonwatch.schemas.alerts import AlertCandidate
from tritonwatch.schemas.probes import ProbeResult
from tritonwatch.schemas.rules import validate_rules
from tritonwatch.store import Store


class BrokenRule:
    """A rule whose query fails (its health is "err")."""

    name = "Broken"
    for_s = 0.0
    keep_firing_for_s = 0.0

    def evaluate(self, store: Store, now: float) -> list[AlertCandidate]:
        raise RuntimeError("the store said no")


def engine_and_board(store: Store) -> tuple[Engine, SloBoard]:
    fill_store(store)
    rules = [*rules_from_file(validate_rules(yaml.safe_load(RULES))), BrokenRule()]
    engine = Engine(rules, store, eval_interval=30, clock=lambda: T0)
    engine.evaluate(T0)
    board = SloBoard([r.slo for r in rules if isinstance(r, SloBurnRule)])
    board.refresh(store, T0)
    return engine, board


def test_alerts_and_rules_in_prometheus_shapes(store: Store):
    engine, board = engine_and_board(store)
    with served(create_app(store, live=Live(engine=engine, slos=board))) as api:
        alerts = ok(api.get("/api/v1/alerts"))["alerts"]
        fill = next(a for a in alerts if a["labels"]["alertname"] == "FillRateLow")
        assert fill["state"] == "firing" and fill["value"] == "0.5"
        assert fill["annotations"]["summary"] == "fill rate 0.5"
        assert fill["activeAt"] == "2023-11-14T22:13:20Z"
        [group] = ok(api.get("/api/v1/rules"))["groups"]
        assert group["interval"] == 30 and group["lastEvaluation"] == "2023-11-14T22:13:20Z"
        rules = {r["name"]: r for r in group["rules"]}
        assert set(rules) == {"batcher-availability", "FillRateLow", "Broken"}
        fr = rules["FillRateLow"]
        assert (fr["state"], fr["health"], fr["type"], fr["lastError"]) == (
            "firing", "ok", "alerting", "")
        assert fr["query"] == "last_over_time(sli:batch_fill_rate[300s]) < 0.9"
        assert [a["labels"]["model"] for a in fr["alerts"]] == ["batcher"]
        assert rules["Broken"]["health"] == "err"
        assert rules["Broken"]["lastError"] == "RuntimeError: the store said no"
        assert rules["Broken"]["state"] == "inactive"
        one = ok(api.get("/api/v1/rules", params={"rule_name[]": "Broken"}))["groups"]
        assert [r["name"] for r in one[0]["rules"]] == ["Broken"]
        assert ok(api.get("/api/v1/rules", params={"type": "record"})) == {"groups": []}
        r = api.get("/api/v1/rules", params={"type": "bogus"})
        assert r.status_code == 400 and '"type"' in r.json()["error"]


def test_the_generator_url_of_a_sent_alert_is_a_page_that_exists(store: Store):
    engine, board = engine_and_board(store)
    with served(create_app(store, live=Live(engine=engine, slos=board))) as api:
        dispatcher = Dispatcher([], eval_interval=30, external_url=str(api.base_url).rstrip("/"))
        firing = [s for s in engine.states() if s.status == "firing"]
        assert firing
        for state in firing:
            url = dispatcher.outgoing(state, T0).generator_url
            assert url is not None
            r = api.get(url)
            [group] = ok(r)["groups"]
            assert [rule["name"] for rule in group["rules"]] == [state.rule]
            assert group["rules"][0]["state"] == "firing"


def test_slos_answer_every_slo_status(store: Store):
    engine, board = engine_and_board(store)
    with served(create_app(store, live=Live(engine=engine, slos=board))) as api:
        [slo] = ok(api.get("/api/v1/slos"))
        assert (slo["name"], slo["objective"], slo["sli"]) == ("batcher-availability", 0.99,
                                                               "availability")
        [status] = slo["statuses"]
        assert status["group"] == {"model": "batcher"}
        assert status["sli"] == 0.9 and status["met"] is False and status["page"] is True
        assert round(status["errorBudgetRemaining"], 6) == -9.0
        assert {t["name"] for t in status["tiers"]} == {"page-1h", "page-6h", "ticket-1d",
                                                       "ticket-3d"}


def test_probes_answer_the_latest_runs_newest_first(store: Store):
    import time

    now = time.time()
    store.write_probe_results([
        ProbeResult("p", "rig", "llm", "grpc", now - 30 + i, ok=i != 3, tokens=16,
                    ttft_s=0.04, error_kind=None if i != 3 else "timeout")
        for i in range(5)])
    store.flush()
    with served(create_app(store)) as api:
        rows = ok(api.get("/api/v1/probes", params={"probe": "p"}))
        assert [r["ts"] for r in rows] == sorted((r["ts"] for r in rows), reverse=True)
        assert len(rows) == 5 and rows[1]["error_kind"] == "timeout" and not rows[1]["ok"]
        r = api.get("/api/v1/probes", params={"limit": 2})
        assert [x["ts"] for x in ok(r)] == [rows[0]["ts"], rows[1]["ts"]]
        assert r.json()["warnings"]
        assert ok(api.get("/api/v1/probes", params={"probe": "other"})) == []
        assert api.get("/api/v1/probes", params={"since": "x"}).status_code == 400
        # Without an engine (a process that does not evaluate): empty, not an error.
        assert ok(api.get("/api/v1/alerts")) == {"alerts": []}
        assert ok(api.get("/api/v1/rules")) == {"groups": []}
        assert ok(api.get("/api/v1/slos")) == []
