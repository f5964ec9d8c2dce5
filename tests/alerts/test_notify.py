"""Delivery: status classification, retries, resend cadence, endsAt, HA, secrets; then the
same Dispatcher against a real Alertmanager (tests/fixtures_alertmanager.py)."""

from __future__ import annotations

import base64
import json
import logging
import threading
import time
from datetime import datetime
from typing import Any

import httpx
import pytest

from tests.fixtures_alertmanager import AlertmanagerServer
from tritonwatch.alerts.notify import (
    AlertmanagerNotifier,
    Dispatcher,
    NotifyError,
    NotifyStatusError,
    NotifyTransportError,
    OutgoingAlert,
    WebhookNotifier,
    build_dispatcher,
    redact_url,
)
from tritonwatch.alerts.notify.base import rfc3339, scrub
from tritonwatch.alerts.notify.webhook import ZERO_TIME, webhook_messages
from tritonwatch.api.receiver import WebhookMessageIn
from tritonwatch.schemas.alerting import AlertingConfig
from tritonwatch.schemas.alerts import AlertState, fingerprint
from tritonwatch.schemas.samples import make_labels

SECRET = "s3cr3t-T0KEN-zz9"  # appears in URL path, userinfo and headers below


def state(
    alertname: str = "SLOBurnRate",
    *,
    status: str = "firing",
    fired_at: float | None = 100.0,
    resolved_at: float | None = None,
    last_sent_at: float | None = None,
    extra: dict[str, str] | None = None,
) -> AlertState:
    labels = make_labels({"alertname": alertname, "slo": "ttft-p95", **(extra or {})})
    return AlertState(
        fingerprint=fingerprint(labels), rule=alertname, labels=labels,
        annotations=make_labels({"summary": "burn 14.4x"}), status=status,  # type: ignore[arg-type]
        active_since=(fired_at or 100.0) - 30, fired_at=fired_at, resolved_at=resolved_at,
        last_true_at=fired_at or 100.0, last_sent_at=last_sent_at, value=14.4,
    )


def outgoing(name: str = "A", status: str = "firing") -> OutgoingAlert:
    labels = make_labels({"alertname": name, "model": "m"})
    return OutgoingAlert(fingerprint(labels), labels, make_labels({"summary": "s"}),
                         status, 100.0, 400.0, None)  # type: ignore[arg-type]


class Recorder:
    """A MockTransport handler: records requests, answers from a script of responses."""

    def __init__(self, *answers: int | httpx.Response | Exception) -> None:
        self.answers = list(answers) or [200]
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, Exception):
            raise answer
        if isinstance(answer, httpx.Response):
            return answer
        return httpx.Response(answer, text=f"body of {answer}")

    def bodies(self) -> list[Any]:
        return [json.loads(r.content) for r in self.requests]

    def client(self) -> httpx.Client:
        return httpx.Client(transport=httpx.MockTransport(self))


class FakeTime:
    def __init__(self) -> None:
        self.t = 0.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.t += seconds


def make_notifier(kind: str, recorder: Recorder, url: str = "http://am.example:9093"):
    if kind == "alertmanager":
        return AlertmanagerNotifier(url, client=recorder.client())
    return WebhookNotifier(url + "/hook", client=recorder.client())


KINDS = ["alertmanager", "webhook"]


# --- classification over every status class ----------------------------------------------

@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("status", [200, 201, 202, 204])
def test_2xx_is_success(kind: str, status: int) -> None:
    rec = Recorder(status)
    make_notifier(kind, rec).notify([outgoing()])
    assert len(rec.requests) == 1


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("status", [400, 401, 403, 404, 409, 413, 422, 301])
def test_other_statuses_fail_for_good_with_the_body(kind: str, status: int) -> None:
    with pytest.raises(NotifyStatusError) as info:
        make_notifier(kind, Recorder(status)).notify([outgoing()])
    assert info.value.retryable is False
    assert info.value.status == status
    assert f"HTTP {status}: body of {status}" in str(info.value)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("status", [429, 500, 502, 503, 504])
def test_5xx_and_429_are_retryable(kind: str, status: int) -> None:
    with pytest.raises(NotifyStatusError) as info:
        make_notifier(kind, Recorder(status)).notify([outgoing()])
    assert info.value.retryable is True
    assert info.value.status == status


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("error", [
    httpx.ConnectTimeout("timed out"), httpx.ReadTimeout("timed out"),
    httpx.WriteTimeout("timed out"), httpx.PoolTimeout("timed out"),
    httpx.ConnectError("[Errno 111] Connection refused"),
    httpx.RemoteProtocolError("Server disconnected"), httpx.ReadError("reset"),
], ids=lambda e: type(e).__name__)
def test_timeouts_and_connection_errors_are_retryable(kind: str, error: Exception) -> None:
    with pytest.raises(NotifyTransportError) as info:
        make_notifier(kind, Recorder(error)).notify([outgoing()])
    assert info.value.retryable is True
    assert isinstance(info.value, ConnectionError) and isinstance(info.value, NotifyError)


def test_429_carries_retry_after() -> None:
    answer = httpx.Response(429, headers={"Retry-After": "3"}, text="slow down")
    with pytest.raises(NotifyStatusError) as info:
        make_notifier("alertmanager", Recorder(answer)).notify([outgoing()])
    assert info.value.retry_after == 3.0


# --- the Dispatcher's retries -------------------------------------------------------------

def dispatcher(*notifiers, fake: FakeTime | None = None, **kw: Any) -> Dispatcher:
    fake = fake or FakeTime()
    kw.setdefault("eval_interval", 30.0)
    return Dispatcher(list(notifiers), clock=fake.clock, sleep=fake.sleep, **kw)


@pytest.mark.parametrize(("script", "sent", "attempts"), [
    ([200], True, 1),
    ([500, 502, 200], True, 3),
    ([503, httpx.ReadTimeout("t"), httpx.ConnectError("refused"), 204], True, 4),
    ([400], True, 1),  # final failure: counted as sent, retried only at the resend cadence
    ([422], True, 1),
    ([500, 404], True, 2),
], ids=["ok", "5xx-then-ok", "mixed-retryable-then-ok", "400-final", "422-final",
        "5xx-then-404-final"])
def test_dispatch_retries_what_can_succeed(script: list[Any], sent: bool, attempts: int) -> None:
    rec = Recorder(*script)
    fake = FakeTime()
    d = dispatcher(AlertmanagerNotifier("http://am:9093", client=rec.client()), fake=fake)
    s = state()
    assert (s.fingerprint in d.dispatch([s], now=100.0)) is sent
    assert len(rec.requests) == attempts
    assert fake.sleeps == [0.5 * 1.5**i for i in range(attempts - 1)]


def test_retries_are_bounded_by_the_budget_and_the_alert_stays_due() -> None:
    rec = Recorder(503)
    fake = FakeTime()
    d = dispatcher(AlertmanagerNotifier("http://am:9093", client=rec.client()), fake=fake,
                   retry_budget=10.0)
    s = state()
    assert d.dispatch([s], now=100.0) == {}
    assert sum(fake.sleeps) <= 10.0 and max(fake.sleeps) <= 5.0
    assert 5 <= len(rec.requests) <= 12
    # Alertmanager comes back: the next evaluation sends it (last_sent_at unchanged).
    rec.answers = [200]
    assert d.is_due(s, now=130.0)
    assert d.dispatch([s], now=130.0) == {s.fingerprint: 130.0}


def test_429_honours_retry_after_within_the_budget() -> None:
    rec = Recorder(httpx.Response(429, headers={"Retry-After": "2"}), 200)
    fake = FakeTime()
    d = dispatcher(AlertmanagerNotifier("http://am:9093", client=rec.client()), fake=fake)
    assert d.dispatch([state()], now=100.0)
    assert fake.sleeps == [2.0]


def test_429_with_a_retry_after_past_the_budget_leaves_it_due() -> None:
    rec = Recorder(httpx.Response(429, headers={"Retry-After": "120"}))
    fake = FakeTime()
    d = dispatcher(AlertmanagerNotifier("http://am:9093", client=rec.client()), fake=fake)
    assert d.dispatch([state()], now=100.0) == {}
    assert fake.sleeps == [] and len(rec.requests) == 1


def test_a_notifier_bug_never_escapes_dispatch() -> None:
    class Broken:
        name = "broken"

        def notify(self, alerts: Any) -> None:
            raise RuntimeError("boom")

    assert dispatcher(Broken()).dispatch([state()], now=100.0) == {}


# --- cadence and endsAt, with an injected clock ---------------------------------------------

def test_resend_cadence_and_ends_at_follow_prometheus() -> None:
    rec = Recorder(200)
    d = dispatcher(AlertmanagerNotifier("http://am:9093", client=rec.client()),
                   eval_interval=30.0, resend_delay=60.0, resolved_retention=900.0)
    s = state(fired_at=100.0)
    timeline: list[tuple[float, bool]] = []
    for now in (100.0, 130.0, 159.0, 160.0, 190.0, 220.0):
        sent = d.dispatch([s], now=now)
        timeline.append((now, bool(sent)))
        if sent:
            s = s._replace(last_sent_at=sent[s.fingerprint])
    # new -> at once; then when last_sent_at + 60 <= now (160 exactly, then 220)
    assert timeline == [(100.0, True), (130.0, False), (159.0, False), (160.0, True),
                        (190.0, False), (220.0, True)]
    bodies = rec.bodies()
    assert [b[0]["endsAt"] for b in bodies] == [rfc3339(t + 240.0) for t in (100, 160, 220)]
    assert {b[0]["startsAt"] for b in bodies} == {rfc3339(100.0)}

    # resolves at 250: sent at once with endsAt = resolved_at, re-sent every 60 s for 15 min
    r = s._replace(status="resolved", resolved_at=250.0)
    sends = []
    for now in (250.0, 280.0, 310.0, 370.0, 1090.0, 1149.0, 1150.0, 1210.0):
        sent = d.dispatch([r], now=now)
        if sent:
            sends.append(now)
            r = r._replace(last_sent_at=sent[r.fingerprint])
    assert sends == [250.0, 310.0, 370.0, 1090.0]  # 1150 = resolved_at + 900: retention over
    assert all(b[0]["endsAt"] == rfc3339(250.0) for b in rec.bodies()[3:])


@pytest.mark.parametrize(("eval_interval", "resend_delay", "valid_for"), [
    (30.0, 60.0, 240.0), (15.0, 60.0, 240.0), (90.0, 60.0, 360.0), (30.0, 10.0, 120.0),
], ids=["eval-30s-resend-1m", "eval-15s-resend-1m", "eval-90s-resend-1m", "eval-30s-resend-10s"])
def test_firing_ends_at_is_four_times_the_larger_of_eval_and_resend(
    eval_interval: float, resend_delay: float, valid_for: float
) -> None:
    d = dispatcher(eval_interval=eval_interval, resend_delay=resend_delay)
    assert d.outgoing(state(), now=1000.0).ends_at == 1000.0 + valid_for


def test_pending_and_never_fired_alerts_are_not_sent() -> None:
    d = dispatcher()
    assert not d.is_due(state(status="pending", fired_at=None), now=100.0)
    assert not d.is_due(state(status="resolved", fired_at=None, resolved_at=90.0), now=100.0)


def test_an_alert_that_fires_again_is_sent_at_once() -> None:
    d = dispatcher()
    # last sent at 150 (for an earlier episode); fires again at 170
    assert d.is_due(state(fired_at=170.0, last_sent_at=150.0), now=170.0)


def test_payload_is_prometheus_postable_alerts() -> None:
    rec = Recorder(200)
    d = dispatcher(AlertmanagerNotifier("http://am:9093/", client=rec.client()),
                   external_url="http://tw.example:8501/")
    s = state(fired_at=1764480941.836)
    d.dispatch([s], now=1764480950.0)
    (request,) = rec.requests
    assert request.url == "http://am:9093/api/v2/alerts"
    assert request.headers["content-type"] == "application/json"
    (alert,) = json.loads(request.content)
    assert alert == {
        "labels": {"alertname": "SLOBurnRate", "slo": "ttft-p95"},
        "annotations": {"summary": "burn 14.4x"},
        "startsAt": "2025-11-30T05:35:41.836Z",
        "endsAt": rfc3339(1764480950.0 + 240),
        "generatorURL": "http://tw.example:8501/api/v1/rules?rule_name[]=SLOBurnRate",
    }


def test_batches_are_capped() -> None:
    rec = Recorder(200)
    d = dispatcher(AlertmanagerNotifier("http://am:9093", client=rec.client()), max_batch_size=2)
    states = [state(f"A{i}") for i in range(5)]
    assert len(d.dispatch(states, now=100.0)) == 5
    assert [len(b) for b in rec.bodies()] == [2, 2, 1]


# --- HA fan-out -----------------------------------------------------------------------------

def test_every_alertmanager_gets_every_alert() -> None:
    recs = [Recorder(200) for _ in range(3)]
    d = dispatcher(*[AlertmanagerNotifier(f"http://am-{i}:9093", client=r.client())
                     for i, r in enumerate(recs)])
    s = state()
    assert d.dispatch([s], now=100.0) == {s.fingerprint: 100.0}
    assert [len(r.requests) for r in recs] == [1, 1, 1]
    assert [r.requests[0].url.host for r in recs] == ["am-0", "am-1", "am-2"]
    d.close()


def test_a_replica_that_is_down_keeps_the_alert_due_until_it_is_back() -> None:
    up, down = Recorder(200), Recorder(503)
    fake = FakeTime()
    d = dispatcher(AlertmanagerNotifier("http://am-0:9093", client=up.client()),
                   AlertmanagerNotifier("http://am-1:9093", client=down.client()),
                   fake=fake, retry_budget=2.0)
    s = state()
    assert d.dispatch([s], now=100.0) == {}
    assert len(up.requests) == 1 and len(down.requests) >= 2
    down.answers = [200]
    assert d.dispatch([s], now=130.0) == {s.fingerprint: 130.0}
    assert len(up.requests) == 2 and down.requests[-1].url.host == "am-1"
    d.close()


# --- generic webhook payload ---------------------------------------------------------------

def test_webhook_payload_has_alertmanagers_v4_shape() -> None:
    alerts = [outgoing("A"), outgoing("A", "resolved")._replace(
        labels=make_labels({"alertname": "A", "model": "n"}), fingerprint="f2"),
        outgoing("B", "resolved")]
    messages = webhook_messages(alerts, receiver="tw", external_url="http://tw:8501",
                                max_alerts=1)
    assert [m["groupKey"] for m in messages] == ['{}:{alertname="A"}', '{}:{alertname="B"}']
    a, b = messages
    assert set(a) == {"receiver", "status", "alerts", "groupLabels", "commonLabels",
                      "commonAnnotations", "externalURL", "version", "groupKey",
                      "truncatedAlerts"}
    assert a["status"] == "firing" and b["status"] == "resolved"
    assert a["version"] == "4" and a["truncatedAlerts"] == 1 and len(a["alerts"]) == 1
    assert a["commonLabels"] == {"alertname": "A"}
    assert a["alerts"][0]["endsAt"] == ZERO_TIME
    assert b["alerts"][0]["endsAt"] == rfc3339(400.0)
    assert set(a["alerts"][0]) == {"status", "labels", "annotations", "startsAt", "endsAt",
                                   "generatorURL", "fingerprint"}
    # what we send, our receiver (and anything written for Alertmanager) accepts
    for message in messages:
        WebhookMessageIn.model_validate(message)


def test_webhook_posts_one_message_per_group_with_headers() -> None:
    rec = Recorder(200)
    notifier = WebhookNotifier("http://hooks.example/x", headers={"X-Key": "v"},
                               client=rec.client())
    notifier.notify([outgoing("A"), outgoing("B")])
    assert len(rec.requests) == 2
    assert all(r.headers["X-Key"] == "v" for r in rec.requests)
    assert rec.requests[0].content.endswith(b"}\n")


# --- secrets --------------------------------------------------------------------------------

@pytest.mark.parametrize("answer", [
    500, 401, httpx.Response(400, text=f"bad token {SECRET}"),
    httpx.ConnectError(f"cannot connect to https://user:{SECRET}@hooks.example/services/{SECRET}"),
    httpx.ReadTimeout(f"timeout on /services/{SECRET}"),
], ids=["500", "401", "body-echoes-secret", "connect-error-quotes-url", "timeout-quotes-path"])
def test_leaks_no_secret(answer: Any, caplog: pytest.LogCaptureFixture) -> None:
    url = f"https://user:{SECRET}@hooks.example/services/{SECRET}?token={SECRET}"
    caplog.set_level(logging.DEBUG)
    rec = Recorder(answer)
    fake = FakeTime()
    notifier = WebhookNotifier(url, headers={"Authorization": f"Bearer {SECRET}x"},
                               client=rec.client())
    with pytest.raises(NotifyError) as info:
        notifier.notify([outgoing()])
    text = f"{info.value} {info.value!r} {info.value.target} {notifier.name} {notifier!r}"
    assert SECRET not in text
    # no chained httpx exception (whose text or request may quote the URL) rides along
    assert info.value.__cause__ is None
    assert info.value.__context__ is None or info.value.__suppress_context__
    d = Dispatcher([notifier], eval_interval=30.0, clock=fake.clock, sleep=fake.sleep,
                   retry_budget=2.0)
    d.dispatch([state()], now=100.0)
    assert caplog.records, "the failure must be logged"
    assert SECRET not in caplog.text
    assert "hooks.example" in caplog.text  # still says where it went


def test_httpx_request_log_is_scrubbed(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    # `tritonwatch` below -vvv quiets httpx (a line per request); the scrubbing is for -vvv.
    caplog.set_level(logging.DEBUG, logger="httpx")
    rec = Recorder(200)
    WebhookNotifier(f"https://hooks.example/services/{SECRET}", client=rec.client()).notify(
        [outgoing()])
    assert any(r.name == "httpx" for r in caplog.records)
    assert SECRET not in caplog.text


@pytest.mark.parametrize(("url", "shown"), [
    ("http://am:9093", "http://am:9093"),
    ("http://am:9093/", "http://am:9093"),
    ("https://u:p@hooks.example/services/T0/B1/xyz", "https://hooks.example/<redacted>"),
    ("http://[::1]:9093/api/v2/alerts?x=1", "http://[::1]:9093/<redacted>"),
    ("not a url at all", "<redacted>"),
])
def test_redact_url(url: str, shown: str) -> None:
    assert redact_url(url) == shown


def test_config_repr_hides_secrets() -> None:
    config = AlertingConfig.model_validate({
        "webhooks": [{"url": f"https://hooks.example/{SECRET}",
                      "headers": {"Authorization": SECRET}}],
        "receiver": {"token": SECRET, "basic_auth": {"username": "am", "password": SECRET}},
    })
    assert SECRET not in repr(config) and SECRET not in str(config)


def test_build_dispatcher_from_config() -> None:
    config = AlertingConfig.model_validate({
        "eval_interval": "15s", "resend_delay": "1m", "alertmanagers": ["http://a:9093",
                                                                        "http://b:9093"],
        "webhooks": [{"url": "http://hook.example/x", "max_alerts": 5}],
        "external_url": "http://tw:8501",
    })
    d = build_dispatcher(config)
    try:
        assert [n.name for n in d.notifiers] == [
            "alertmanager http://a:9093/<redacted>", "alertmanager http://b:9093/<redacted>",
            "webhook http://hook.example/<redacted>"]
        assert d.valid_for == 240.0 and d.external_url == "http://tw:8501"
    finally:
        d.close()


# --- against the real Alertmanager -----------------------------------------------------------

def parsed(text: str) -> float:
    """Go trims trailing zeros of fractions ("…20.13Z"): compare instants, not strings."""
    return datetime.fromisoformat(text).timestamp()


def unique(prefix: str) -> str:
    return f"{prefix}{time.monotonic_ns()}"


def fresh_alert(prefix: str, *, age: float, **extra: str) -> tuple[AlertState, float]:
    """An alert under a name no earlier run used, fired `age` s before now (to the ms); and now."""
    now = time.time()
    return state(unique(prefix), fired_at=round(now - age, 3), extra=extra), now


def real_dispatcher(am: AlertmanagerServer, **kw: Any) -> Dispatcher:
    kw.setdefault("eval_interval", 1.0)
    kw.setdefault("resend_delay", 2.0)
    return Dispatcher([AlertmanagerNotifier(am.url, timeout=2.0)],
                      external_url="http://tw.test:8501", **kw)


def test_real_alertmanager_fires_and_resolves_with_our_labels_and_times(
    running_alertmanager: AlertmanagerServer,
) -> None:
    am = running_alertmanager
    d = real_dispatcher(am)
    s, now = fresh_alert("FireResolve", age=5, model="llama")
    name = s.rule
    sent = d.dispatch([s], now=now)
    assert sent == {s.fingerprint: now}
    # Alertmanager holds it with the endsAt we sent (4 x max(1s, 2s) ahead)
    held = [a for a in am.alerts() if a["labels"].get("alertname") == name]
    assert len(held) == 1 and held[0]["fingerprint"]
    assert parsed(held[0]["endsAt"]) == pytest.approx(now + 8.0, abs=1e-3)

    firing = am.recorder.wait_for(name, lambda p: p["status"] == "firing")
    (alert,) = firing["alerts"]
    assert alert["labels"] == {"alertname": name, "slo": "ttft-p95", "model": "llama"}
    assert alert["annotations"] == {"summary": "burn 14.4x"}
    assert parsed(alert["startsAt"]) == pytest.approx(s.fired_at, abs=1e-6)
    assert alert["endsAt"] == ZERO_TIME
    assert alert["generatorURL"].startswith("http://tw.test:8501/api/v1/rules?rule_name[]=")
    assert firing["groupKey"] == f'{{}}:{{alertname="{name}"}}'

    # Resolve a moment after the firing webhook, not within milliseconds of it: sent at once,
    # about one run of tests/alerts in five saw Alertmanager report this alert resolved 8 s
    # late, at a firing endsAt, instead of at ours (a race we did not pin down; 0 in 7 runs
    # since).  Our resolve itself is checked exactly as before.
    time.sleep(0.5)
    resolved_at = time.time()
    r = s._replace(status="resolved", resolved_at=resolved_at, last_sent_at=now)
    assert d.dispatch([r], now=resolved_at) == {s.fingerprint: resolved_at}
    done = am.recorder.wait_for(name, lambda p: p["status"] == "resolved")
    assert parsed(done["alerts"][0]["endsAt"]) == pytest.approx(resolved_at, abs=1e-3)
    assert parsed(done["alerts"][0]["startsAt"]) == pytest.approx(s.fired_at, abs=1e-6)
    d.close()


def test_real_alertmanager_outage_loses_no_notification(
    running_alertmanager: AlertmanagerServer,
) -> None:
    am = running_alertmanager
    name = unique("Outage")
    d = real_dispatcher(am, retry_budget=1.0)
    am.stop()
    try:
        now = time.time()
        s = state(name, fired_at=round(now, 3))
        # Down: retried within the budget, then left due; the evaluation is not stalled.
        started = time.monotonic()
        assert d.dispatch([s], now=now) == {}
        assert time.monotonic() - started < 5.0
        assert d.is_due(s, now=now + 1)
        # Next evaluation, still down: still due, nothing lost.
        assert d.dispatch([s], now=now + 1) == {}
        # Alertmanager comes back while the next dispatch is retrying.
        restarter = threading.Timer(1.0, am.start)
        restarter.start()
        patient = real_dispatcher(am, retry_budget=20.0)
        try:
            sent = patient.dispatch([s], now=time.time())
        finally:
            restarter.join()
            patient.close()
        assert s.fingerprint in sent
    finally:
        am.start()
        d.close()
    payload = am.recorder.wait_for(name, lambda p: p["status"] == "firing")
    assert parsed(payload["alerts"][0]["startsAt"]) == pytest.approx(s.fired_at, abs=1e-6)


def test_real_alertmanager_delivers_back_to_our_receiver(
    running_alertmanager: AlertmanagerServer,
) -> None:
    d = real_dispatcher(running_alertmanager)
    s, now = fresh_alert("Roundtrip", age=1, tw_route="receiver")
    assert d.dispatch([s], now=now)

    def events(status: str) -> list[Any]:
        return [e for e in running_alertmanager.received_events
                if e.fingerprint == s.fingerprint and e.status == status]

    deadline = time.monotonic() + 15
    while not events("firing") and time.monotonic() < deadline:
        time.sleep(0.1)
    (event,) = events("firing")[:1]
    assert event.labels == s.labels and event.annotations == s.annotations
    assert event.source == "alertmanager:tritonwatch"
    assert event.starts_at == pytest.approx(s.fired_at) and event.ends_at is None

    resolved_at = round(time.time(), 3)
    d.dispatch([s._replace(status="resolved", resolved_at=resolved_at, last_sent_at=now)],
               now=resolved_at)
    deadline = time.monotonic() + 15
    while not events("resolved") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert events("resolved")[0].ends_at == pytest.approx(resolved_at)
    d.close()


# --- a webhook is told of changes, not of every Alertmanager re-send ------------------------

def test_webhook_hears_fire_resolve_and_repeat_interval_while_alertmanager_gets_resends() -> None:
    am_rec, hook_rec = Recorder(200), Recorder(200)
    am = make_notifier("alertmanager", am_rec)
    hook = WebhookNotifier("http://hooks.example/x", client=hook_rec.client(),
                           repeat_interval=3600.0)
    d = dispatcher(am, hook, resend_delay=60.0, eval_interval=30.0)
    s = state(fired_at=100.0)
    now = 100.0
    # One hour and a half of firing, evaluated every 30 s; the engine stores last_sent_at.
    while now <= 100.0 + 5400:
        sent = d.dispatch([s], now=now)
        if s.fingerprint in sent:
            s = s._replace(last_sent_at=sent[s.fingerprint])
        now += 30.0
    am_posts, hook_posts = len(am_rec.requests), len(hook_rec.requests)
    assert am_posts == 91  # every 60 s: Alertmanager's copy must be kept alive
    assert hook_posts == 2  # when it fired, and once more after the 1 h repeat interval
    resolved = s._replace(status="resolved", resolved_at=now)
    for _ in range(40):  # the 15 min resolved retention, evaluated every 30 s
        sent = d.dispatch([resolved], now=now)
        if resolved.fingerprint in sent:
            resolved = resolved._replace(last_sent_at=sent[resolved.fingerprint])
        now += 30.0
    hook_bodies = hook_rec.bodies()
    assert [b["status"] for b in hook_bodies] == ["firing", "firing", "resolved"]
    assert len(am_rec.requests) - am_posts == 15  # resolves re-sent for 15 min, every 60 s


def test_a_receiver_echoing_basic_auth_from_the_url_leaks_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # httpx sends URL userinfo as ``Authorization: Basic base64(user:password)``, decoded
    # first; a receiver answering 400 with our headers quoted must not put it in the log.
    basic = base64.b64encode(b"am-user:p@ss word!").decode()
    body = (f"bad request\nAuthorization: Basic {basic}\n"
            f'{{"headers": {{"Authorization": ["Basic {basic}"]}}}}')
    caplog.set_level(logging.DEBUG)
    rec = Recorder(httpx.Response(400, text=body))
    notifier = AlertmanagerNotifier("http://am-user:p%40ss%20word%21@am:9093",
                                    client=rec.client())
    d = Dispatcher([notifier], eval_interval=30.0)
    d.dispatch([state()], now=100.0)
    assert "HTTP 400" in caplog.text
    for secret in (basic, "p@ss word!", "p%40ss%20word%21"):
        assert secret not in caplog.text


@pytest.mark.parametrize(("text", "kept", "gone"), [
    ("Authorization: Basic dXNlcjpwYXNzd29yZA==", "Authorization: <redacted>", "dXNlcjpw"),
    ('{"authorization":["Bearer abc.def.ghi-jkl"]}', '"authorization":["<redacted>"]',
     "abc.def"),
    ("proxy said: bearer eyJhbGciOiJIUzI1NiJ9.payload", "bearer <redacted>", "eyJhbGci"),
    ("Cookie: session=0123456789abcdef", "Cookie: <redacted>", "0123456789abcdef"),
    ("GET /hook?token=QTok123&x=1", "token=<redacted>&x=1", "QTok123"),
], ids=["basic", "json-bearer", "bare-bearer", "cookie", "query-token"])
def test_scrub_masks_whatever_looks_like_a_credential(text: str, kept: str, gone: str) -> None:
    scrubbed = scrub(text, ())
    assert kept in scrubbed and gone not in scrubbed
