"""Console pages through the Django test client: full pages, htmx partials, bad input, escaping."""

from __future__ import annotations

import json

import pytest

from tests.inspector.conftest import TASK_KEY, heartbeat

pytestmark = pytest.mark.django_db

SEGMENTS = ["ready", "deferred", "running", "successful", "failed", "unreadable"]


def test_the_overview_lists_every_queue_with_its_counts(operator_client, seeded):
    response = operator_client.get("/threadmill/")
    assert response.status_code == 200
    html = response.content.decode()
    assert "<html" in html
    assert 'data-queue="default"' in html and 'data-queue="emails"' in html
    for segment in SEGMENTS:
        assert f'data-segment="{segment}">1</a>' in html


def test_the_overview_as_an_htmx_request_renders_only_the_queues_table(operator_client, seeded):
    response = operator_client.get("/threadmill/", headers={"HX-Request": "true"})
    html = response.content.decode()
    assert html.lstrip().startswith('<div id="queues-table"')
    assert "<html" not in html


def test_every_console_page_sends_a_strict_content_security_policy(operator_client, seeded):
    for url in ["/threadmill/", "/threadmill/workers/", "/threadmill/audit/", "/threadmill/default/default/ready/",
                f"/threadmill/default/task/{seeded['ready']}/", "/threadmill/default/nope/ready/"]:  # fmt: skip
        policy = operator_client.get(url).headers["Content-Security-Policy"]
        assert "script-src 'self'" in policy and "unsafe-inline" not in policy, url
    # A URL no console route matches gets the site's policy, which is strict too.
    policy = operator_client.get("/threadmill/nope/default/ready/").headers["Content-Security-Policy"]
    assert "default-src 'self'" in policy and "unsafe-inline" not in policy


@pytest.mark.parametrize("segment", SEGMENTS)
def test_each_segment_table_lists_its_task(operator_client, seeded, segment):
    response = operator_client.get(f"/threadmill/default/default/{segment}/")
    assert response.status_code == 200
    assert seeded[segment] in response.content.decode()


def test_a_segment_table_as_an_htmx_request_renders_only_the_table(operator_client, seeded):
    response = operator_client.get("/threadmill/default/default/ready/", headers={"HX-Request": "true"})
    html = response.content.decode()
    assert html.lstrip().startswith('<div id="tasks-table"')
    assert seeded["ready"] in html and "<html" not in html


def test_the_running_table_shows_the_lease_and_flags_an_overdue_one(operator_client, seeded, raw):
    raw.zadd("threadmill:{default}:default:running", {seeded["running"]: 1})
    html = operator_client.get("/threadmill/default/default/running/").content.decode()
    assert "ghost:1" in html
    assert 'class="overdue' in html and 'badge bad">overdue' in html


def test_the_deferred_table_shows_when_a_task_runs(operator_client, seeded):
    html = operator_client.get("/threadmill/default/default/deferred/").content.decode()
    assert "Run after" in html and html.count("<time") >= 2


def test_the_failed_table_shows_the_error_class(operator_client, seeded):
    html = operator_client.get("/threadmill/default/default/failed/").content.decode()
    assert "builtins.RuntimeError" in html


def test_a_boosted_page_link_aimed_at_the_table_gets_only_the_table(operator_client, seeded):
    headers = {"HX-Request": "true", "HX-Boosted": "true", "HX-Target": "tasks-table"}
    html = operator_client.get("/threadmill/default/default/ready/?page=1", headers=headers).content.decode()
    assert html.lstrip().startswith('<div id="tasks-table"')
    whole = operator_client.get(
        "/threadmill/default/default/ready/", headers={"HX-Request": "true", "HX-Boosted": "true"}
    )
    assert "<html" in whole.content.decode()


def test_pages_of_a_segment_hold_fifty_rows_and_the_total(operator_client, backend):
    from tests.tasks import echo

    ids = [echo.enqueue(i).id for i in range(120)]
    html = operator_client.get("/threadmill/default/default/ready/?page=3").content.decode()
    assert "120 tasks" in html and "page 3 of 3" in html
    assert ids[100] in html and ids[119] in html and ids[99] not in html


def test_sorting_reverses_the_queue_order(operator_client, backend):
    from tests.tasks import echo

    ids = [echo.enqueue(i).id for i in range(60)]
    html = operator_client.get("/threadmill/default/default/ready/?sort=-enqueued_at").content.decode()
    assert ids[59] in html and ids[0] not in html


def test_a_page_past_the_end_shows_the_last_page(operator_client, seeded):
    response = operator_client.get("/threadmill/default/default/ready/?page=40")
    assert response.status_code == 200
    assert seeded["ready"] in response.content.decode()


def test_filtering_by_task_path_and_error_class(operator_client, seeded):
    html = operator_client.get(
        "/threadmill/default/default/failed/?task=tests.tasks.add&error=builtins.RuntimeError"
    ).content.decode()
    assert seeded["failed"] in html and "1 task matching" in html
    html = operator_client.get("/threadmill/default/default/failed/?error=builtins.KeyError").content.decode()
    assert seeded["failed"] not in html and "0 tasks matching" in html


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        (
            "/threadmill/default/default/ready/?page=abc",
            "The page number must be a whole number from 1 to 1,000,000,000, not &#x27;abc&#x27;.",
        ),
        ("/threadmill/default/default/ready/?page=0", "The page number must be a whole number from 1"),
        # Characters str.isdigit() passes but int() refuses, and more digits than int() reads.
        ("/threadmill/default/default/ready/?page=%C2%B2", "The page number must be a whole number from 1"),
        ("/threadmill/default/default/failed/?page=%C2%B3", "not &#x27;³&#x27;."),
        ("/threadmill/default/default/ready/?page=%E2%91%A0", "The page number must be a whole number from 1"),
        ("/threadmill/default/default/ready/?page=" + "1" * 4301, "from 1 to 1,000,000,000, not &#x27;1111"),
        ("/threadmill/audit/?page=%C2%B2", "The page number must be a whole number from 1"),
        ("/threadmill/audit/?page=" + "9" * 5000, "The page number must be a whole number from 1"),
        ("/threadmill/default/default/ready/?page=1%0A", "The page number must be a whole number from 1"),
        (
            "/threadmill/default/default/ready/?sort=..%2F..",
            "The sort must be enqueued_at or -enqueued_at (reversed), not &#x27;../..&#x27;.",
        ),
        ("/threadmill/default/default/ready/?task=a%20b", "The task path filter must be a dotted Python path"),
        (
            "/threadmill/default/default/ready/?error=%3Cscript%3E",
            "The error class filter must be a dotted Python path",
        ),
    ],
)
def test_malformed_input_is_a_400_with_the_reason(operator_client, seeded, url, reason):
    response = operator_client.get(url)
    assert response.status_code == 400
    assert reason in response.content.decode()


@pytest.mark.parametrize(
    "url",
    [
        "/threadmill/nope/default/ready/",
        "/threadmill/default/no-such-queue/ready/",
        "/threadmill/default/default/nonsense/",
        "/threadmill/default/task/00000000-0000-7000-8000-000000000000/",
        "/threadmill/default/task/bad%20id/",
        "/threadmill/nope/task/x/",
        # The path converters' patterns match whole segments: a trailing newline is no name.
        "/threadmill/default%0A/default/ready/",
        "/threadmill/default/default%0A/ready/",
        "/threadmill/default/default/ready%0A/",
        "/threadmill/default/task/{ready}%0A/",
    ],
)
def test_unknown_backend_queue_segment_or_task_is_a_404(operator_client, seeded, url):
    assert operator_client.get(url.format(**seeded)).status_code == 404


def test_the_task_detail_shows_args_errors_and_attempts(operator_client, seeded):
    html = operator_client.get(f"/threadmill/default/task/{seeded['failed']}/").content.decode()
    assert "builtins.RuntimeError" in html and "boom &lt;b&gt;bold&lt;/b&gt;" in html
    assert "ghost:1" in html


def test_the_task_detail_shows_a_unique_tasks_key(operator_client, backend, db):
    from tests.tasks import unique_by_user

    result = unique_by_user.enqueue(user=5)
    html = operator_client.get(f"/threadmill/default/task/{result.id}/").content.decode()
    assert f'<dd class="mono" id="unique-key">{result.unique_key}</dd>' in html
    assert result.unique_key.startswith("threadmill:{default}:unique:")


def test_the_task_detail_of_an_unreadable_task_shows_the_raw_payload_escaped(operator_client, seeded):
    html = operator_client.get(f"/threadmill/default/task/{seeded['unreadable']}/").content.decode()
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "<script>alert(1)" not in html
    assert "UnicodeDecodeError" in html


def test_a_live_task_detail_polls_its_status_partial(operator_client, seeded):
    html = operator_client.get(f"/threadmill/default/task/{seeded['ready']}/").content.decode()
    assert 'hx-trigger="every 1s"' in html
    partial = operator_client.get(f"/threadmill/default/task/{seeded['ready']}/", headers={"HX-Request": "true"})
    assert partial.content.decode().lstrip().startswith('<div id="task-status"')


def test_redis_sourced_text_is_escaped_everywhere(operator_client, backend, raw):
    from tests.tasks import echo

    hostile = '<script>alert("x")</script><img src=x onerror=alert(1)>'
    task_id = echo.enqueue(hostile, note=hostile).id
    raw.sadd("threadmill:{default}:queues", hostile, "a/b", "<img src=x onerror=alert(1)>")
    for url in ["/threadmill/", "/threadmill/default/default/ready/", f"/threadmill/default/task/{task_id}/"]:
        html = operator_client.get(url).content.decode()
        assert "<img src=x" not in html and '<script>alert("x")' not in html, url
    assert (
        "&lt;img src=x onerror=alert(1)&gt;"
        in operator_client.get(f"/threadmill/default/task/{task_id}/").content.decode()
    )
    from urllib.parse import quote

    hostile_queue = operator_client.get(f"/threadmill/default/{quote('<img src=x onerror=alert(1)>')}/ready/")
    assert hostile_queue.status_code == 200 and "<img src=x" not in hostile_queue.content.decode()


def test_a_large_value_is_collapsed(operator_client, backend):
    from tests.tasks import echo

    task_id = echo.enqueue("x" * 5000).id
    html = operator_client.get(f"/threadmill/default/task/{task_id}/").content.decode()
    assert "characters; show all" in html


def test_a_garbled_task_hash_never_breaks_the_table(operator_client, seeded, raw):
    raw.hset(TASK_KEY + seeded["successful"], "data", b"\x00\xff")
    raw.delete("threadmill:{default}:result:" + seeded["successful"])
    response = operator_client.get("/threadmill/default/default/successful/")
    assert response.status_code == 200
    assert "unreadable" in response.content.decode()


def test_the_workers_page_shows_the_snapshots_heard_on_the_telemetry_channel(operator_client, raw):
    import json
    import time

    from threadmill import api

    api.hub().start()
    snapshot = {"type": "worker", "state": "running", "host": "h<b>1</b>", "pid": 4242, "queues": ["default"],
                "threads": 4, "busy_threads": 3, "buffer_fill": 2, "buffer_size": 16, "tasks_done": 99,
                "tasks_per_minute": 12.5, "cpu_percent": 7.0, "rss_bytes": 50_000_000, "started_at": time.time() - 90}  # fmt: skip
    deadline = time.monotonic() + 10
    while not any(w.pid == 4242 for w in api.hub().workers()):
        assert time.monotonic() < deadline, "the hub never heard the snapshot"
        raw.publish("threadmill:{default}:telemetry", json.dumps(snapshot))
        time.sleep(0.05)
    html = operator_client.get("/threadmill/workers/").content.decode()
    assert 'data-pid="4242" data-state="live"' in html
    assert "3 / 4" in html and "h&lt;b&gt;1&lt;/b&gt;" in html
    raw.publish("threadmill:{default}:telemetry", json.dumps({**snapshot, "state": "stopped"}))
    deadline = time.monotonic() + 10
    while next(w for w in api.hub().workers() if w.pid == 4242).state != "stopped":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert 'data-state="stopped"' in operator_client.get("/threadmill/workers/").content.decode()


def test_the_workers_page_as_an_htmx_request_renders_only_the_workers_table(operator_client):
    html = operator_client.get("/threadmill/workers/", headers={"HX-Request": "true"}).content.decode()
    assert html.lstrip().startswith('<div id="workers-table"')
    assert "<html" not in html


def test_a_worker_silent_for_three_intervals_is_lost():
    from threadmill import api

    hub = api.TelemetryHub()
    hub.record("default", '{"type":"worker","state":"running","host":"h","pid":1}', now=100.0)
    assert [w.state for w in hub.workers(now=105.0)] == ["live"]
    assert [w.state for w in hub.workers(now=107.0)] == ["lost"]
    hub.stop()


def test_a_restarted_container_s_new_worker_is_listed_beside_the_lost_one_with_its_pid():
    from threadmill import api

    hub = api.TelemetryHub()
    old = '{"type":"worker","state":"running","worker":"box:7:oldoneab","host":"box","pid":7}'
    hub.record("default", old, now=100.0)
    hub.record("default", old.replace("oldoneab", "newonecd"), now=106.5)
    workers = hub.workers(now=107.0)
    assert [(w.name, w.pid, w.incarnation, w.state) for w in workers] == [
        ("box:7:oldoneab", 7, "oldoneab", "lost"),
        ("box:7:newonecd", 7, "newonecd", "live"),
    ]
    hub.stop()


def test_the_status_line_says_why_nothing_runs(seeded, monkeypatch):
    from threadmill import api

    monkeypatch.setattr(api.hub(), "started_at", 1.0)
    rows = {s.queue_name: s for s in api.overview()}
    assert rows["default"].status == "No live workers for this queue."
    assert rows["default"].status_level == "bad"


def test_the_per_minute_rate_slides_over_the_last_sixty_seconds():
    from threadmill.api import sliding_minute

    assert sliding_minute([0, 60, 10], elapsed=0.25) == 55
    assert sliding_minute([7], elapsed=0.5) == 7
    assert sliding_minute([], elapsed=0.5) == 0


@pytest.mark.parametrize("field", ["task_path", "error_class"])
def test_a_filter_path_with_a_trailing_newline_is_refused(field):
    from threadmill import api

    with pytest.raises(ValueError, match="must be a dotted Python path"):
        api.Filter(**{field: "tests.tasks.add\n"})
    assert getattr(api.Filter(**{field: "tests.tasks.add"}), field) == "tests.tasks.add"


HOSTILE_TELEMETRY = [
    '{"type":"worker","host":"h","pid":Infinity}',
    '{"type":"worker","host":"h","pid":NaN,"threads":-Infinity}',
    '{"type":"worker","host":"h","pid":1e400,"rss":1e308,"cpu_percent":NaN,"tasks_per_minute":Infinity}',
    '{"type":"worker","host":"h","pid":' + "9" * 400 + ',"threads":' + "9" * 400 + "}",
    '{"type":"worker","host":"h","pid":2,"started_at":1e308,"interval":-5,"rss":-1}',
    '{"type":"worker","host":"h","pid":3,"started_at":-1e308,"interval":0,"busy":"all","queues":{"a":1}}',
    '{"type":"snapshot","host":{"a":[1]},"pid":4,"queues":[null,[],{}]}',
    "[" * 100_000,
    '{"type":"worker","pid":' + "[" * 100_000,
    "\xff\xfe",
]


def test_hostile_telemetry_never_breaks_the_hub_or_the_workers_page(operator_client, monkeypatch):
    import time

    from threadmill.api import workers

    hub = workers.TelemetryHub()
    monkeypatch.setattr(workers, "_hub", hub)  # this process's hub stays clean for the other tests
    try:
        for payload in HOSTILE_TELEMETRY:
            hub.record("default", payload.encode("utf-8", "surrogateescape"), now=time.time())
        for headers in ({}, {"HX-Request": "true"}):
            assert operator_client.get("/threadmill/workers/", headers=headers).status_code == 200
            assert operator_client.get("/threadmill/", headers=headers).status_code == 200
        assert {w.pid for w in hub.workers()} >= {2, 3, 4}
    finally:
        hub.stop()  # reading its workers started its subscription


def test_a_segment_page_opens_a_socket_that_carries_its_total_and_the_htmx_table_does_not(operator_client, seeded):
    html = operator_client.get("/threadmill/default/default/ready/").content.decode()
    assert 'ws/?view=segment&amp;backend=default&amp;queue=default&amp;segment=ready&amp;total=1"' in html
    assert '<p id="new-tasks"' in html
    partial = operator_client.get("/threadmill/default/default/ready/", headers={"HX-Request": "true"}).content.decode()
    assert "new-tasks" not in partial


def test_the_site_redirects_favicon_ico_to_the_consoles_icon(client):
    response = client.get("/favicon.ico")
    assert response.status_code == 301 and response.headers["Location"] == "/static/inspector/favicon.svg"


def test_a_queue_its_limits_hold_back_says_so_and_is_not_stuck(backend, monkeypatch, operator_client):
    from tests.tasks import echo
    from threadmill import api

    # A live worker serving the queue, from its stored heartbeat (the hub is left alone: it is global).
    monkeypatch.setattr(api.hub(), "warmed_up", lambda now: False)
    name = "box:7:abcdefgh"
    document = {"worker": name, "host": "box", "pid": 7, "queues": ["default"], "threads": 4, "busy": 1}
    backend.client.set(backend.keys.worker(name), json.dumps(document))
    heartbeat(backend, name)
    api.controls.set_queue_limit("default", "default", concurrency=1, rate="100/m", by="ops")
    echo.enqueue(1)
    echo.enqueue(2)
    assert len(backend.acquire("default", count=2, worker="box:7:abcdefgh")) == 1  # the limit holds one back

    rows = {s.queue_name: s for s in api.overview()}
    assert rows["default"].status == "Throttled: 1/1 running (its concurrency limit)."
    assert rows["default"].status_level == "ok"
    assert rows["default"].limits == "1 at once, 100/m"
    assert rows["emails"].limits == ""
    page = operator_client.get("/threadmill/").content.decode()
    assert "Throttled: 1/1 running" in page and 'data-limits="1 at once, 100/m"' in page


def test_a_queue_a_per_task_limit_holds_back_names_the_task_and_is_not_stuck(backend, monkeypatch):
    from tests.tasks import three_at_a_time
    from threadmill import api

    monkeypatch.setattr(api.hub(), "warmed_up", lambda now: False)
    name = "box:7:abcdefgh"
    document = {"worker": name, "host": "box", "pid": 7, "queues": ["default"], "threads": 8, "busy": 3}
    backend.client.set(backend.keys.worker(name), json.dumps(document))
    heartbeat(backend, name)
    for i in range(4):
        three_at_a_time.enqueue(i)
    assert len(backend.acquire("default", count=4, worker=name)) == 3  # the task's limit holds one back

    rows = {s.queue_name: s for s in api.overview()}
    assert rows["default"].status == "Held by per-task limits: tests.tasks.three_at_a_time (3/3 running)."
    assert rows["default"].status_level == "ok"
