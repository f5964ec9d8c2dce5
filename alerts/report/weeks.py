"""ISO weeks in a time zone: the report's exact boundaries.

A report covers ``[Monday 00:00, next Monday 00:00)`` of an ISO week in the configured zone,
as unix seconds.  Across a daylight-saving change the week is not 168 hours long: 167 when
the clocks go forward, 169 when they go back, and :attr:`Week.hours` says so.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from zoneinfo import ZoneInfo

_WEEK_RE = re.compile(r"^(\d{4})-W(\d{2})$")
WEEKDAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")


@dataclass(frozen=True, order=True)
class Week:
    """ISO week ``year``-W``week`` in time zone ``tz`` (an IANA name)."""

    year: int
    week: int
    tz: str

    @classmethod
    def parse(cls, text: str, tz: str) -> Week:
        """``2026-W48`` in ``tz``; ValueError quoting the input when it is no ISO week."""
        match = _WEEK_RE.match(text.strip())
        if not match:
            raise ValueError(f"invalid week {text!r}: use YYYY-Www, e.g. 2026-W48")
        year, week = int(match.group(1)), int(match.group(2))
        try:
            date.fromisocalendar(year, week, 1)
        except ValueError:
            raise ValueError(f"invalid week {text!r}: {year} has no ISO week {week}") from None
        return cls(year, week, tz)

    @classmethod
    def containing(cls, ts: float, tz: str) -> Week:
        """The week that holds the instant ``ts`` in ``tz``."""
        local = datetime.fromtimestamp(ts, ZoneInfo(tz))
        iso = local.isocalendar()
        return cls(iso.year, iso.week, tz)

    @classmethod
    def last_complete(cls, now: float, tz: str) -> Week:
        """The latest week that ended at or before ``now``."""
        return cls.containing(now, tz).shift(-1)

    @property
    def name(self) -> str:
        return f"{self.year}-W{self.week:02d}"

    @property
    def monday(self) -> date:
        return date.fromisocalendar(self.year, self.week, 1)

    def _midnight(self, day: date) -> float:
        # Midnight exists on every day in every IANA zone that matters here; where a zone
        # skipped it (a few historical transitions), zoneinfo's fold=0 gives the later instant.
        return datetime(day.year, day.month, day.day, tzinfo=ZoneInfo(self.tz)).timestamp()

    @property
    def start(self) -> float:
        """Monday 00:00 local, unix seconds."""
        return self._midnight(self.monday)

    @property
    def end(self) -> float:
        """Next Monday 00:00 local, unix seconds (exclusive)."""
        return self._midnight(self.monday + timedelta(days=7))

    @property
    def hours(self) -> float:
        """Length in hours: 168, or 167/169 across a daylight-saving change."""
        return (self.end - self.start) / 3600.0

    def shift(self, weeks: int) -> Week:
        monday = self.monday + timedelta(weeks=weeks)
        iso = monday.isocalendar()
        return Week(iso.year, iso.week, self.tz)

    def scheduled_at(self, day: str, hour: int) -> float:
        """When the report of this week is due: the first ``day`` ``hour``:00 local after the
        week's end (``mon``, 8 → the next Monday 08:00)."""
        offset = WEEKDAYS.index(day)
        due = self.monday + timedelta(days=7 + offset)
        return datetime(due.year, due.month, due.day, hour, tzinfo=ZoneInfo(self.tz)).timestamp()

    def local(self, ts: float) -> datetime:
        return datetime.fromtimestamp(ts, ZoneInfo(self.tz))
