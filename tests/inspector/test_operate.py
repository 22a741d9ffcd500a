"""Operator controls through the Django test client: pause and resume queues, quiet and stop workers,
orphaned running tasks, schedules, a queue's limits; each audited, refused to viewers, and bad input a 4xx."""

from __future__ import annotations

import html
import time
from datetime import UTC, datetime

import pytest

from inspector.models import AuditEntry
from tests.inspector.conftest import csrf_post, dead, heartbeat
from tests.servers import partition
from threadmill.identity import WorkerName

pytestmark = pytest.mark.django_db

HTMX = {"HX-Request": "true"}


def worker_document(name: str, **fields) -> dict:
    parsed = WorkerName.parse(name)
    return {"type": "worker", "worker": name, "host": parsed.host, "pid": parsed.pid, "state": "running",
            "queues": ["default", "emails", "reports"], "threads": 2, "busy_threads": 0, "tasks_done": 0, **fields}  # fmt: skip


@pytest.fixture
def live_worker(backend):
    """A worker process whose heartbeat (and its document) Redis holds, as a running pool's does."""
    backend.heartbeat("box:4242", worker_document("box:4242"), publish=False)
    return "box:4242"


@pytest.fixture
def scheduled(backend, monkeypatch):
    """Give the default backend one schedule (a daily echo) for the length of a test."""
    import zoneinfo

    from threadmill.schedules import parse_schedules

    entries = {"nightly-echo": {"task": "tests.tasks.echo", "cron": "0 3 * * *", "args": ["<b>nightly</b>"]}}
    monkeypatch.setattr(backend, "schedules", parse_schedules("default", entries, zoneinfo.ZoneInfo("UTC")))
    return backend.schedules[0]


# -- pause and resume a queue ------------------------------------------------------------------


@pytest.mark.parametrize("headers", [{}, HTMX])
def test_pausing_a_queue_says_who_paused_it_since_when_and_audits_it(operator_client, backend, seeded, headers):
    response = csrf_post(operator_client, "/threadmill/default/default/pause/", {}, headers=headers)
    assert response.status_code == 302 and response.headers["Location"] == "/threadmill/"
    assert set(backend.paused_queues()) == {"default"}
    html = operator_client.get("/threadmill/").content.decode()
    assert 'data-queue="default" data-paused="true"' in html
    since = backend.paused_queues()["default"].since.astimezone(UTC).strftime("%Y-%m-%d %H:%M")
    assert f"Paused by operator since {since}" in html
    assert "Paused default: workers take none of its tasks until it is resumed." in html
    entry = AuditEntry.objects.get()
    assert (entry.action, entry.queue_name, entry.username) == ("pause", "default", "operator")


def test_resuming_a_queue_lets_workers_take_its_tasks_again(operator_client, backend, seeded):
    backend.pause("default", by="someone")
    html = operator_client.get("/threadmill/").content.decode()
    assert 'action="/threadmill/default/default/resume/"' in html and 'hx-confirm="Resume queue default?' in html
    response = csrf_post(operator_client, "/threadmill/default/default/resume/", {})
    assert response.status_code == 302
    assert backend.paused_queues() == {}
    assert list(AuditEntry.objects.values_list("action", flat=True)) == ["resume"]
    assert "Resumed default." in operator_client.get("/threadmill/").content.decode()


def test_pausing_a_paused_queue_changes_nothing_and_says_so(operator_client, backend, seeded):
    backend.pause("default", by="first")
    csrf_post(operator_client, "/threadmill/default/default/pause/", {})
    assert backend.paused_queues()["default"].by == "first"
    assert "default was paused already." in operator_client.get("/threadmill/").content.decode()


def test_the_overview_offers_pause_only_to_who_may_change_queues(client_as, viewer, operator_client, seeded):
    assert "/default/default/pause/" in operator_client.get("/threadmill/").content.decode()
    assert "/pause/" not in client_as(viewer).get("/threadmill/").content.decode()


def test_pausing_an_unknown_queue_is_a_404_and_a_get_a_405(operator_client, backend):
    assert csrf_post(operator_client, "/threadmill/default/no-such-queue/pause/", {}).status_code == 404
    assert operator_client.get("/threadmill/default/default/pause/").status_code == 405
    assert backend.paused_queues() == {}


# -- a queue's limits ---------------------------------------------------------------------------

LIMITS = "/threadmill/default/emails/limits/"


def runtime_limit(backend, queue: str = "emails"):
    return backend.queue_limits([queue])[queue].runtime


def test_setting_a_queues_limits_shows_them_on_its_row_and_audits_who_set_them(operator_client, backend, seeded):
    from threadmill.limits import QueueLimit, Rate

    response = csrf_post(operator_client, LIMITS, {"concurrency": "3", "rate": "100/m"}, headers=HTMX)
    assert response.status_code == 302 and response.headers["Location"] == "/threadmill/"
    state = backend.queue_limits(["emails"])["emails"]
    assert (state.runtime, state.set_by) == (QueueLimit(3, Rate(100, "m")), "operator")
    html = operator_client.get("/threadmill/").content.decode()
    assert "Limits of emails: 3 at once, 100/m, until cleared." in html
    assert 'data-limits="3 at once, 100/m"' in html and f'href="{LIMITS}"' in html
    entry = AuditEntry.objects.get()
    assert (entry.action, entry.queue_name, entry.username, entry.count) == ("limit", "emails", "operator", 0)
    assert entry.scope == "set concurrency 3, rate 100/m; in force: 3 at once, 100/m"


def test_a_limit_field_left_empty_keeps_that_part_as_it_is(operator_client, backend):
    from threadmill.limits import QueueLimit, Rate

    csrf_post(operator_client, LIMITS, {"concurrency": "3", "rate": ""})
    csrf_post(operator_client, LIMITS, {"concurrency": "", "rate": "20/s"})
    assert runtime_limit(backend) == QueueLimit(3, Rate(20, "s"))
    page = operator_client.get(LIMITS).content.decode()
    assert '<dd data-part="runtime">3 at once, 20/s (by operator, <time' in page
    assert 'id="clear-limits-form"' in page


def test_clearing_a_queues_limits_falls_back_to_the_settings(operator_client, settings, seeded):
    from django.tasks import task_backends

    from threadmill.limits import NO_LIMIT

    alias = settings.TASKS["default"]
    options = {**alias["OPTIONS"], "limits": {"emails": {"concurrency": 5}}}
    settings.TASKS = {"default": {**alias, "OPTIONS": options}}
    backend = task_backends["default"]
    csrf_post(operator_client, LIMITS, {"concurrency": "2"})
    assert 'data-limits="2 at once"' in operator_client.get("/threadmill/").content.decode()
    response = csrf_post(operator_client, LIMITS + "clear/", {}, headers=HTMX)
    assert response.status_code == 302 and response.headers["Location"] == "/threadmill/"
    assert runtime_limit(backend) == NO_LIMIT
    html = operator_client.get("/threadmill/").content.decode()
    assert "Cleared the runtime limits of emails; in force now: 5 at once." in html
    assert 'data-limits="5 at once"' in html
    assert 'id="clear-limits-form"' not in operator_client.get(LIMITS).content.decode()
    csrf_post(operator_client, LIMITS + "clear/", {})
    assert "emails had no runtime limits; in force: 5 at once." in operator_client.get("/threadmill/").content.decode()
    scopes = list(AuditEntry.objects.order_by("id").values_list("action", "scope"))
    cleared = ("limit", "cleared; in force: 5 at once")
    assert scopes == [("limit", "set concurrency 2; in force: 2 at once"), cleared, cleared]


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        ({"rate": "5/x"}, "Rate: A rate is N/s, N/m or N/h with N a whole number, not '5/x'."),
        ({"rate": "0/s"}, "Rate: A rate allows 1 to 100,000 per unit, not 0."),
        ({"concurrency": "-1"}, "Concurrency: A concurrency limit is a whole number of at least 1, not -1."),
        ({"concurrency": "abc"}, "Concurrency: A concurrency limit is a whole number of at least 1, not 'abc'."),
        ({"concurrency": "²"}, "Concurrency: A concurrency limit is a whole number of at least 1, not '²'."),
        ({"concurrency": "", "rate": ""}, "Give a concurrency, a rate or both."),
    ],
)
def test_a_bad_limit_is_a_400_naming_the_problem_and_changes_nothing(operator_client, backend, seeded, data, problem):
    from threadmill.limits import NO_LIMIT

    before = backend.queue_stats()
    response = csrf_post(operator_client, LIMITS, data)
    assert response.status_code == 400
    assert problem in html.unescape(response.content.decode())
    assert "Traceback" not in response.content.decode()
    assert runtime_limit(backend) == NO_LIMIT and backend.queue_stats() == before
    assert not AuditEntry.objects.exists()


def test_a_limit_below_the_partition_count_is_a_400_naming_it(operator_client, settings):
    from threadmill.limits import NO_LIMIT

    backend = partition(settings)
    response = csrf_post(operator_client, LIMITS, {"concurrency": "2"})
    assert response.status_code == 400
    problem = "A concurrency limit of 2 is below the 3 partitions: each partition enforces a share of it, at least 1."
    assert problem in response.content.decode()
    assert runtime_limit(backend) == NO_LIMIT and not AuditEntry.objects.exists()


@pytest.mark.parametrize("url", [LIMITS, LIMITS + "clear/"])
def test_limits_of_an_unknown_queue_or_backend_are_a_404(operator_client, url):
    response = csrf_post(operator_client, url.replace("/emails/", "/no-such-queue/"), {"concurrency": "3"})
    assert response.status_code == 404
    assert "No queue named &#x27;no-such-queue&#x27; on backend &#x27;default&#x27;." in response.content.decode()
    unknown_backend = url.replace("/default/", "/no-such-backend/", 1)
    assert csrf_post(operator_client, unknown_backend, {"concurrency": "3"}).status_code == 404
    assert not AuditEntry.objects.exists()


def test_limits_are_refused_to_a_viewer_with_403_and_anonymous_users_go_to_log_in(client_as, viewer, backend, seeded):
    from django.test import Client

    from threadmill.limits import NO_LIMIT

    assert LIMITS not in client_as(viewer).get("/threadmill/").content.decode()
    assert client_as(viewer).get(LIMITS).status_code == 403
    for url in (LIMITS, LIMITS + "clear/"):
        assert csrf_post(client_as(viewer), url, {"concurrency": "3"}).status_code == 403
        response = Client().post(url, {"concurrency": "3"})
        assert response.status_code == 302 and response.headers["Location"].startswith("/admin/login/?next=")
    assert runtime_limit(backend) == NO_LIMIT and not AuditEntry.objects.exists()


def test_limits_refuse_a_post_without_the_csrf_token_and_clearing_refuses_get(operator_client, backend):
    from threadmill.limits import NO_LIMIT

    assert operator_client.post(LIMITS, {"concurrency": "3"}).status_code == 403
    assert operator_client.get(LIMITS + "clear/").status_code == 405
    assert runtime_limit(backend) == NO_LIMIT


# -- the overview's first render --------------------------------------------------------------


def test_the_first_render_reads_the_workers_heartbeats_instead_of_waiting_for_telemetry(
    operator_client, backend, seeded, live_worker, monkeypatch
):
    from threadmill import api

    monkeypatch.setattr(api.hub(), "started_at", time.time())  # the site has just started listening
    html = operator_client.get("/threadmill/").content.decode()
    assert "Waiting for worker telemetry" not in html
    assert "1 live worker." in html
    workers = operator_client.get("/threadmill/workers/").content.decode()
    assert f'data-worker="{live_worker}"' in workers


def test_every_page_links_a_favicon_that_is_served(operator_client, seeded):
    html = operator_client.get("/threadmill/").content.decode()
    assert 'rel="icon" href="/static/inspector/favicon.svg"' in html


# -- quiet and stop a worker ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("command", "pending", "reported"), [("quiet", "quieting", "quiet"), ("stop", "stopping", "stopping")]
)
def test_a_worker_command_shows_pending_until_the_worker_reports_its_state(
    operator_client, backend, seeded, live_worker, monkeypatch, command, pending, reported
):
    from threadmill import api

    monkeypatch.setattr(api.hub(), "started_at", time.time())
    response = csrf_post(operator_client, f"/threadmill/workers/default/{live_worker}/{command}/", {}, headers=HTMX)
    assert response.status_code == 302 and response.headers["Location"] == "/threadmill/workers/"
    assert backend.pending_control()[live_worker]["command"] == command
    assert backend.pending_control()[live_worker]["by"] == "operator"
    html = operator_client.get("/threadmill/workers/").content.decode()
    assert f'data-shown="{pending}"' in html
    assert backend.take_control([live_worker]) == {live_worker: command}  # the supervisor takes it
    backend.heartbeat(live_worker, worker_document(live_worker, state=reported), publish=False)
    assert f'data-shown="{reported}"' in operator_client.get("/threadmill/workers/").content.decode()
    entry = AuditEntry.objects.get()
    assert (entry.action, entry.scope) == (command, f"worker {live_worker}")


def test_a_command_to_a_worker_that_is_not_live_is_a_404_and_is_not_stored(operator_client, backend, seeded):
    dead(backend, "gone:1")
    assert csrf_post(operator_client, "/threadmill/workers/default/gone:1/stop/", {}).status_code == 404
    assert csrf_post(operator_client, "/threadmill/workers/default/gone:1/kill/", {}).status_code == 404
    assert backend.pending_control() == {}
    assert not AuditEntry.objects.exists()


# -- orphaned running tasks --------------------------------------------------------------------


@pytest.fixture
def leases(backend, raw):
    """Three running tasks: on a dead worker, with an overdue lease, and on a live worker with a current lease."""
    from tests.tasks import echo

    ids = {}
    for name, worker in (("gone", "dead:1"), ("overdue", "late:1"), ("live", "alive:1")):
        ids[name] = echo.enqueue(name).id
        (leased,) = backend.acquire("default", worker=worker)
        assert leased.id == ids[name]
    dead(backend, "dead:1")
    heartbeat(backend, "late:1", age_s=-600)
    heartbeat(backend, "alive:1", age_s=-600)
    raw.zadd("threadmill:{default}:default:running", {ids["overdue"]: 1})
    return ids


def test_the_running_page_flags_a_gone_worker_and_an_overdue_lease(operator_client, leases):
    html = operator_client.get("/threadmill/default/default/running/").content.decode()
    rows = {name: next(row for row in html.split("<tr") if task_id in row) for name, task_id in leases.items()}
    assert 'data-flag="gone"' in rows["gone"] and 'data-flag="overdue"' not in rows["gone"]
    assert 'data-flag="overdue"' in rows["overdue"] and 'data-flag="gone"' not in rows["overdue"]
    assert "data-flag" not in rows["live"]
    assert "Requeue all 2 orphaned" in html


@pytest.mark.parametrize(("flag", "shown"), [("gone", "gone"), ("overdue", "overdue")])
def test_the_lease_filter_lists_only_the_flagged_tasks(operator_client, leases, flag, shown):
    for headers in ({}, HTMX):
        html = operator_client.get(
            f"/threadmill/default/default/running/?lease={flag}", headers=headers
        ).content.decode()
        assert leases[shown] in html
        assert all(task_id not in html for name, task_id in leases.items() if name != shown)
        assert "1 task" in html
    assert headers and html.lstrip().startswith('<div id="tasks-table"')


@pytest.mark.parametrize("query", ["lease=bogus", "lease=gone%0A", "lease=GONE", "lease=" + "x" * 300])
def test_a_bad_lease_filter_is_a_400_naming_it(operator_client, leases, query):
    response = operator_client.get(f"/threadmill/default/default/running/?{query}")
    assert response.status_code == 400
    assert "The lease filter is gone or overdue" in response.content.decode()


def test_the_lease_filter_on_another_segment_is_a_400(operator_client, leases):
    response = operator_client.get("/threadmill/default/default/ready/?lease=gone")
    assert response.status_code == 400
    assert "applies to the running segment only" in response.content.decode()


def test_requeue_all_orphaned_moves_gone_and_overdue_tasks_and_never_a_live_lease(operator_client, backend, leases):
    response = csrf_post(operator_client, "/threadmill/default/default/running/requeue-orphaned/", {}, headers=HTMX)
    assert response.status_code == 302
    assert set(backend.in_segment("default", "ready", list(leases.values()))) == {leases["gone"], leases["overdue"]}
    assert backend.in_segment("default", "running", list(leases.values())) == [leases["live"]]
    entry = AuditEntry.objects.get()
    assert (entry.action, entry.scope, entry.count) == ("requeue", "orphaned", 2)
    assert set(entry.task_ids) == {leases["gone"], leases["overdue"]}
    html = operator_client.get("/threadmill/default/default/running/").content.decode()
    assert "Requeued 2 tasks whose worker is gone or whose lease is overdue." in html


def test_a_viewer_sees_no_orphan_action_and_is_refused_it(client_as, viewer, backend, leases):
    client = client_as(viewer)
    assert "requeue-orphaned" not in client.get("/threadmill/default/default/running/").content.decode()
    assert csrf_post(client, "/threadmill/default/default/running/requeue-orphaned/", {}).status_code == 403
    assert len(backend.in_segment("default", "running", list(leases.values()))) == 3


# -- every segment page ------------------------------------------------------------------------


@pytest.mark.parametrize("segment", ["ready", "deferred", "running", "successful", "failed", "unreadable"])
def test_every_segment_page_has_an_attempts_column(operator_client, seeded, segment):
    html = operator_client.get(f"/threadmill/default/default/{segment}/").content.decode()
    assert '<th scope="col">Attempts</th>' in html


# -- schedules ----------------------------------------------------------------------------------


def test_the_schedules_page_lists_each_schedule_with_its_next_run(operator_client, scheduled):
    html = operator_client.get("/threadmill/schedules/").content.decode()
    assert 'data-schedule="nightly-echo" data-state="enabled"' in html
    assert "tests.tasks.echo" in html and "0 3 * * *" in html
    assert scheduled.next_tick(datetime.now(UTC)).strftime("%Y-%m-%d 03:00:00") in html
    assert "never" in html
    assert 'href="/threadmill/schedules/"' in html  # the nav links it


def test_the_schedules_page_says_when_none_is_configured(operator_client, backend):
    assert "No schedule is configured." in operator_client.get("/threadmill/schedules/").content.decode()


def test_run_now_enqueues_one_run_links_it_as_the_last_run_and_audits_it(operator_client, backend, scheduled):
    response = csrf_post(operator_client, "/threadmill/schedules/default/nightly-echo/run/", {}, headers=HTMX)
    assert response.status_code == 302 and response.headers["Location"] == "/threadmill/schedules/"
    task_id = backend.schedule_states()["nightly-echo"]["last_task"]
    assert backend.get_result(task_id).args == ["<b>nightly</b>"]
    html = operator_client.get("/threadmill/schedules/").content.decode()
    assert f'href="/threadmill/default/task/{task_id}/" class="last-task"' in html
    assert f"Enqueued a run of nightly-echo now: task {task_id}." in html
    entry = AuditEntry.objects.get()
    assert (entry.action, entry.scope, entry.task_ids) == ("run_now", "schedule nightly-echo", [task_id])


def test_pausing_and_resuming_a_schedule_is_stored_in_redis_and_audited(operator_client, backend, scheduled):
    assert csrf_post(operator_client, "/threadmill/schedules/default/nightly-echo/pause/", {}).status_code == 302
    assert backend.schedule_states()["nightly-echo"]["paused"]["by"] == "operator"
    html = operator_client.get("/threadmill/schedules/").content.decode()
    assert 'data-state="paused"' in html and "by operator since" in html
    assert csrf_post(operator_client, "/threadmill/schedules/default/nightly-echo/resume/", {}).status_code == 302
    assert backend.schedule_states()["nightly-echo"]["paused"] is None
    assert list(AuditEntry.objects.order_by("id").values_list("action", flat=True)) == ["pause", "resume"]


def test_an_unknown_schedule_or_command_is_a_404(operator_client, scheduled):
    assert csrf_post(operator_client, "/threadmill/schedules/default/no-such/run/", {}).status_code == 404
    assert csrf_post(operator_client, "/threadmill/schedules/default/nightly-echo/delete/", {}).status_code == 404
    assert not AuditEntry.objects.exists()


def test_a_viewer_sees_schedules_without_controls_and_is_refused_them(client_as, viewer, backend, scheduled):
    client = client_as(viewer)
    html = client.get("/threadmill/schedules/").content.decode()
    assert "nightly-echo" in html and "Run now" not in html
    for command in ("pause", "resume", "run"):
        assert csrf_post(client, f"/threadmill/schedules/default/nightly-echo/{command}/", {}).status_code == 403
    assert backend.schedule_states()["nightly-echo"]["last_task"] is None
