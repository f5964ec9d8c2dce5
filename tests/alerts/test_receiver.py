"""POST /api/v1/alertmanager/webhook: Alertmanager's captured payloads, auth, limits, storage."""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from tritonwatch.api.app import create_app
from tritonwatch.api.receiver import WEBHOOK_PATH, receiver_router
from tritonwatch.schemas.alerting import AlertingConfig, ReceiverConfig
from tritonwatch.schemas.alerts import AlertEvent, fingerprint
from tritonwatch.schemas.samples import make_labels
from tritonwatch.store import open_store
from tritonwatch.store.alerts import AlertStore
from tritonwatch.store.errors import StoreError

FIXTURES = Path(__file__).parent.parent / "fixtures" / "alertmanager"
TOKEN = "receiver-token-abcdef-0123456789"
USER, PASSWORD = "alertmanager", "basic-password-0123456789"
BEARER = {"Authorization": f"Bearer {TOKEN}"}


def sample(name: str = "alertmanager-webhook-sample.json") -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIXTURES / name).read_text())
    return data


def basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


class ListSink:
    def __init__(self, fail: bool = False) -> None:
        self.events: list[AlertEvent] = []
        self.fail = fail

    def append_events(self, events: Sequence[AlertEvent]) -> int:
        if self.fail:
            raise StoreError("append alert events on sqlite:///x failed: disk I/O error",
                             url="sqlite:///x")
        self.events.extend(events)
        return len(events)


def client_for(sink: ListSink, **config: Any) -> TestClient:
    config.setdefault("token", TOKEN)
    app = FastAPI()
    app.include_router(receiver_router(ReceiverConfig.model_validate(config), sink))
    return TestClient(app)


@pytest.fixture
def sink() -> ListSink:
    return ListSink()


@pytest.fixture
def client(sink: ListSink) -> Iterator[TestClient]:
    with client_for(sink, basic_auth={"username": USER, "password": PASSWORD},
                    max_body_bytes=64 * 1024) as c:
        yield c


def test_captured_firing_payload_is_stored(client: TestClient, sink: ListSink) -> None:
    response = client.post(WEBHOOK_PATH, content=(FIXTURES / "alertmanager-webhook-sample.json")
                           .read_bytes(), headers=BEARER)
    assert response.status_code == 200, response.text
    assert response.json() == {"status": "ok", "stored": 2}
    first, second = sink.events
    assert first.status == "firing" and first.ends_at is None
    assert first.source == "alertmanager:slo-webhook"
    assert first.group_key == '{}:{alertname="SLOBurnRate", slo="ttft-p95"}'
    assert dict(first.labels)["model"] == "llama-3-8b"
    assert dict(second.labels)["model"] == "mistral-7b"
    assert first.labels == make_labels(sample()["alerts"][0]["labels"])
    assert first.fingerprint == fingerprint(first.labels)  # our identity, joins engine events
    assert first.starts_at == pytest.approx(1796016941.836)  # 2026-11-30T05:35:41.836Z
    assert dict(first.annotations)["runbook_url"] == "https://runbooks.example/ttft"


def test_captured_resolved_payload_is_stored(client: TestClient, sink: ListSink) -> None:
    response = client.post(WEBHOOK_PATH, json=sample("alertmanager-webhook-sample-resolved.json"),
                           headers=BEARER)
    assert response.status_code == 200, response.text
    assert [e.status for e in sink.events] == ["resolved", "resolved"]
    assert sink.events[0].ends_at == pytest.approx(1796016956.841)


def test_unknown_fields_and_missing_optional_ones_are_tolerated(
    client: TestClient, sink: ListSink
) -> None:
    payload = sample()
    payload["notification_reason"] = "first notification"  # Alertmanager 0.32+
    payload["routeLabels"] = {"team": "llm"}  # 0.34+
    payload["somethingFromTheFuture"] = [1, 2, 3]
    payload["alerts"][0]["silencedBy"] = []
    del payload["truncatedAlerts"], payload["commonAnnotations"], payload["groupKey"]
    payload["alerts"][1]["startsAt"] = "2026-11-30T05:35:19.648500959Z"  # Alertmanager's own ns
    response = client.post(WEBHOOK_PATH, json=payload, headers=BEARER)
    assert response.status_code == 200, response.text
    assert len(sink.events) == 2 and sink.events[0].group_key is None
    assert sink.events[1].starts_at == pytest.approx(1796016919.6485, abs=1e-6)


def test_basic_auth_is_accepted(client: TestClient, sink: ListSink) -> None:
    response = client.post(WEBHOOK_PATH, json=sample(), headers=basic(USER, PASSWORD))
    assert response.status_code == 200
    assert len(sink.events) == 2


@pytest.mark.parametrize("headers", [
    {},
    {"Authorization": "Bearer wrong-token-0123456789abc"},
    {"Authorization": f"Bearer {TOKEN}x"},
    {"Authorization": f"Token {TOKEN}"},
    {"Authorization": "Bearer"},
    basic(USER, "wrong-password-0123456789"),
    basic("someone", PASSWORD),
    {"Authorization": "Basic not-base64!!"},
    {"Authorization": "Basic " + base64.b64encode(b"no-colon").decode()},
], ids=["none", "wrong-bearer", "longer-bearer", "wrong-scheme", "empty-bearer",
        "wrong-password", "wrong-user", "bad-base64", "no-colon"])
def test_missing_or_wrong_credentials_get_401(
    client: TestClient, sink: ListSink, headers: dict[str, str]
) -> None:
    response = client.post(WEBHOOK_PATH, json=sample(), headers=headers)
    assert response.status_code == 401
    assert "WWW-Authenticate" in response.headers
    assert sink.events == []


def test_bearer_is_refused_when_only_basic_auth_is_configured(sink: ListSink) -> None:
    with client_for(sink, token=None,
                    basic_auth={"username": USER, "password": PASSWORD}) as c:
        assert c.post(WEBHOOK_PATH, json=sample(), headers=BEARER).status_code == 401
        response = c.post(WEBHOOK_PATH, json=sample(), headers=basic(USER, PASSWORD))
        assert response.status_code == 200


def test_credentials_are_never_logged(client: TestClient, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    wrong = "wrong-but-close-token-0123456789"
    client.post(WEBHOOK_PATH, json=sample(), headers={"Authorization": f"Bearer {wrong}"})
    client.post(WEBHOOK_PATH, json=sample(), headers=BEARER)
    client.post(WEBHOOK_PATH, json=sample(), headers=basic(USER, PASSWORD))
    assert caplog.records
    for secret in (wrong, TOKEN, PASSWORD, basic(USER, PASSWORD)["Authorization"]):
        assert secret not in caplog.text


def test_oversized_body_gets_413(client: TestClient, sink: ListSink) -> None:
    payload = sample()
    payload["commonAnnotations"]["description"] = "x" * (64 * 1024)
    response = client.post(WEBHOOK_PATH, json=payload, headers=BEARER)
    assert response.status_code == 413
    assert sink.events == []


def test_oversized_chunked_body_without_length_gets_413(client: TestClient) -> None:
    def chunks() -> Iterator[bytes]:
        yield b'{"receiver":"r","status":"firing","alerts":['
        for _ in range(200):
            yield b" " * 1024

    response = client.post(WEBHOOK_PATH, content=chunks(),
                           headers={**BEARER, "Content-Type": "application/json"})
    assert response.status_code == 413


def test_unauthenticated_oversized_body_is_401_not_413(client: TestClient) -> None:
    response = client.post(WEBHOOK_PATH, content=b"x" * (128 * 1024))
    assert response.status_code == 401


@pytest.mark.parametrize("body", [
    b"not json", b"[]", b'{"receiver": "r"}',
    json.dumps({**sample(), "status": "exploded"}).encode(),
    json.dumps({**sample(), "alerts": [{**sample()["alerts"][0], "startsAt": "yesterday"}]}
               ).encode(),
    json.dumps({**sample(), "alerts": [{**sample()["alerts"][0],
                                        "startsAt": "2026-11-30T05:35:41"}]}).encode(),
], ids=["not-json", "list", "no-alerts", "bad-status", "bad-time", "naive-time"])
def test_malformed_payloads_get_422(client: TestClient, sink: ListSink, body: bytes) -> None:
    response = client.post(WEBHOOK_PATH, content=body,
                           headers={**BEARER, "Content-Type": "application/json"})
    assert response.status_code == 422
    assert sink.events == []


def test_a_failing_store_answers_503_so_alertmanager_retries() -> None:
    with client_for(ListSink(fail=True)) as c:
        assert c.post(WEBHOOK_PATH, json=sample(), headers=BEARER).status_code == 503


def test_receiver_config_refuses_open_or_weak_setups() -> None:
    for bad in ({}, {"token": "changeme"}, {"token": "short"},
                {"basic_auth": {"username": "am", "password": "password"}}):
        with pytest.raises(ValueError):
            ReceiverConfig.model_validate(bad)


def test_create_app_mounts_the_receiver_on_the_store(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path}/tw.db")
    store.migrations.apply()
    try:
        alerting = AlertingConfig.model_validate({"receiver": {"token": TOKEN}})
        with TestClient(create_app(store, alerting=alerting)) as c:
            for name in ("alertmanager-webhook-sample.json",
                         "alertmanager-webhook-sample-resolved.json"):
                response = c.post(WEBHOOK_PATH, content=(FIXTURES / name).read_bytes(),
                                  headers=BEARER)
                assert response.status_code == 200, response.text
        events = AlertStore(store).events(source="alertmanager:slo-webhook")
        assert [e.status for e in events] == ["firing", "firing", "resolved", "resolved"]
        assert events[0].ends_at is None and events[2].ends_at == pytest.approx(1796016956.841)
        assert events[0].group_key == '{}:{alertname="SLOBurnRate", slo="ttft-p95"}'
        # without a receiver config the route does not exist (and, as any write without
        # api.token, the POST is refused before routing: 403)
        app = create_app(store)
        assert WEBHOOK_PATH not in app.openapi()["paths"]
        with TestClient(app) as c:
            assert c.post(WEBHOOK_PATH, json=sample(), headers=BEARER).status_code == 403
        assert AlertStore(store).events(source="alertmanager:slo-webhook") == events
    finally:
        store.close()
