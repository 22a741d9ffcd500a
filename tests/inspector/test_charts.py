"""History charts on the overview: inline SVG drawn on the server from the queue's per-minute history."""

from __future__ import annotations

import time

import pytest

from inspector.charts import HEIGHT, WIDTH, polylines, queue_charts
from threadmill.api.history import History

pytestmark = pytest.mark.django_db


def test_a_series_is_scaled_so_its_peak_reaches_the_top_and_zero_the_bottom():
    (points,) = polylines([0, 5, 10], top=10)
    assert points == f"0.0,{HEIGHT - 1:.1f} {WIDTH / 2:.1f},{HEIGHT / 2:.1f} {WIDTH:.1f},1.0"


def test_an_unknown_value_breaks_the_line_instead_of_dropping_to_zero():
    segments = polylines([1.0, 2.0, None, None, 2.0, None, 1.0, 1.0], top=2.0)
    assert [len(s.split()) for s in segments] == [2, 2, 2]
    assert segments[1].split()[0] == segments[1].split()[1]  # a lone value is drawn as a dot


def test_an_empty_or_all_zero_series_draws_a_flat_line_without_dividing_by_zero():
    assert polylines([], top=0) == []
    assert polylines([0, 0, 0], top=0) == [
        f"0.0,{HEIGHT - 1:.1f} {WIDTH / 2:.1f},{HEIGHT - 1:.1f} {WIDTH:.1f},{HEIGHT - 1:.1f}"
    ]


def test_a_day_is_rebucketed_summing_counts_and_keeping_the_slowest_known_latency():
    day = History([1] * 30, [2] * 30, [0] * 29 + [3], [None] * 14 + [4.0] + [None] * 14 + [1.5])
    bucketed = day.rebucket(15)
    assert bucketed == History([15, 15], [30, 30], [0, 3], [4.0, 1.5])
    assert day.last(2) == History([1, 1], [2, 2], [0, 3], [None, 1.5])
    assert History([0] * 15, [0] * 15, [0] * 15, [None] * 15).rebucket(15).latency_s == [None]


def test_the_overview_charts_every_queue_over_an_hour_and_a_day(operator_client, backend, seeded):
    now = time.time()
    backend.client.set(backend.keys.throughput("default", "latency", int(now // 60)), 2500)
    html = operator_client.get("/threadmill/").content.decode()
    assert html.count('<figure class="queue-charts"') == 3
    figure = html.split('<figure class="queue-charts" data-queue="default">')[1].split("</figure>")[0]
    assert 'data-window="1 hour"' in figure and 'data-window="24 hours"' in figure
    for kind in ("in", "out", "failed", "latency"):
        assert f'<polyline class="{kind}" points="' in figure
    hour = backend.history("default", minutes=60)
    peak = max(hour["enqueued"] + hour["finished"] + hour["failed"])  # 6 enqueued, unless a minute split them
    assert f"default: tasks in, out and failed per min, last 1 hour; peak {peak} / min" in figure
    assert "default: latency (age of the oldest ready task), last 1 hour; peak 2.5 s" in figure
    assert "<script" not in figure and "style=" not in figure


def test_the_day_chart_reads_a_closed_quarter_through_its_summary(operator_client, backend):
    current = int(time.time() // 60)
    quarter = current - current % 15 - 8 * 15  # two hours back, long closed
    for minute, count in ((quarter, 40), (quarter + 14, 2), (quarter + 15, 7)):
        backend.client.set(backend.keys.throughput("default", "ingress", minute), count)
    day = "default: tasks in, out and failed per 15 min, last 24 hours; peak {} / 15 min"

    first = operator_client.get("/threadmill/").content.decode()
    backend.client.incrby(
        backend.keys.throughput("default", "ingress", quarter + 15), 50
    )  # the next quarter, summarised too
    second = operator_client.get("/threadmill/").content.decode()

    assert day.format(42) in first and backend.client.get(backend.keys.quarter("default", quarter)) == b"42,0,0,"
    assert day.format(42) in second  # read from the summaries: the later write is not seen


def test_the_charts_are_part_of_the_overview_fragment_the_websocket_pushes(operator_client, seeded):
    html = operator_client.get("/threadmill/", headers={"HX-Request": "true"}).content.decode()
    assert html.lstrip().startswith('<div id="queues-table"') and 'id="queue-charts"' in html


def test_one_read_gives_both_windows(backend, seeded):
    hour, day = queue_charts("default", "default")
    assert (hour.title, day.title) == ("1 hour", "24 hours")
    assert hour.throughput.peak.endswith(" / min") and day.throughput.peak.endswith(" / 15 min")
    assert 3 <= int(hour.throughput.peak.split()[0]) <= int(day.throughput.peak.split()[0]) <= 6
    assert [line.kind for line in hour.throughput.lines] == ["failed", "out", "in"]
    assert len(hour.throughput.lines[0].segments[0].split()) == 60
    assert len(day.throughput.lines[0].segments[0].split()) == 96
