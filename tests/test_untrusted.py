"""schemas.untrusted: log-safe text, storable text, the repeat limiter."""

from __future__ import annotations

import pytest

from tests.clock import Clock
from tritonwatch.schemas.untrusted import RepeatLimiter, db_text, log_safe


@pytest.mark.parametrize(
    ("raw", "safe"),
    [
        ("plain text", "plain text"),
        ("a\nb\rc\td", "a\\nb\\rc\\td"),
        ("\x1b[31mred\x1b[0m", "\\x1b[31mred\\x1b[0m"),
        ("nul\x00here", "nul\\x00here"),
        ("del\x7f c1\x85", "del\\x7f c1\\x85"),
        ("line\u2028sep\u2029", "line\\u2028sep\\u2029"),
        ("bidi\u202eevil", "bidi\\u202eevil"),
        ("lone\ud800", "lone\\ud800"),
        ("unicode ok: é 東京 🚀", "unicode ok: é 東京 🚀"),
        ("back\\slash", "back\\slash"),
    ],
)
def test_log_safe_escapes_every_character_that_breaks_or_steers_a_log_line(raw, safe):
    assert log_safe(raw) == safe


def test_log_safe_cuts_long_text_and_notes_its_length():
    text = "x" * 60_000
    out = log_safe(text, 100)
    assert out == "x" * 100 + "... [60000 chars]"
    assert log_safe("y" * 100, 100) == "y" * 100  # at the bound: not cut


def test_log_safe_never_leaves_half_an_escape_and_stays_bounded():
    out = log_safe("ab" + "\x1b" * 100, 10)
    assert out.startswith("ab\\x1b\\x1b") and out.endswith("... [102 chars]")
    body = out.removesuffix("... [102 chars]")
    assert len(body) <= 10 and not body.endswith("\\") and not body.endswith("\\x1")
    assert log_safe(None) == "None" and log_safe(ValueError("a\nb")) == "a\\nb"


def test_db_text_replaces_nul_and_bounds_length_but_keeps_the_rest():
    assert db_text(None) is None
    assert db_text("a\x00b\nc\x1b") == "a\ufffdb\nc\x1b"
    assert db_text("s\ud800") == "s\ufffd"
    assert db_text("z" * 50, 10) == "z" * 10 + "... [50 chars]"


def test_repeat_limiter_lets_one_line_per_key_and_interval_through_and_counts_the_rest():
    clock = Clock(0.0)
    limiter = RepeatLimiter(60.0, clock=clock)
    assert limiter.check("a") == 0
    assert [limiter.check("a") for _ in range(5)] == [None] * 5
    assert limiter.check("b") == 0  # keys are independent
    clock.now = 59.9
    assert limiter.check("a") is None
    clock.now = 60.0
    assert limiter.check("a") == 6  # six held back since the last line
    assert limiter.note(6) == " (6 similar line(s) suppressed since the last)"
    assert limiter.note(0) == ""
    limiter.forget("a")
    assert limiter.check("a") == 0


def test_repeat_limiter_remembers_a_bounded_number_of_keys():
    clock = Clock(0.0)
    limiter = RepeatLimiter(60.0, max_keys=3, clock=clock)
    for key in range(10):  # a sender inventing a key per request
        assert limiter.check(key) == 0
    assert len(limiter._seen) == 3
    assert limiter.check(9) is None and limiter.check(0) == 0  # 0 was forgotten


def test_repeat_limiter_refuses_nonsense_settings():
    with pytest.raises(ValueError, match="every_s"):
        RepeatLimiter(-1.0)
    with pytest.raises(ValueError, match="max_keys"):
        RepeatLimiter(1.0, max_keys=0)
