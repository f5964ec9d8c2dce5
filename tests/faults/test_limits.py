"""Fault suite: hostile targets and senders against the real collector, store and API.

Each test plays one fault of issue 19 through the real components: real HTTP targets on
127.0.0.1 (tests/fixtures_http.py), the real ``Collector`` with an injected clock, the real
store (SQLite, and a real PostgreSQL where the fault is PostgreSQL's), the real API through
``TestClient``.

1. Size: ``sample_limit`` and the label limits fail a scrape as a whole (``up`` 0, the reason
   in the target's health, nothing stored); ``series_limit`` caps the series a target creates
   in the store over time while its existing series keep flowing.
5. Logs: a newline in a webhook's ``groupKey`` cannot forge a log line; a target's 60 KB
   unparsable line with ESC and CR bytes is logged escaped, cut, and once.
7. NUL: a NUL byte from a target (or a webhook) never breaks a write on PostgreSQL; the other
   targets' health keeps updating and ``/api/v1/targets`` keeps answering.
9. A counter that falls below zero never gives a negative ``sli:request_rate``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import threading
from collections.abc import Callable
from contextlib import ExitStack
from http.server import ThreadingHTTPServer
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.clock import Clock
from tests.fixtures_http import OK_BODY, FakeTargets, serve_fake_targets
from tests.serving import QuietHandler
from tritonwatch.api.app import create_app
from tritonwatch.api.receiver import WEBHOOK_PATH
from tritonwatch.collector.jobs import HEALTH_ERROR_MAX, Collector
from tritonwatch.collector.self_metrics import SelfMetrics
from tritonwatch.schemas.alerting import AlertingConfig
from tritonwatch.schemas.config import ConfigError, validate_config
from tritonwatch.schemas.samples import TargetHealth
from tritonwatch.store import Query, Store, open_store
from tritonwatch.store.alerts import AlertStore

TOKEN = "receiver-token-abcdef-0123456789"
# Every character a log line must never carry raw: controls (CR, LF, ESC, NUL...), U+2028/9.
CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")


T0 = 1_800_000_000.0


def config_for(targets: list[dict[str, Any]], **scrape: Any) -> Any:
    return validate_config({"targets": targets, "scrape": scrape, "nvml": {"enabled": False}})


def scrape_rounds(
    collector: Collector,
    clock: Clock,
    rounds: int,
    *,
    store: Store,
    before: Callable[[int], None] | None = None,
    after: Callable[[int, dict[str, TargetHealth]], None] | None = None,
) -> list[dict[str, TargetHealth]]:
    """``rounds`` scrapes of every target, 15 s apart, the store flushed after each."""

    async def go() -> list[dict[str, TargetHealth]]:
        out = []
        try:
            for i in range(rounds):
                if before is not None:
                    before(i)
                healths = {name: await collector.scrape(name) for name in collector.targets}
                await asyncio.to_thread(store.flush)
                if after is not None:
                    after(i, healths)
                out.append(healths)
                clock.now += 15.0
        finally:
            await collector.close()
        return out

    return asyncio.run(go())


def served(stack: ExitStack, body: str) -> FakeTargets:
    return stack.enter_context(serve_fake_targets(body))


# --- 1. sample and label limits --------------------------------------------------------------


def _counter_lines(n: int, name: str = "app_requests") -> str:
    return f"# TYPE {name} counter\n" + "".join(
        f'{name}{{path="/p{i}"}} {i}\n' for i in range(n)
    )


def test_a_scrape_over_sample_limit_fails_whole_with_up_0_and_nothing_stored(store):
    body = _counter_lines(150)
    with ExitStack() as stack:
        big, good = served(stack, body), served(stack, OK_BODY)
        config = config_for(
            [
                {"name": "big", "metrics_url": big.url("/ok")},  # the global limit: 100
                {"name": "big-allowed", "metrics_url": big.url("/ok"), "sample_limit": 200},
                {"name": "good", "metrics_url": good.url("/ok")},
            ],
            sample_limit=100,
        )
        clock = Clock(T0)
        collector = Collector(config, store, clock=clock)
        rounds = scrape_rounds(collector, clock, 2, store=store)

    for healths in rounds:  # refused every time, also once its shape is known
        big_health = healths["big"]
        assert not big_health.up
        assert big_health.error == "sample limit exceeded (150 > 100)"
        assert big_health.samples == 150  # reported like Prometheus's scrape_samples_scraped
        assert healths["big-allowed"].up and healths["good"].up
    stored = {h.target: h for h in store.health()}
    assert stored["big"].error == "sample limit exceeded (150 > 100)" and not stored["big"].up
    # Nothing of the refused scrapes: only the synthetic series, with up = 0.
    names = {key.name for key in store.series(Query(target="big"))}
    assert names == {"up", "scrape_duration_seconds", "scrape_samples_scraped"}
    (up,) = store.read(Query("up", start=0, end=clock.now, target="big")).series()
    assert up.values == (0.0, 0.0)
    (scraped,) = store.read(Query("scrape_samples_scraped", start=0, end=clock.now,
                                  target="big")).series()
    assert scraped.values == (150.0, 150.0)
    # The per-target override lets the same body through whole.
    assert len(store.series(Query("app_requests", target="big-allowed"))) == 150


def test_the_steady_state_skips_the_line_count_and_a_grown_body_is_still_refused(
    store, monkeypatch
):
    """A payload with the last one's lines is not counted again (its sample count is the
    shape's, checked by the limits); one whose lines changed is counted before it is parsed."""
    import tritonwatch.collector.jobs as jobs
    from tritonwatch.collector.limits import check_sample_count as real

    counted: list[int] = []

    def counting(target: str, text: str, limits: Any) -> None:
        counted.append(text.count("\n"))
        real(target, text, limits)

    monkeypatch.setattr(jobs, "check_sample_count", counting)
    with ExitStack() as stack:
        target = served(stack, _counter_lines(150))
        config = config_for([{"name": "t", "metrics_url": target.url("/ok")}], sample_limit=200)
        clock = Clock(T0)
        collector = Collector(config, store, clock=clock)

        def grow(i: int) -> None:
            if i == 4:  # the exporter lists 100 more series: over the limit
                target.server.ok_body = _counter_lines(250)

        rounds = scrape_rounds(collector, clock, 5, store=store, before=grow)

    # Counted while the structure was new (the steady-state matcher is built once it repeats),
    # not in the steady state, and again when it changed.
    assert counted == [151, 151, 251]
    assert [r["t"].up for r in rounds] == [True, True, True, True, False]
    assert rounds[4]["t"].error == "sample limit exceeded (250 > 200)"
    (scraped,) = store.read(Query("scrape_samples_scraped", start=0, end=clock.now,
                                  target="t")).series()
    assert scraped.values == (150.0, 150.0, 150.0, 150.0, 250.0)


@pytest.mark.parametrize(
    ("limit", "series", "reason"),
    [
        ("label_limit", 'm{a="1",b="2",c="3",d="4"} 1',
         "label_limit exceeded (metric: m, number of labels: 4, limit: 3)"),
        ("label_name_length_limit", 'm{abcdefghijk="1"} 1',
         "label_name_length_limit exceeded (metric: m, label name: abcdefghijk, length: 11, "
         "limit: 10)"),
        ("label_value_length_limit", 'm{a="0123456789a"} 1',
         'label_value_length_limit exceeded (metric: m, label name: a, value: "0123456789a", '
         "length: 11, limit: 10)"),
    ],
    ids=["label_limit", "label_name_length_limit", "label_value_length_limit"],
)
def test_a_scrape_over_a_label_limit_fails_whole_naming_the_metric(limit, series, reason, store):
    limits = {"label_limit": 3, "label_name_length_limit": 10, "label_value_length_limit": 10}
    body = 'fine{a="1"} 1\n' + series + "\n"
    with ExitStack() as stack:
        bad, good = served(stack, body), served(stack, OK_BODY)
        config = config_for(
            [
                {"name": "bad", "metrics_url": bad.url("/ok"), limit: limits[limit]},
                {"name": "good", "metrics_url": good.url("/ok")},
            ]
        )
        clock = Clock(T0)
        rounds = scrape_rounds(Collector(config, store, clock=clock), clock, 2, store=store)
    assert [r["bad"].error for r in rounds] == [reason, reason]
    assert all(r["good"].up and not r["bad"].up for r in rounds)
    # Not even the series within the limits: a partial scrape would skew every sum.
    assert store.series(Query("fine", target="bad")) == []
    assert len(store.series(Query("nv_inference_count", target="good"))) == 1


def test_limits_are_validated_with_their_key_paths_and_default_bounded():
    with pytest.raises(ConfigError) as err:
        validate_config({
            "scrape": {"sample_limit": -1},
            "targets": [{"name": "a", "metrics_url": "http://h:8002/metrics",
                         "series_limit": -5, "label_limit": "many"}],
        })
    text = "\n".join(err.value.errors)
    assert "scrape.sample_limit:" in text
    assert "targets[0].series_limit:" in text and "targets[0].label_limit:" in text
    config = validate_config({"targets": [
        {"name": "a", "metrics_url": "http://h:8002/metrics"},
        {"name": "b", "metrics_url": "http://h:8002/metrics", "sample_limit": 0,
         "series_limit": 7},
    ]})
    a, b = (config.limits_for(t) for t in config.targets)
    # Generous for a big TensorRT-LLM server (a few thousand series), but bounded.
    assert 10_000 <= a.sample_limit <= 1_000_000 and 10_000 <= a.series_limit <= 1_000_000
    assert a.label_limit and a.label_name_length_limit and a.label_value_length_limit
    assert (b.sample_limit, b.series_limit, b.label_limit) == (0, 7, a.label_limit)


# --- 1. the series limit, over time, on both backends ----------------------------------------


def test_series_beyond_series_limit_are_refused_counted_and_warned_once(make_store, caplog):
    store = make_store()
    # Each round: one stable series and ten new ones (a label value churning per scrape).
    bodies = [
        "stable 1\n" + "".join(f'churn{{i="{r}-{k}"}} {k}\n' for k in range(10))
        for r in range(5)
    ]
    with ExitStack() as stack:
        churny, good = served(stack, bodies[0]), served(stack, OK_BODY)
        config = config_for([
            {"name": "churny", "metrics_url": churny.url("/ok"), "series_limit": 30},
            {"name": "good", "metrics_url": good.url("/ok")},
        ])
        clock = Clock(T0)
        metrics = SelfMetrics()
        collector = Collector(config, store, clock=clock, metrics=metrics)

        def before(i: int) -> None:
            churny.server.ok_body = bodies[i]

        with caplog.at_level(logging.WARNING, logger="tritonwatch.collector.jobs"):
            rounds = scrape_rounds(collector, clock, 5, store=store, before=before)
    assert all(r["churny"].up and r["good"].up for r in rounds)  # refusing is not failing
    # 14 series after round 0 (11 + up, duration, samples scraped), 24 after round 1, then 6
    # of round 2's ten new ones fit; rounds 3 and 4 fit none.
    assert len(store.series(Query(target="churny"))) == 30
    refused = metrics.series_refused.labels("churny")._value.get()
    assert refused == 4 + 10 + 10
    # The series it already had keep flowing, every round.
    (stable,) = store.read(Query("stable", start=0, end=clock.now, target="churny")).series()
    (up,) = store.read(Query("up", start=0, end=clock.now, target="churny")).series()
    assert len(stable.values) == 5 and up.values == (1.0,) * 5
    # One warning naming the target (rate-limited: three flushes refused series).
    warnings = [r.getMessage() for r in caplog.records if "series_limit" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert "churny" in warnings[0] and "30" in warnings[0]
    # Another target is not touched by it.
    assert len(store.series(Query("nv_inference_count", target="good"))) == 1
    assert metrics.series_refused.labels("good")._value.get() == 0


# --- 5. log lines: escaped, cut, rate-limited --------------------------------------------------


def test_a_groupkey_with_a_newline_cannot_forge_a_log_line(store, caplog):
    payload: dict[str, Any] = {
        "version": "4", "status": "firing", "receiver": "team\nINFO fake receiver",
        "groupKey": '{}:{alertname="X"}\nERROR tritonwatch forged line \x1b[31mred\r',
        "alerts": [{"status": "firing", "labels": {"alertname": "X"},
                    "startsAt": "2026-11-01T10:00:00Z"}],
    }
    alerting = AlertingConfig.model_validate({"receiver": {"token": TOKEN}})
    with caplog.at_level(logging.INFO, logger="tritonwatch.api.receiver"), \
            TestClient(create_app(store, alerting=alerting)) as client:
        response = client.post(WEBHOOK_PATH, json=payload,
                               headers={"Authorization": f"Bearer {TOKEN}"})
    assert response.status_code == 200, response.text
    (record,) = [r for r in caplog.records if "stored" in r.getMessage()]
    message = record.getMessage()
    assert not CONTROL.search(message), message
    assert "\\nERROR tritonwatch forged line \\x1b[31mred\\r" in message
    assert "team\\nINFO fake receiver" in message
    # The alert itself is stored with the sender's text intact.
    (event,) = AlertStore(store).events()
    assert event.group_key == payload["groupKey"]


def test_a_60kb_unparsable_line_is_logged_escaped_cut_and_once(store, caplog):
    # ESC, CR and a different tail every scrape: the error text changes each time, so only a
    # rate limit keeps it from being logged on every scrape.
    def body(i: int) -> str:
        return 'x{a="b"c\x1b[2J\r' + "z" * 60_000 + f'{i}}} 1\n'

    with ExitStack() as stack:
        hostile, good = served(stack, body(0)), served(stack, OK_BODY)
        config = config_for([
            {"name": "hostile", "metrics_url": hostile.url("/ok")},
            {"name": "good", "metrics_url": good.url("/ok")},
        ])
        clock = Clock(T0)
        collector = Collector(config, store, clock=clock)

        def before(i: int) -> None:
            hostile.server.ok_body = body(i)

        with caplog.at_level(logging.INFO, logger="tritonwatch"):
            rounds = scrape_rounds(collector, clock, 20, store=store, before=before)
    assert all(not r["hostile"].up and r["good"].up for r in rounds)
    lines = [r.getMessage() for r in caplog.records if "hostile" in r.getMessage()]
    assert len(lines) == 1, lines  # 20 scrapes, 20 different errors, one line
    assert "unparsable body" in lines[0] and "chars]" in lines[0]  # cut, with the length
    assert len(lines[0]) < 1_000
    assert not CONTROL.search(lines[0]) and "\\x1b[2J\\r" in lines[0]
    # What the store and the API keep is the same safe, bounded text.
    stored = {h.target: h for h in store.health()}
    error = stored["hostile"].error or ""
    assert not CONTROL.search(error) and 0 < len(error) <= HEALTH_ERROR_MAX + 40


class _HostileModelServer(QuietHandler):
    """A model server whose error message would forge log lines, paint the terminal and break
    PostgreSQL: a real HTTP server, answering every request with a 500."""

    MESSAGE = "boom\nERROR forged \x1b[31m\x00 " + "A" * 5_000

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        data = json.dumps({"error": {"message": self.MESSAGE, "code": 500}}).encode()
        self.send_response(500)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.mark.postgres
def test_a_probes_hostile_error_text_is_logged_escaped_and_stored_on_postgres(
    postgres_db_url, caplog
):
    server = ThreadingHTTPServer(("127.0.0.1", 0), _HostileModelServer)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    store = open_store(postgres_db_url)
    store.migrations.apply()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        config = validate_config({"nvml": {"enabled": False}, "probes": [
            {"name": "llm", "url": url, "protocol": "openai", "model": "m", "warmup": 0,
             "requests": 2, "timeout": 10},
        ]})
        collector = Collector(config, store)

        async def go() -> None:
            try:
                for _ in range(3):
                    await collector.run_probe("llm")
            finally:
                await collector.close()

        with caplog.at_level(logging.WARNING, logger="tritonwatch.collector.jobs"):
            asyncio.run(go())
        store.flush()
    finally:
        server.shutdown()
        server.server_close()
    try:
        lines = [r.getMessage() for r in caplog.records if "probe:llm" in r.getMessage()]
        assert len(lines) == 1, lines  # once, not per run
        assert not CONTROL.search(lines[0]) and "boom\\nERROR forged" in lines[0]
        assert len(lines[0]) < 1_000
        (health,) = [h for h in store.health() if h.source == "probe:llm"]
        assert not health.up and not CONTROL.search(health.error or "")
        results = store.probe_results(probe="llm")
        assert len(results) == 6 and not any(r.ok for r in results)
        assert all("\x00" not in (r.error_message or "") for r in results)
    finally:
        store.close()


# --- 7. NUL from a target on PostgreSQL --------------------------------------------------------

# The reference parser's message quotes the refused labels raw: this NUL reached the health row.
NUL_UNPARSABLE = 'x{a="b"c\x00} 1\n'
# A valid line whose label value holds a NUL: stored (JSON-escaped) and read back as sent.
NUL_LABEL = 'x{a="b\x00c"} 1\n'


@pytest.mark.postgres
def test_a_nul_byte_from_a_target_never_freezes_health_on_postgres(postgres_db_url):
    store = open_store(postgres_db_url)
    store.migrations.apply()
    try:
        with ExitStack() as stack:
            good = served(stack, OK_BODY)
            nul, nul_label = served(stack, NUL_UNPARSABLE), served(stack, NUL_LABEL)
            config = config_for([
                {"name": "good", "metrics_url": good.url("/ok")},
                {"name": "nul", "metrics_url": nul.url("/ok")},
                {"name": "nul-label", "metrics_url": nul_label.url("/ok")},
            ])
            clock = Clock(T0)
            api = stack.enter_context(TestClient(create_app(store)))
            seen: list[dict[str, Any]] = []

            def after(i: int, healths: dict[str, TargetHealth]) -> None:
                assert healths["good"].up, i
                response = api.get("/api/v1/targets")
                assert response.status_code == 200, response.text
                by_name = {h["target"]: h for h in response.json()["data"]}
                seen.append(by_name)
                # Every target's health is this round's, the good one's included.
                assert {h["ts"] for h in by_name.values()} == {clock.now}

            scrape_rounds(Collector(config, store, clock=clock), clock, 3, store=store,
                          after=after)
        last = seen[-1]
        assert last["good"]["up"] and last["nul-label"]["up"] and not last["nul"]["up"]
        assert "\x00" not in last["nul"]["error"] and "Invalid labels" in last["nul"]["error"]
        (key,) = store.series(Query("x", target="nul-label"))
        assert dict(key.labels)["a"] == "b\x00c"
        (x,) = store.read(Query("x", start=0, end=clock.now, target="nul-label")).series()
        assert x.values == (1.0, 1.0, 1.0)
    finally:
        store.close()


def test_text_with_nul_is_storable_on_both_backends(make_store):
    """The store's own guard, for any writer: health, probe rows and received alerts."""
    from tritonwatch.schemas.alerts import AlertEvent, fingerprint
    from tritonwatch.schemas.probes import ProbeResult
    from tritonwatch.schemas.samples import make_labels

    store = make_store()
    store.write_health(TargetHealth("t", "metrics", 1000.0, False, 0.1, 0, "bad\x00body"))
    store.write_probe_results([ProbeResult(
        probe="p", target="t", model="m", protocol="http", ts=1000.0, ok=False, tokens=0,
        error_kind="server_error", error_code="5\x0000", error_message="server said \x00" * 500,
        request_id="r1",
    )])
    store.flush()
    (health,) = store.health()
    assert health.error == "bad\ufffdbody"
    (probe,) = store.probe_results()
    assert "\x00" not in (probe.error_message or "") and "chars]" in (probe.error_message or "")
    labels = make_labels({"alertname": "X"})
    AlertStore(store).append_events([AlertEvent(
        ts=1000.0, fingerprint=fingerprint(labels), labels=labels, annotations=(),
        status="firing", starts_at=1000.0, ends_at=None, source="alertmanager:r\x00",
        group_key="g\x00k",
    )])
    (event,) = AlertStore(store).events()
    assert (event.group_key, event.source) == ("g\ufffdk", "alertmanager:r\ufffd")


# --- 9. a counter falling below zero ----------------------------------------------------------

_COUNTER_BODY = (
    "# TYPE nv_inference_request_success counter\n"
    'nv_inference_request_success{{model="m",version="1"}} {v}\n'
    "# TYPE nv_inference_count counter\n"
    'nv_inference_count{{model="m",version="1"}} {v}\n'
    "# TYPE nv_inference_exec_count counter\n"
    'nv_inference_exec_count{{model="m",version="1"}} {v}\n'
)
# Rising, a reset (1080 -> 600), falling to zero and below it, rising again.
FALLING = [1000, 1040, 1080, 600, 640, 0, -40, -80, -120, 40, 80]


def test_a_counter_falling_below_zero_never_gives_a_negative_rate(store):
    with ExitStack() as stack:
        target = served(stack, _COUNTER_BODY.format(v=FALLING[0]))
        config = config_for([{"name": "falling", "metrics_url": target.url("/ok")}])
        clock = Clock(T0)

        def before(i: int) -> None:
            target.server.ok_body = _COUNTER_BODY.format(v=FALLING[i])

        rounds = scrape_rounds(Collector(config, store, clock=clock), clock, len(FALLING),
                               store=store, before=before)
    assert all(r["falling"].up for r in rounds)
    (rate,) = store.read(Query("sli:request_rate", start=0, end=clock.now,
                               target="falling")).series()
    t0 = 1_800_000_000.0
    got = dict(zip(rate.ts, rate.values, strict=True))
    assert min(rate.values) >= 0, got
    assert got[t0 + 15] == pytest.approx(40 / 15)
    assert got[t0 + 45] == pytest.approx(600 / 15)  # a reset: the new value is the increase
    assert got[t0 + 75] == 0.0  # 640 -> 0, a reset to zero
    # Below zero is no counter value: skipped like NaN, so no rate for those scrapes nor for
    # the first one after them (it has no baseline), then rates again.
    assert not any(t0 + 90 <= ts <= t0 + 135 for ts in got), got
    assert got[t0 + 150] == pytest.approx(40 / 15)

