"""fetch_metrics against a real HTTP server in a thread playing broken targets."""

import asyncio
import time

import pytest

from tests.fixtures_http import OK_BODY
from tritonwatch.collector.scrape import (
    BodyTooLarge,
    ScrapeError,
    ScrapeTimeout,
    fetch_metrics,
    make_client,
    redact_url,
)


def fetch(url, *, timeout=2.0, max_bytes=1 << 20, headers=None):
    async def go():
        async with make_client() as client:
            return await fetch_metrics(client, "t1", url, timeout=timeout, max_bytes=max_bytes,
                                       headers=headers)

    return asyncio.run(go())


def test_good_target_returns_text(fake_targets):
    body = fetch(fake_targets.url("/ok"))
    assert body.text == OK_BODY
    assert body.size == len(OK_BODY)


def test_down_target_names_the_target(down_url):
    with pytest.raises(ScrapeError, match=r"scrape of 't1' failed: ConnectError"):
        fetch(down_url)


def test_slow_target_is_cut_at_its_timeout(fake_targets):
    start = time.monotonic()
    with pytest.raises(ScrapeTimeout, match=r"timed out after 0\.5s"):
        fetch(fake_targets.url("/slow"), timeout=0.5)
    assert time.monotonic() - start < 25  # cut, not answered: the server answers after 30 s


def test_endless_body_is_cut_by_size_or_deadline(fake_targets):
    start = time.monotonic()
    with pytest.raises(BodyTooLarge, match="max_body_bytes"):
        fetch(fake_targets.url("/endless"), timeout=5, max_bytes=200_000)
    with pytest.raises(ScrapeTimeout):
        fetch(fake_targets.url("/endless"), timeout=0.5, max_bytes=1 << 30)
    assert time.monotonic() - start < 50  # cut: the body goes on for 60 s


def test_gzip_bomb_counts_decompressed_bytes(fake_targets):
    with pytest.raises(BodyTooLarge):
        fetch(fake_targets.url("/big"), max_bytes=1 << 20)
    # ...and a big enough limit accepts the same body, decompressed.
    assert fetch(fake_targets.url("/big"), max_bytes=16 << 20).size > 8 << 20


@pytest.mark.parametrize("code", [401, 404, 500, 503])
def test_http_errors_are_scrape_errors(fake_targets, code):
    with pytest.raises(ScrapeError, match=f"HTTP {code}"):
        fetch(fake_targets.url(f"/status/{code}"))


def test_headers_are_sent_and_never_in_errors(fake_targets):
    secret = "Bearer s3cr3t-token-value"
    assert fetch(fake_targets.url("/headers"), headers={"Authorization": secret}).text == OK_BODY
    with pytest.raises(ScrapeError) as info:
        fetch(fake_targets.url("/headers"), headers={"Authorization": "Bearer wrong"})
    assert "wrong" not in str(info.value)


def test_urls_are_redacted():
    assert redact_url("http://user:pw@host:8002/metrics?token=abc") == "http://host:8002/metrics"


def test_errors_subclass_builtins():
    assert issubclass(ScrapeTimeout, TimeoutError) and issubclass(ScrapeError, ConnectionError)
