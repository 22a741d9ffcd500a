"""Timestamps say how long ago they were, their exact value and zone; durations read in human units."""

from __future__ import annotations

import re
from datetime import UTC, datetime

import pytest

from inspector.templatetags.inspector import duration, moment, moment_html, relative

AT = datetime(2026, 12, 1, 7, 11, 49, 123000, tzinfo=UTC)


@pytest.mark.parametrize(
    ("delta_s", "said"),
    [
        (-180, "3 min ago"),
        (12, "in 12 s"),
        (-0.4, "now"),
        (-59.4, "59 s ago"),
        (-7300, "2 h ago"),
        (3 * 86400, "in 3 d"),
    ],
)
def test_relative_says_how_far_a_moment_is_from_now(delta_s, said):
    assert relative(delta_s) == said


@pytest.mark.parametrize(
    ("seconds", "said"),
    [(0.85, "850 ms"), (2.4, "2.4 s"), (42.2, "42.2 s"), (185, "3 min 05 s"), (7380, "2 h 03 min"), (None, "—")],
)
def test_duration_reads_in_human_units(seconds, said):
    assert duration(seconds) == said


def test_a_moment_says_how_long_ago_with_the_exact_value_and_utc_as_its_title():
    html = moment_html(AT, now=AT.timestamp() + 180)
    assert html == (
        '<time datetime="2026-12-01T07:11:49.123000+00:00" title="2026-12-01 07:11:49.123 UTC" tabindex="0">'
        "3 min ago</time>"
    )


def test_a_moment_names_the_sites_time_zone(settings):
    settings.TIME_ZONE = "Europe/Paris"
    assert 'title="2026-12-01 08:11:49.123 CET"' in moment_html(AT, now=AT.timestamp())


def test_a_moment_inside_a_link_takes_no_focus_of_its_own():
    assert "tabindex" not in moment(AT, "link") and "tabindex" in moment(AT)


def test_a_failed_segment_shows_relative_times_with_their_zone_and_durations_in_units(operator_client, seeded):
    html = operator_client.get("/threadmill/default/default/failed/").content.decode()
    assert re.search(r'<time datetime="[^"]+" title="[-\d :.]+ UTC" tabindex="0">(now|\d+ s ago)</time>', html)
    assert re.search(r"<td>\d+ (ms|µs)</td>", html)  # the seeded task finished at once
