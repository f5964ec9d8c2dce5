"""Delivery of a new report to a real local webhook server and a real local SMTP server
(aiosmtpd); credentials come from the environment and never reach a log line."""

from __future__ import annotations

import email
import logging
from email.message import Message
from pathlib import Path

import pytest

from tests.report import synthetic as syn
from tests.report.servers import smtp_server, webhook_server
from tests.store_sql import raw_engine
from tritonwatch.alerts.report.deliver import send_email, send_webhook, webhook_payload
from tritonwatch.alerts.report.job import ReportJob
from tritonwatch.schemas.reports import ReportWebhookConfig, SmtpConfig
from tritonwatch.store import Store

USER, PASSWORD = "reports-bot", "pa55-w0rd-not-for-logs"


def _job(filled: Store, tmp_path: Path, **reports) -> ReportJob:
    job = ReportJob(filled, syn.config(out_dir=str(tmp_path), external_url="http://tw.example:8080",
                                       **reports),
                    clock=lambda: syn.WEEK.scheduled_at("mon", 8) + 60)
    job.specs = syn.SLOS
    return job


def test_the_webhook_gets_the_summary_and_a_link(filled, tmp_path, caplog) -> None:
    caplog.set_level(logging.DEBUG)
    with webhook_server() as hook:
        job = _job(filled, tmp_path, webhook={"url": hook.url,
                                              "headers": {"Authorization": "Bearer tok-123456"}})
        made = job.run_once()
        assert made is not None
    (msg,) = hook.received
    assert msg["week"] == "2026-W43" and msg["hours"] == 169
    assert msg["summary"]["postmortems"] == 1 and msg["summary"]["held"] == 2
    assert msg["url"] == f"http://tw.example:8080/api/v1/reports/{made.id}"
    assert msg["slos"][0]["name"] == "availability"
    assert msg["slos"][0]["budget_remaining"] == 0.703264
    assert hook.headers_seen[0]["Authorization"] == "Bearer tok-123456"
    assert "s3cr3t-token-path" not in caplog.text and "tok-123456" not in caplog.text


def test_the_webhook_is_retried_on_503_and_not_on_400(filled, tmp_path, caplog) -> None:
    report = _job(filled, tmp_path).run_once()
    assert report is not None
    payload = webhook_payload(report.report, report.id, None)
    with webhook_server([503, 200]) as hook:
        assert send_webhook(ReportWebhookConfig(url=hook.url), payload, sleep=lambda s: None)
        assert len(hook.received) == 1
    with webhook_server([400]) as hook:
        assert not send_webhook(ReportWebhookConfig(url=hook.url), payload,
                                sleep=lambda s: None)
        assert hook.received == []
    assert "not delivered" in caplog.text and "s3cr3t-token-path" not in caplog.text


def _html_part(msg: Message) -> str:
    for part in msg.walk():
        if part.get_content_type() == "text/html":
            payload = part.get_payload(decode=True)
            assert isinstance(payload, bytes)
            return payload.decode()
    raise AssertionError("no HTML part")


def test_smtp_sends_the_html_report_with_credentials_from_the_environment(
    filled, tmp_path, monkeypatch, caplog
) -> None:
    caplog.set_level(logging.DEBUG, logger="tritonwatch")
    monkeypatch.setenv("TRITONWATCH_SMTP_USER", USER)
    monkeypatch.setenv("TRITONWATCH_SMTP_PASSWORD", PASSWORD)
    with smtp_server(USER, PASSWORD) as (box, port):
        job = _job(filled, tmp_path, smtp={
            "host": "127.0.0.1", "port": port, "starttls": False,
            "sender": "tritonwatch@example.com", "to": ["sre@example.com"]})
        made = job.run_once()
        assert made is not None
    assert job.delivered == [("2026-W43", "smtp", True)]
    (envelope,) = box.messages
    assert envelope.rcpt_tos == ["sre@example.com"]
    assert isinstance(envelope.content, bytes)
    msg = email.message_from_bytes(envelope.content)
    assert msg["Subject"] == "SLO report 2026-W43: 2 held, 0 at risk, 0 breached"
    html = _html_part(msg)
    # SMTP sends CRLF line ends; the document is otherwise the one kept.
    assert html.replace("\r\n", "\n").strip() == made.documents["html"].strip()
    assert "data:image/png;base64," in html
    assert PASSWORD not in caplog.text


def test_smtp_failure_is_logged_without_credentials_and_keeps_the_report(
    filled, tmp_path, monkeypatch, caplog
) -> None:
    monkeypatch.setenv("TRITONWATCH_SMTP_USER", USER)
    monkeypatch.setenv("TRITONWATCH_SMTP_PASSWORD", PASSWORD)
    with smtp_server(USER, "another-password-entirely") as (box, port):
        cfg = SmtpConfig(host="127.0.0.1", port=port, starttls=False, sender="a@example.com",
                         to=("b@example.com",))
        job = _job(filled, tmp_path)
        made = job.run_once()
        assert made is not None
        assert send_email(cfg, made.report, made.documents["html"], made.documents["md"]) is False
    assert box.messages == []
    assert "report e-mail via 127.0.0.1" in caplog.text
    assert PASSWORD not in caplog.text and USER not in caplog.text


@pytest.mark.parametrize(("data", "error"), [
    pytest.param({"timezone": "Mars/Olympus"}, "reports.timezone: unknown time zone",
                 id="an unknown time zone is refused naming the key"),
    pytest.param({"hour": 24}, "reports.hour", id="an hour past 23 is refused"),
    pytest.param({"smtp": {"host": "h", "sender": "a@b.c", "to": []}}, "reports.smtp.to",
                 id="e-mail without recipients is refused"),
    pytest.param({"webhook": {"url": "ftp://x"}}, "reports.webhook.url",
                 id="a webhook that is no http URL is refused"),
])
def test_bad_report_settings_are_refused_with_their_key_path(data, error) -> None:
    from tritonwatch.schemas.config import ConfigError, validate_config

    with pytest.raises(ConfigError) as err:
        validate_config({"reports": data})
    assert any(line.startswith(error) for line in err.value.errors), err.value.errors


def test_delivery_outcomes_live_in_a_table_added_to_an_existing_database(store: Store) -> None:
    from sqlalchemy import text

    from tritonwatch.store.reports import ReportStore

    # A database made before report_deliveries existed: migrations.apply() adds it, nothing lost.
    with raw_engine(store).begin() as conn:
        conn.execute(text("DROP TABLE report_deliveries"))
    reports = ReportStore(store)
    kept = reports.insert(week="2026-W40", config_key="k", timezone="UTC", start=0, end=1,
                          created_at=1, summary={"held": 1},
                          documents={"json": "{}", "html": "<p>", "md": "#"})
    assert kept is not None
    store.migrations.apply()
    assert reports.record_delivery(kept, "webhook", False, 10.0) == 1
    assert reports.record_delivery(kept, "smtp", True, 10.0) == 1
    assert [p.channel for p in reports.pending_deliveries(3)] == ["webhook"]
    assert reports.record_delivery(kept, "webhook", False, 20.0) == 2
    assert reports.pending_deliveries(2) == []
    assert reports.deliveries(kept) == {"webhook": (False, 2), "smtp": (True, 1)}
    assert [r.week for r in reports.list()] == ["2026-W40"]
