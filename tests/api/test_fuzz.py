"""Schemathesis over the API's own OpenAPI schema: no request it generates gets a 5xx.

Bounded and repeatable: a fixed number of examples per operation and derandomized generation
(a fixed seed), over a store holding a few series, alerts and an SLO; a few seconds in all.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import schemathesis
import yaml
from hypothesis import HealthCheck, settings

from tests.api.test_exporter import RULES, T0, fill_store
from tritonwatch.alerts.engine import Engine
from tritonwatch.alerts.rules import SloBurnRule, rules_from_file
from tritonwatch.alerts.status import SloBoard
from tritonwatch.api.app import create_app
from tritonwatch.api.exporter import Live
from tritonwatch.schemas.latest import LatestValues
from tritonwatch.schemas.rules import validate_rules
from tritonwatch.store import open_store

#: Examples per API operation.
EXAMPLES = 30


def _app() -> object:
    store = open_store(f"sqlite:///{Path(tempfile.mkdtemp(prefix='tw-fuzz-')) / 'tw.db'}")
    store.migrations.apply()
    fill_store(store)
    rules = rules_from_file(validate_rules(yaml.safe_load(RULES)))
    engine = Engine(rules, store, eval_interval=30, clock=lambda: T0)
    engine.evaluate(T0)
    board = SloBoard([r.slo for r in rules if isinstance(r, SloBurnRule)])
    board.refresh(store, T0)
    return create_app(store, live=Live(latest=LatestValues(), engine=engine, slos=board))


schema = schemathesis.openapi.from_asgi("/openapi.json", _app())


@schema.parametrize()
@settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
def test_no_request_gets_a_5xx(case: schemathesis.Case) -> None:  # type: ignore[type-arg]
    response = case.call()
    assert response.status_code < 500, (case.path, case.query, response.text[:500])
