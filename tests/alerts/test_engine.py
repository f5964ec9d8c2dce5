"""The engine's state machine (Prometheus's rules/alerting.go), persistence and restart."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import KW_ONLY, dataclass, field

import pytest

from tritonwatch.alerts.engine import Engine
from tritonwatch.alerts.notify import Dispatcher, OutgoingAlert
from tritonwatch.schemas.alerts import AlertCandidate, AlertEvent, AlertState, fingerprint
from tritonwatch.schemas.samples import Labels, make_labels
from tritonwatch.store import Store, StoreError, open_store
from tritonwatch.store.alerts import AlertStore, StoredAlert

T0 = 1_800_000_000.0
EVAL = 15.0
LABELS = make_labels({"alertname": "KVCacheFull", "model": "llm", "severity": "page"})
FP = fingerprint(LABELS)


@pytest.fixture
def store(make_store: Callable[[], Store]) -> Store:
    return make_store()


@pytest.fixture
def sqlite_store(tmp_path) -> Iterator[Store]:
    s = open_store(f"sqlite:///{tmp_path}/tw.db")
    s.migrations.apply()
    yield s
    s.close()


@dataclass(eq=False)  # compared and hashed by identity, as a real rule
class ScriptedRule:
    """A rule whose condition at each time comes from ``truth(now)``."""

    name: str = "KVCacheFull"
    _: KW_ONLY
    for_s: float = 0.0
    keep_firing_for_s: float = 0.0
    truth: Callable[[float], bool] = lambda _: True
    labels: Labels = LABELS
    fail: Callable[[float], bool] = lambda _: False
    calls: int = field(default=0, init=False)

    def evaluate(self, store: Store, now: float) -> list[AlertCandidate]:
        self.calls += 1
        if self.fail(now):
            raise RuntimeError(f"query failed at {now}")
        if not self.truth(now):
            return []
        return [AlertCandidate(self.labels, make_labels({"summary": f"at {now:g}"}), 0.97)]


def true_at(*offsets: float) -> Callable[[float], bool]:
    wanted = {T0 + o for o in offsets}
    return lambda now: now in wanted


class RecordingDispatcher:
    def __init__(self) -> None:
        self.calls: list[tuple[float, list[AlertState]]] = []

    def dispatch(self, states, now: float) -> dict[str, float]:
        states = list(states)
        self.calls.append((now, states))
        return {s.fingerprint: now for s in states}


def run(engine: Engine, offsets) -> list[AlertEvent]:
    events: list[AlertEvent] = []
    for o in offsets:
        events += engine.evaluate(T0 + o)
    return events


def summary(events: list[AlertEvent]) -> list[tuple[str, float, float, float | None]]:
    return [(e.status, e.ts - T0, e.starts_at - T0, None if e.ends_at is None else e.ends_at - T0)
            for e in events]


# --- state machine tables ----------------------------------------------------------------------

STEPS = [i * EVAL for i in range(12)]


@pytest.mark.parametrize(
    ("for_s", "keep", "true_offsets", "expected"),
    [
        pytest.param(0, 0, [0, 15], [("firing", 0, 0, None), ("resolved", 30, 0, 30)],
                     id="without for an alert fires at once and resolves at the first false eval"),
        pytest.param(30, 0, [0, 15, 30, 45], [("firing", 30, 30, None), ("resolved", 60, 30, 60)],
                     id="with for 30s it fires after 30s and startsAt is the firing time"),
        pytest.param(30, 0, [0, 15], [],
                     id="a pending alert whose condition goes away never fires"),
        pytest.param(30, 0, [0, 15, 45, 60, 75], [("firing", 75, 75, None),
                                                  ("resolved", 90, 75, 90)],
                     id="a gap while pending restarts the for period"),
        pytest.param(0, 60, [0], [("firing", 0, 0, None), ("resolved", 75, 0, 75)],
                     id="keep_firing_for 60s resolves 60s after the first false evaluation"),
        pytest.param(0, 60, [0, 30], [("firing", 0, 0, None), ("resolved", 105, 0, 105)],
                     id="keep_firing_for restarts when the condition comes back"),
        pytest.param(0, 0, [0, 30], [("firing", 0, 0, None), ("resolved", 15, 0, 15),
                                     ("firing", 30, 30, None), ("resolved", 45, 30, 45)],
                     id="flapping without keep_firing_for makes a new instance each time"),
        pytest.param(0, 30, [0, 30], [("firing", 0, 0, None), ("resolved", 75, 0, 75)],
                     id="keep_firing_for absorbs the flap"),
    ],
)
def test_state_machine(sqlite_store, for_s, keep, true_offsets, expected):
    rule = ScriptedRule(for_s=for_s, keep_firing_for_s=keep, truth=true_at(*true_offsets))
    engine = Engine([rule], sqlite_store, eval_interval=EVAL)
    assert summary(run(engine, STEPS)) == expected


def test_pending_is_tracked_but_never_dispatched(sqlite_store):
    dispatcher = RecordingDispatcher()
    rule = ScriptedRule(for_s=30, truth=lambda _: True)
    engine = Engine([rule], sqlite_store, eval_interval=EVAL, dispatcher=dispatcher)
    engine.evaluate(T0)
    engine.evaluate(T0 + 15)
    [state] = engine.states()
    assert (state.status, state.active_since, state.fired_at) == ("pending", T0, None)
    assert dispatcher.calls == []
    engine.evaluate(T0 + 30)
    [(now, [sent])] = dispatcher.calls
    assert (now, sent.status, sent.fired_at, sent.active_since) == (T0 + 30, "firing", T0 + 30, T0)


def test_a_resolved_alert_that_comes_back_is_a_new_instance(sqlite_store):
    rule = ScriptedRule(for_s=15, truth=true_at(0, 15, 45, 60))
    engine = Engine([rule], sqlite_store, eval_interval=EVAL)
    run(engine, [0, 15, 30, 45])
    [state] = engine.states()
    assert (state.status, state.active_since, state.fired_at, state.resolved_at) == (
        "pending", T0 + 45, None, None)
    run(engine, [60])
    [state] = engine.states()
    assert (state.status, state.fired_at) == ("firing", T0 + 60)


def test_resolved_alerts_are_kept_for_the_retention_then_forgotten(sqlite_store):
    rule = ScriptedRule(truth=true_at(0))
    engine = Engine([rule], sqlite_store, eval_interval=EVAL)
    run(engine, [0, 15])
    run(engine, [15 + 900])  # exactly the retention: still kept (Prometheus: strictly more)
    assert [s.status for s in engine.states()] == ["resolved"]
    run(engine, [15 + 915])
    assert engine.states() == []
    assert AlertStore(sqlite_store).states() == []


def test_a_rule_that_raises_is_counted_and_never_stops_the_others(sqlite_store, caplog):
    dispatcher = RecordingDispatcher()
    bad_labels = make_labels({"alertname": "Broken", "model": "llm"})
    bad = ScriptedRule("Broken", labels=bad_labels, fail=lambda now: now >= T0 + 15)
    good = ScriptedRule("Good", labels=make_labels({"alertname": "Good"}))
    engine = Engine([bad, good], sqlite_store, eval_interval=EVAL, dispatcher=dispatcher)
    run(engine, [0, 15, 30])
    assert engine.failures == {"Broken": 2}
    assert good.calls == 3
    # The broken rule's alert keeps firing (state untouched) but is not sent while it fails.
    assert {s.labels: s.status for s in engine.states()} == {
        bad_labels: "firing", make_labels({"alertname": "Good"}): "firing"}
    sent = [sorted(dict(s.labels)["alertname"] for s in states) for _, states in dispatcher.calls]
    assert sent == [["Broken", "Good"], ["Good"], ["Good"]]
    assert "rule 'Broken' failed" in caplog.text
    value = engine.metrics.registry.get_sample_value(
        "tritonwatch_alert_rule_failures_total", {"rule": "Broken"})
    assert value == 2


def test_alertname_is_added_when_a_rule_leaves_it_out(sqlite_store):
    rule = ScriptedRule("NoName", labels=make_labels({"model": "m"}))
    engine = Engine([rule], sqlite_store, eval_interval=EVAL)
    [event] = engine.evaluate(T0)
    assert dict(event.labels) == {"alertname": "NoName", "model": "m"}


def test_two_rules_with_the_same_labels_do_not_fight(sqlite_store, caplog):
    first, second = ScriptedRule("A"), ScriptedRule("B")
    engine = Engine([first, second], sqlite_store, eval_interval=EVAL)
    events = run(engine, [0, 15])
    assert [e.status for e in events] == ["firing"]
    assert [s.rule for s in engine.states()] == ["A"]
    assert "already owned by rule 'A'" in caplog.text


def test_duplicate_rule_names_are_refused(sqlite_store):
    with pytest.raises(ValueError, match="unique"):
        Engine([ScriptedRule("A"), ScriptedRule("A")], sqlite_store, eval_interval=EVAL)


# --- persistence (SQLite and PostgreSQL) --------------------------------------------------------


def test_states_and_events_persist_in_one_transaction_per_evaluation(store):
    rule = ScriptedRule(for_s=15, truth=true_at(0, 15, 30))
    dispatcher = RecordingDispatcher()
    engine = Engine([rule], store, eval_interval=EVAL, dispatcher=dispatcher)
    run(engine, [0])
    [pending] = AlertStore(store).states()
    assert (pending.status, pending.active_since, pending.labels) == ("pending", T0, LABELS)
    run(engine, [15, 30, 45])
    alerts = AlertStore(store)
    [state] = alerts.states()
    assert state == engine.states()[0]
    assert (state.status, state.fired_at, state.resolved_at, state.last_sent_at) == (
        "resolved", T0 + 15, T0 + 45, T0 + 45)
    events = alerts.events(start=T0, end=T0 + 60, source="engine")
    assert [(e.status, e.ts, e.starts_at, e.ends_at) for e in events] == [
        ("firing", T0 + 15, T0 + 15, None), ("resolved", T0 + 45, T0 + 15, T0 + 45)]
    assert events[0].labels == LABELS
    assert dict(events[0].annotations) == {"summary": f"at {T0 + 15:g}"}
    assert alerts.events(start=T0 + 30, end=T0 + 60) == events[1:]
    assert alerts.events(fingerprint="nope") == []


def test_alert_store_round_trips_odd_values(store):
    alerts = AlertStore(store)
    labels = make_labels({"alertname": "X", "model": "模型 'quoted' \"x\"", "e": ""})
    state = AlertState(fingerprint(labels), "X", labels, make_labels({"d": "a\nb"}), "firing",
                       T0 + 0.001, T0 + 1.5, None, T0 + 2, None, math.nan)
    alerts.save([StoredAlert(state, T0 + 3)], now=T0 + 3)
    [loaded] = alerts.load()
    assert loaded.keep_firing_since == T0 + 3
    assert math.isnan(loaded.state.value)
    assert loaded.state._replace(value=0.0) == state._replace(value=0.0)
    alerts.mark_sent({state.fingerprint: T0 + 4, "unknown": T0})
    assert alerts.states()[0].last_sent_at == T0 + 4
    received = AlertEvent(T0, "abc", labels, (), "resolved", T0 - 60, T0, "alertmanager:team",
                          "{}:{alertname=\"X\"}")
    assert alerts.append_events([received]) == 1
    assert alerts.events(source="alertmanager:team") == [received]
    alerts.save([], removed=[state.fingerprint], now=T0 + 5)
    assert alerts.load() == []


def test_a_restart_neither_repages_nor_loses_a_resolve(make_store):
    truth = true_at(*range(0, 300, 15))  # true for 0..285, false from 300
    dispatcher = RecordingDispatcher()
    first = Engine([ScriptedRule(truth=truth)], make_store(), eval_interval=EVAL,
                   dispatcher=dispatcher)
    run(first, [0, 15])
    [(_, [fired])] = dispatcher.calls[:1]
    assert fired.fired_at == T0

    # Restart: a new engine over a new connection restores the firing alert as it was.
    dispatcher = RecordingDispatcher()
    second = Engine([ScriptedRule(truth=truth)], make_store(), eval_interval=EVAL,
                    dispatcher=dispatcher)
    assert second.restore() == 1
    [restored] = second.states()
    assert (restored.status, restored.fired_at, restored.last_sent_at) == ("firing", T0, T0 + 15)
    assert run(second, [30, 45]) == []  # no new firing transition: no second page
    assert all(s.fired_at == T0 for _, states in dispatcher.calls for s in states)

    # It resolves, and the engine restarts again right after: the resolve is still there.
    [resolved] = run(second, [300])
    assert (resolved.status, resolved.ends_at) == ("resolved", T0 + 300)
    dispatcher = RecordingDispatcher()
    third = Engine([ScriptedRule(truth=truth)], make_store(), eval_interval=EVAL,
                   dispatcher=dispatcher)
    third.restore()
    assert run(third, [315]) == []
    [(_, [again])] = dispatcher.calls
    assert (again.status, again.fired_at, again.resolved_at) == ("resolved", T0, T0 + 300)


def test_alerts_of_a_rule_removed_across_a_restart_resolve(sqlite_store):
    first = Engine([ScriptedRule("Old")], sqlite_store, eval_interval=EVAL)
    run(first, [0])
    second = Engine([ScriptedRule("New", labels=make_labels({"alertname": "New"}))],
                    sqlite_store, eval_interval=EVAL)
    second.restore()
    events = run(second, [15])
    assert sorted((e.status, dict(e.labels)["alertname"]) for e in events) == [
        ("firing", "New"), ("resolved", "KVCacheFull")]


def test_a_store_outage_loses_no_event(sqlite_store, monkeypatch):
    engine = Engine([ScriptedRule(truth=true_at(0))], sqlite_store, eval_interval=EVAL)
    real_save = AlertStore.save
    calls = {"n": 0}

    def flaky(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 1:
            raise StoreError("database down", url="sqlite:///x")
        return real_save(self, *args, **kwargs)

    monkeypatch.setattr(AlertStore, "save", flaky)
    run(engine, [0])  # the firing event cannot be written
    assert AlertStore(sqlite_store).events() == []
    run(engine, [15])  # written now, with the resolve
    assert [e.status for e in AlertStore(sqlite_store).events()] == ["firing", "resolved"]
    assert engine.metrics.registry.get_sample_value("tritonwatch_alert_store_errors_total") == 1


# --- with the real Dispatcher --------------------------------------------------------------------


class FakeNotifier:
    name = "fake"

    def __init__(self) -> None:
        self.posts: list[list[OutgoingAlert]] = []
        self.down = False

    def notify(self, alerts) -> None:
        from tritonwatch.alerts.notify import NotifyTransportError

        if self.down:
            raise NotifyTransportError("down", target="fake")
        self.posts.append(list(alerts))


def test_delivery_over_a_restart_with_the_dispatcher(make_store):
    truth = true_at(*range(0, 240, 15))
    notifier = FakeNotifier()

    def engine() -> Engine:
        dispatcher = Dispatcher([notifier], eval_interval=EVAL, retry_budget=0.0,
                                sleep=lambda _: None)
        return Engine([ScriptedRule(truth=truth)], make_store(), eval_interval=EVAL,
                      dispatcher=dispatcher)

    first = engine()
    run(first, [0, 15, 30])  # sent at 0, not re-sent before the 60 s resend delay
    assert [(a.status, a.starts_at) for post in notifier.posts for a in post] == [("firing", T0)]
    second = engine()
    second.restore()
    run(second, [45])  # restarted: still within the resend delay, nothing sent
    assert len(notifier.posts) == 1
    run(second, [60])  # re-send, same startsAt: Alertmanager deduplicates
    assert [(a.status, a.starts_at, a.ends_at) for a in notifier.posts[-1]] == [
        ("firing", T0, T0 + 60 + 4 * 60)]
    notifier.down = True
    run(second, [240])  # resolved while the receiver is down: not marked sent
    notifier.down = False
    third = engine()
    third.restore()
    run(third, [255])  # after another restart the resolve still goes out
    [[resolve]] = notifier.posts[-1:]
    assert (resolve.status, resolve.starts_at, resolve.ends_at) == ("resolved", T0, T0 + 240)


# --- the scheduled job ---------------------------------------------------------------------------


def test_alert_job_from_config_restores_and_installs_like_the_collector_jobs(sqlite_store):
    from apscheduler.schedulers.asyncio import AsyncIOScheduler

    from tritonwatch.alerts.jobs import JOB_ID, AlertJob
    from tritonwatch.schemas.config import validate_config

    config = validate_config({"alerting": {"eval_interval": "20s",
                                           "alertmanagers": ["http://127.0.0.1:9"]}})
    Engine([ScriptedRule()], sqlite_store, eval_interval=EVAL).evaluate(T0)
    job = AlertJob.from_config(config, sqlite_store, rules=[ScriptedRule()], clock=lambda: T0 + 20)
    try:
        assert [s.status for s in job.engine.states()] == ["firing"]  # restored
        assert job.engine.eval_interval == 20.0 and job.dispatcher is not None
        scheduler = AsyncIOScheduler(timezone="UTC")
        job.install(scheduler)
        [scheduled] = scheduler.get_jobs()
        assert (scheduled.id, scheduled.coalesce, scheduled.max_instances,
                scheduled.misfire_grace_time) == (JOB_ID, True, 1, 20)
        job.dispatcher.notifiers = ()  # nothing to reach in a unit test
        job.evaluate()
        assert [s.last_true_at for s in job.engine.states()] == [T0 + 20]
    finally:
        job.close()


def test_alert_job_defaults_to_the_built_in_rules_without_delivery(sqlite_store):
    from tritonwatch.alerts.jobs import AlertJob
    from tritonwatch.schemas.config import validate_config

    job = AlertJob.from_config(validate_config({}), sqlite_store)
    assert job.dispatcher is None and job.engine.rules
    job.evaluate()
    assert job.engine.failures == {}
