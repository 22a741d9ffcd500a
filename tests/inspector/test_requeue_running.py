"""Requeueing running tasks from the console: a task whose worker is alive and whose lease is current is
skipped unless the operator forces it, after a warning that it may run twice.

Heartbeats are written as a worker writes them (the server's clock) and leases as acquire makes them.
"""

from __future__ import annotations

import pytest

from inspector.models import AuditEntry
from tests.inspector.conftest import TASK_KEY, csrf_post, dead, heartbeat

pytestmark = pytest.mark.django_db

RUNNING_URL = "/threadmill/default/default/running/"
HTMX_VARIANTS = [pytest.param({}, id="plain"), pytest.param({"HX-Request": "true", "HX-Boosted": "true"}, id="htmx")]


@pytest.fixture
def running(backend) -> dict[str, str]:
    """Three running tasks: one on a live worker, one on a dead worker, one on a live worker whose lease is overdue."""
    from tests.tasks import echo

    ids = {name: echo.enqueue(name).id for name in ("live", "dead", "overdue")}
    for name, worker in (("live", "live:1"), ("dead", "dead:2"), ("overdue", "live:3")):
        (leased,) = backend.acquire("default", count=1, worker=worker)
        assert leased.id == ids[name]
    heartbeat(backend, "live:1")
    heartbeat(backend, "live:3")
    dead(backend, "dead:2")
    seconds, _ = backend.client.time()
    backend.client.zadd(backend.keys.segment("default", "running"), {ids["overdue"]: seconds - 10})
    return ids


def segment_of(raw, task_id: str) -> str:
    return raw.hget(TASK_KEY + task_id, "segment").decode()


def messages_after(client, response) -> str:
    return client.get(response.headers["Location"]).content.decode()


@pytest.mark.parametrize("headers", HTMX_VARIANTS)
def test_the_confirmation_warns_about_a_running_task_whose_worker_is_alive(operator_client, running, headers):
    data = {"scope": "selected", "ids": list(running.values())}
    html = csrf_post(operator_client, RUNNING_URL + "requeue/", data, headers=headers).content.decode()
    assert 'id="confirm-count">3 tasks<' in html
    assert 'id="live-count">1 running task<' in html
    assert "would run it twice at once, so it is skipped" in html
    assert '<input type="checkbox" name="force" value="yes" id="force">' in html
    assert "Force: requeue this task too; it may run twice." in html


def test_the_confirmation_of_tasks_on_dead_workers_or_overdue_leases_has_no_warning(operator_client, running):
    data = {"scope": "selected", "ids": [running["dead"], running["overdue"]]}
    html = csrf_post(operator_client, RUNNING_URL + "requeue/", data).content.decode()
    assert 'id="confirm-count">2 tasks<' in html
    assert 'id="live-warning"' not in html and 'name="force"' not in html


def test_requeue_without_force_skips_the_task_on_a_live_worker_and_says_so(operator_client, running, raw):
    data = {"scope": "selected", "ids": list(running.values()), "confirmed": "yes"}
    response = csrf_post(operator_client, RUNNING_URL + "requeue/", data)
    assert response.status_code == 302
    assert segment_of(raw, running["live"]) == "running"
    assert raw.hget(TASK_KEY + running["live"], "lease_worker") == b"live:1"
    assert segment_of(raw, running["dead"]) == segment_of(raw, running["overdue"]) == "ready"
    assert "Requeued 2 tasks; 1 running task was skipped: its worker is alive and its lease current." in messages_after(
        operator_client, response
    )
    entry = AuditEntry.objects.get()
    assert (entry.count, sorted(entry.task_ids), entry.forced) == (
        2,
        sorted([running["dead"], running["overdue"]]),
        False,
    )


def test_a_forced_requeue_moves_it_too_and_the_audit_says_it_was_forced(operator_client, running, raw):
    data = {"scope": "selected", "ids": list(running.values()), "confirmed": "yes", "force": "yes"}
    response = csrf_post(operator_client, RUNNING_URL + "requeue/", data)
    assert {segment_of(raw, task_id) for task_id in running.values()} == {"ready"}
    assert raw.zcard("threadmill:{default}:default:running") == 0
    assert "Requeued 3 tasks. Forced: a task still running on a live worker may run twice." in messages_after(
        operator_client, response
    )
    entry = AuditEntry.objects.get()
    assert (entry.count, entry.forced) == (3, True)
    assert 'data-forced="true"' in operator_client.get("/threadmill/audit/").content.decode()


def test_requeue_all_in_the_running_view_skips_live_leases_too(operator_client, running, raw):
    confirm = csrf_post(operator_client, RUNNING_URL + "requeue/", {"scope": "view"}).content.decode()
    assert 'id="confirm-count">3 tasks<' in confirm and 'id="live-count">1 running task<' in confirm
    response = csrf_post(operator_client, RUNNING_URL + "requeue/", {"scope": "view", "confirmed": "yes"})
    assert segment_of(raw, running["live"]) == "running"
    assert raw.zcard("threadmill:{default}:default:ready") == 2
    assert "1 running task was skipped" in messages_after(operator_client, response)
    assert AuditEntry.objects.get().count == 2


@pytest.mark.parametrize("force", ["on", "true", "1", "YES", "yes "])
def test_a_force_field_other_than_yes_is_a_400_and_moves_nothing(operator_client, running, raw, force):
    data = {"scope": "selected", "ids": list(running.values()), "confirmed": "yes", "force": force}
    response = csrf_post(operator_client, RUNNING_URL + "requeue/", data)
    assert response.status_code == 400
    assert "The force field is either &#x27;yes&#x27; or absent." in response.content.decode()
    assert raw.zcard("threadmill:{default}:default:running") == 3
    one = csrf_post(operator_client, f"/threadmill/default/task/{running['dead']}/requeue/", {"force": force})
    assert one.status_code == 400 and segment_of(raw, running["dead"]) == "running"
    assert not AuditEntry.objects.exists()


def test_the_task_page_of_a_task_on_a_live_worker_warns_and_offers_force(operator_client, running):
    html = operator_client.get(f"/threadmill/default/task/{running['live']}/").content.decode()
    assert 'id="live-warning"' in html and 'name="force" value="yes"' in html
    assert "It is running on a live worker: forced, it may run twice." in html  # the hx-confirm question
    for name in ("dead", "overdue"):
        html = operator_client.get(f"/threadmill/default/task/{running[name]}/").content.decode()
        assert 'id="live-warning"' not in html and 'name="force"' not in html
        assert f'hx-confirm="Requeue task {running[name]}?"' in html


@pytest.mark.parametrize("headers", HTMX_VARIANTS)
def test_requeue_one_task_on_a_live_worker_is_refused_until_forced(operator_client, running, raw, headers):
    url = f"/threadmill/default/task/{running['live']}/requeue/"
    refused = csrf_post(operator_client, url, {}, headers=headers)
    assert refused.status_code == 302
    assert segment_of(raw, running["live"]) == "running"
    assert (
        f"Task {running['live']} was not requeued: it is running, its worker is alive and its lease current."
        in messages_after(operator_client, refused)
    )
    forced = csrf_post(operator_client, url, {"force": "yes"}, headers=headers)
    assert forced.status_code == 302 and segment_of(raw, running["live"]) == "ready"
    assert f"Requeued task {running['live']}. Forced:" in messages_after(operator_client, forced)
    refusal, force = AuditEntry.objects.order_by("id")
    assert (refusal.count, refusal.task_ids, refusal.forced) == (0, [], False)
    assert (force.count, force.task_ids, force.forced) == (1, [running["live"]], True)


@pytest.mark.parametrize("name", ["dead", "overdue"])
def test_requeue_one_task_whose_worker_is_dead_or_lease_overdue_needs_no_force(operator_client, running, raw, name):
    response = csrf_post(operator_client, f"/threadmill/default/task/{running[name]}/requeue/", {})
    assert segment_of(raw, running[name]) == "ready"
    assert f"Requeued task {running[name]}." in messages_after(operator_client, response)
    assert AuditEntry.objects.get().forced is False


def test_a_worker_that_never_sent_a_heartbeat_is_not_known_dead(operator_client, seeded, raw):
    # The seeded running task is held by ghost:1, which has no heartbeat at all.
    response = csrf_post(operator_client, f"/threadmill/default/task/{seeded['running']}/requeue/", {})
    assert segment_of(raw, seeded["running"]) == "running"
    assert "was not requeued" in messages_after(operator_client, response)
