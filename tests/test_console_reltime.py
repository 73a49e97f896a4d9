"""The console's relative times (``reltime``): the same words as Django's
``timesince``/``timeuntil`` at depth 1, whatever the distance and the time zone."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from unittest.mock import patch
from zoneinfo import ZoneInfo

from django.utils.timesince import timesince, timeuntil
from hypothesis import given, settings
from hypothesis import strategies as st

from approvals.templatetags import console

NOW = datetime(2026, 12, 3, 18, 0, tzinfo=UTC)
# Months are uneven: four weeks before 1 March is a month, before 3 December not.
NOWS = [NOW, datetime(2026, 3, 1, tzinfo=UTC), datetime(2028, 3, 1, 12, 30, tzinfo=UTC)]


def _django_words(value: datetime, now: datetime = NOW) -> str:
    if abs((now - value).total_seconds()) < 60:
        return "just now"
    if value <= now:
        return f"{timesince(value, now, depth=1)} ago".replace("\xa0", " ")
    return f"in {timeuntil(value, now, depth=1)}".replace("\xa0", " ")


def _shown(value: datetime, now: datetime = NOW) -> tuple[str, str, str]:
    with patch.object(console.timezone, "now", lambda: now):
        html = str(console.reltime(value))
    match = re.fullmatch(r'<time datetime="([^"]+)" title="([^"]+)">([^<]+)</time>', html)
    assert match, html
    return match.groups()


@settings(max_examples=400, deadline=None)
@given(
    offset=st.one_of(
        st.integers(min_value=-40 * 86400 * 10**6, max_value=40 * 86400 * 10**6),
        st.integers(min_value=-800 * 86400 * 10**6, max_value=800 * 86400 * 10**6),
    )
)
def test_the_words_are_djangos_at_every_distance(offset):
    value = NOW - timedelta(microseconds=offset)

    iso, absolute, words = _shown(value)

    assert words == _django_words(value)
    assert iso == value.isoformat()
    assert absolute == value.strftime("%Y-%m-%d %H:%M:%S UTC")


def test_minute_boundaries_and_the_four_week_edge():
    seconds_list = (59, 60, 61, 119, 120, 3599, 3600, 86399, 86400, 28 * 86400 - 1, 28 * 86400)
    seconds_list += tuple(d * 86400 for d in range(28, 33))
    for now in NOWS:
        for seconds in seconds_list:
            for sign in (1, -1):
                for fraction in (0, 999_999):
                    value = now - timedelta(seconds=sign * seconds, microseconds=sign * fraction)
                    assert _shown(value, now)[2] == _django_words(value, now), (now, seconds)


def test_an_empty_time_is_a_dash():
    assert console.reltime(None) == "—"


def test_a_time_in_a_zone_with_daylight_saving_gets_djangos_words():
    # reltime's "now" is UTC; a value in Paris before the October change.
    paris = ZoneInfo("Europe/Paris")
    for hour in range(0, 4):
        value = datetime(2026, 10, 25, hour, 30, tzinfo=paris)
        now = datetime(2026, 10, 25, 4, 30, tzinfo=UTC)

        assert _shown(value, now)[2] == _django_words(value, now), hour
