"""The weekly job: fires at the configured local time (injected clock), catches up a week
missed while down exactly once, and a second ``serve`` does not produce it again."""

from __future__ import annotations

import asyncio
import time
from datetime import datetime
from pathlib import Path
from zoneinfo import ZoneInfo

import yaml
from apscheduler.schedulers.asyncio import AsyncIOScheduler

from tests.fixtures_http import free_port
from tests.report import synthetic as syn
from tests.report.servers import webhook_server
from tritonwatch.alerts.report.job import CATCH_UP_ID, JOB_ID, ReportJob, install_report_job
from tritonwatch.alerts.report.weeks import Week
from tritonwatch.schemas.config import validate_config
from tritonwatch.serve import serve
from tritonwatch.store import Store, open_store
from tritonwatch.store.reports import ReportStore

BERLIN = ZoneInfo(syn.TZ)


def local(year: int, month: int, day: int, hour: int, minute: int = 0) -> float:
    return datetime(year, month, day, hour, minute, tzinfo=BERLIN).timestamp()


def test_the_cron_trigger_fires_at_the_configured_day_and_hour_in_the_zone() -> None:
    config = syn.config(day="tue", hour=7)
    scheduler = AsyncIOScheduler(timezone="UTC")
    job = ReportJob.__new__(ReportJob)  # the trigger only needs the config
    job.config = config
    trigger = job.trigger()
    after = datetime(2026, 10, 25, 12, tzinfo=BERLIN)  # Sunday, the day summer time ends
    fire = trigger.get_next_fire_time(None, after)
    assert fire == datetime(2026, 10, 27, 7, tzinfo=BERLIN)  # Tuesday 07:00 CET
    assert fire.utcoffset().total_seconds() == 3600
    assert scheduler.get_jobs() == []


def test_install_adds_the_weekly_job_and_a_catch_up(filled: Store) -> None:
    scheduler = AsyncIOScheduler(timezone="UTC")
    installed = install_report_job(scheduler, syn.config(), filled)
    assert installed is not None
    jobs = {j.id: j for j in scheduler.get_jobs()}
    assert set(jobs) == {JOB_ID, CATCH_UP_ID}
    weekly = jobs[JOB_ID]
    assert (weekly.coalesce, weekly.max_instances) == (True, 1)
    assert str(weekly.trigger) == "cron[day_of_week='mon', hour='8', minute='0']"
    assert install_report_job(AsyncIOScheduler(), syn.config(enabled=False), filled) is None


def test_the_job_produces_the_week_at_the_configured_time_with_an_injected_clock(
    filled: Store, tmp_path: Path
) -> None:
    now = [local(2026, 10, 26, 7, 59)]  # Monday 07:59 CET, the report is due at 08:00
    job = ReportJob(filled, syn.config(out_dir=str(tmp_path)), clock=lambda: now[0])
    job.specs = syn.SLOS
    # Before 08:00 the due week is W42 (kept here already, as last week's run did).
    assert job.latest_due(now[0]).name == "2026-W42"
    ReportStore(filled).insert(week="2026-W42", config_key=_key(job), timezone=syn.TZ,
                               start=0, end=1, created_at=1, summary={},
                               documents={"json": "", "html": "", "md": ""})
    assert job.run_once() is None
    now[0] = local(2026, 10, 26, 8, 0)
    made = job.run_once()
    assert made is not None and made.report.week == "2026-W43"
    assert (tmp_path / "2026-W43.html").exists()
    now[0] = local(2026, 10, 26, 8, 30)  # a second fire (or a restart) the same week
    assert job.run_once() is None
    assert [r.week for r in ReportStore(filled).list()] == ["2026-W43", "2026-W42"]


def _key(job: ReportJob) -> str:
    from tritonwatch.alerts.report.produce import config_key

    return config_key(job.config, job.specs)


def test_a_week_missed_while_down_is_produced_once_after_restart(filled: Store,
                                                                  tmp_path: Path) -> None:
    config = syn.config(out_dir=str(tmp_path))
    with webhook_server() as hook:
        config = syn.config(out_dir=str(tmp_path), webhook={"url": hook.url})
        # Down from Sunday until Wednesday: Monday 08:00 passed without a serve.
        restart = local(2026, 10, 28, 9)
        first = ReportJob(filled, config, clock=lambda: restart)
        first.specs = syn.SLOS
        made = first.run_once()  # the catch-up at start-up
        assert made is not None and made.report.week == "2026-W43"
        # A second process on the same store, or this one restarted again: nothing.
        again = ReportJob(filled, config, clock=lambda: restart + 600)
        again.specs = syn.SLOS
        assert again.run_once() is None
        assert [m["week"] for m in hook.received] == ["2026-W43"]
    assert first.delivered == [("2026-W43", "webhook", True)]


async def _serve_until(config_path: Path, store_url: str, want: int, timeout: float) -> None:
    from tritonwatch.schemas.config import load_config

    config = load_config(config_path)
    stop = asyncio.Event()

    async def watch() -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            await asyncio.sleep(0.2)
            with open_store(store_url) as s:
                s.migrations.apply()
                if len(ReportStore(s).list()) >= want:
                    break
        await asyncio.sleep(1.0)  # let a (wrong) second production show itself
        stop.set()

    watcher = asyncio.create_task(watch())
    await asyncio.wait_for(serve(config, stop=stop), timeout=timeout + 60)
    await watcher


def test_serve_catches_up_once_and_a_second_serve_does_not_again(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/tw.db"
    with webhook_server() as hook:
        path = tmp_path / "tw.yaml"
        path.write_text(yaml.safe_dump({
            "store": {"url": url},
            "api": {"listen": f"127.0.0.1:{free_port()}"},
            "nvml": {"enabled": False},
            "reports": {"timezone": syn.TZ, "out_dir": str(tmp_path / "reports"),
                        "webhook": {"url": hook.url}},
        }))
        asyncio.run(_serve_until(path, url, want=1, timeout=60))
        asyncio.run(_serve_until(path, url, want=1, timeout=60))
        with open_store(url) as store:
            kept = ReportStore(store).list()
        # The real clock: the latest due week is this one or the one before, per the hour.
        with open_store(url) as store:
            due = ReportJob(store, validate_config(yaml.safe_load(path.read_text())))
            expected = due.latest_due(time.time()).name
        assert [r.week for r in kept] == [expected]
        assert [m["week"] for m in hook.received] == [expected]
        assert Week.parse(expected, syn.TZ).end <= time.time()
        assert (tmp_path / "reports" / f"{expected}.html").exists()


def _keep(store: Store, job: ReportJob, week: str) -> None:
    ReportStore(store).insert(week=week, config_key=_key(job), timezone=syn.TZ, start=0, end=1,
                              created_at=1, summary={},
                              documents={"json": "", "html": "", "md": ""})


def test_every_missed_week_is_caught_up_oldest_first_once(filled: Store,
                                                          tmp_path: Path) -> None:
    with webhook_server() as hook:
        config = syn.config(out_dir=str(tmp_path), webhook={"url": hook.url})
        # W38 was the last week produced; the service was down from then until Wednesday
        # of W44: W39 .. W43 were missed, and catch_up_weeks (4) bounds it to W40 .. W43.
        restart = local(2026, 10, 28, 9)
        job = ReportJob(filled, config, clock=lambda: restart)
        job.specs = syn.SLOS
        _keep(filled, job, "2026-W38")
        assert [w.name for w in job.due_weeks(restart)] == [
            "2026-W40", "2026-W41", "2026-W42", "2026-W43"]
        made = job.run_once()
        assert made is not None and made.report.week == "2026-W43"
        assert [m["week"] for m in hook.received] == [
            "2026-W40", "2026-W41", "2026-W42", "2026-W43"]
        # A second serve on the same store, later the same day: nothing again.
        again = ReportJob(filled, config, clock=lambda: restart + 3600)
        again.specs = syn.SLOS
        assert again.due_weeks(restart + 3600) == [] and again.run_once() is None
        assert len(hook.received) == 4
    weeks = [r.week for r in ReportStore(filled).list()]
    assert weeks == ["2026-W43", "2026-W42", "2026-W41", "2026-W40", "2026-W38"]
    for week in ("2026-W40", "2026-W43"):
        assert (tmp_path / f"{week}.html").exists()


def test_the_catch_up_is_bounded_and_starts_at_the_latest_week_without_history(
    filled: Store, tmp_path: Path
) -> None:
    restart = local(2026, 10, 28, 9)
    job = ReportJob(filled, syn.config(out_dir=str(tmp_path), catch_up_weeks=2),
                    clock=lambda: restart)
    job.specs = syn.SLOS
    # Nothing kept for this configuration (a new install): only the latest due week.
    assert [w.name for w in job.due_weeks(restart)] == ["2026-W43"]
    _keep(filled, job, "2026-W30")
    assert [w.name for w in job.due_weeks(restart)] == ["2026-W42", "2026-W43"]


def test_a_failed_webhook_delivery_is_kept_and_retried_on_the_next_run(
    filled: Store, tmp_path: Path
) -> None:
    # The hook answers 400 (not retried within a run), then 200.
    with webhook_server([400, 200]) as hook:
        config = syn.config(out_dir=str(tmp_path), webhook={"url": hook.url})
        now = [local(2026, 10, 26, 8, 0)]  # Monday 08:00: W43 is due
        job = ReportJob(filled, config, clock=lambda: now[0])
        job.specs = syn.SLOS
        made = job.run_once()
        assert made is not None and made.report.week == "2026-W43"
        assert hook.posts == 1 and hook.received == []
        reports = ReportStore(filled)
        assert reports.deliveries(made.id) == {"webhook": (False, 1)}
        # A restart an hour later (a new process) retries it from the store.
        now[0] += 3600
        restarted = ReportJob(filled, config, clock=lambda: now[0])
        restarted.specs = syn.SLOS
        assert restarted.run_once() is None  # no new week
        assert [m["week"] for m in hook.received] == ["2026-W43"]
        assert hook.received[0]["id"] == made.id
        assert hook.received[0]["summary"]["postmortems"] == 1
        assert reports.deliveries(made.id) == {"webhook": (True, 2)}
        assert restarted.delivered == [("2026-W43", "webhook", True)]
        # Delivered: never sent again.
        now[0] += 3600
        assert restarted.run_once() is None and hook.posts == 2


def test_an_undelivered_report_is_given_up_after_delivery_attempts(
    filled: Store, tmp_path: Path
) -> None:
    with webhook_server([400]) as hook:
        config = syn.config(out_dir=str(tmp_path), webhook={"url": hook.url},
                            delivery_attempts=2)
        now = [local(2026, 10, 26, 8, 0)]
        job = ReportJob(filled, config, clock=lambda: now[0])
        job.specs = syn.SLOS
        made = job.run_once()
        assert made is not None
        for _ in range(3):  # the next scheduled runs
            now[0] += 3600
            job.run_once()
        assert hook.posts == 2
        assert ReportStore(filled).deliveries(made.id) == {"webhook": (False, 2)}
