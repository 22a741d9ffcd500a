"""Console actions and who may run them: confirmation counts, audit entries, permissions, CSRF."""

from __future__ import annotations

import pytest
from django.test import Client

from inspector.models import AuditEntry
from tests.inspector.conftest import csrf_post

pytestmark = pytest.mark.django_db


def test_anonymous_users_go_to_the_login_page(db):
    for url in ["/threadmill/", "/threadmill/workers/", "/threadmill/default/default/ready/"]:
        response = Client().get(url)
        assert response.status_code == 302
        assert response.headers["Location"].startswith("/admin/login/?next=")


def test_a_logged_in_user_who_is_not_staff_is_refused(db, client_as):
    from django.contrib.auth.models import User

    client = client_as(User.objects.create_user("someone", password="pw"))
    assert client.get("/threadmill/").status_code == 403


def test_a_viewer_sees_no_action_buttons(client_as, viewer, seeded):
    html = client_as(viewer).get("/threadmill/default/default/failed/").content.decode()
    assert seeded["failed"] in html
    assert "Requeue selected" not in html and "Purge failed" not in html and 'name="ids"' not in html
    assert (
        "Requeue this task"
        not in client_as(viewer).get(f"/threadmill/default/task/{seeded['failed']}/").content.decode()
    )


@pytest.mark.parametrize(
    "path",
    [
        "default/default/failed/requeue/",
        "default/default/failed/delete/",
        "default/default/failed/purge/",
        "default/task/{failed}/requeue/",
    ],
)
def test_a_viewer_is_refused_every_action_with_403(client_as, viewer, seeded, raw, path):
    url = "/threadmill/" + path.format(failed=seeded["failed"])
    data = {"scope": "selected", "ids": [seeded["failed"]], "confirmed": "yes", "confirm": "default"}
    assert csrf_post(client_as(viewer), url, data).status_code == 403
    assert raw.zcard("threadmill:{default}:default:failed") == 1
    assert not AuditEntry.objects.exists()


def test_a_post_without_the_csrf_token_is_refused(operator_client, seeded, raw):
    url = "/threadmill/default/default/failed/requeue/"
    response = operator_client.post(url, {"scope": "selected", "ids": [seeded["failed"]], "confirmed": "yes"})
    assert response.status_code == 403
    assert raw.zcard("threadmill:{default}:default:failed") == 1


def test_actions_refuse_get(operator_client, seeded):
    assert operator_client.get("/threadmill/default/default/failed/requeue/").status_code == 405


def test_requeue_selected_confirms_with_the_server_count_then_acts_and_audits(operator_client, operator, seeded, raw):
    url = "/threadmill/default/default/running/requeue/"
    ids = [seeded["running"], seeded["ready"]]  # the ready one is not in this segment
    raw.zadd("threadmill:{default}:default:running", {seeded["running"]: 1})  # stuck: its lease is overdue
    confirm = csrf_post(operator_client, url, {"scope": "selected", "ids": ids})
    assert confirm.status_code == 200
    assert 'id="confirm-count">1 task<' in confirm.content.decode()
    assert 'id="live-warning"' not in confirm.content.decode()
    assert raw.zcard("threadmill:{default}:default:running") == 1
    done = csrf_post(operator_client, url, {"scope": "selected", "ids": ids, "confirmed": "yes"})
    assert done.status_code == 302 and done.headers["Location"] == "/threadmill/default/default/running/"
    assert raw.zcard("threadmill:{default}:default:running") == 0
    assert raw.hget("threadmill:{default}:task:" + seeded["running"], "segment") == b"ready"
    entry = AuditEntry.objects.get()
    assert (entry.username, entry.action, entry.segment, entry.count, entry.task_ids, entry.forced) == (
        "operator",
        "requeue",
        "running",
        1,
        [seeded["running"]],
        False,
    )
    page = operator_client.get(done.headers["Location"]).content.decode()
    assert "Requeued 1 task." in page


def test_requeue_all_of_a_filtered_view(operator_client, backend, raw):
    from datetime import UTC, datetime, timedelta

    from tests.tasks import add, echo

    later = datetime.now(UTC) + timedelta(hours=1)
    for i in range(30):
        echo.using(run_after=later).enqueue(i)
        add.using(run_after=later).enqueue(i, i)
    url = "/threadmill/default/default/deferred/requeue/"
    data = {"scope": "view", "task": "tests.tasks.add"}
    assert 'id="confirm-count">30 tasks<' in csrf_post(operator_client, url, data).content.decode()
    response = csrf_post(operator_client, url, {**data, "confirmed": "yes"})
    assert response.headers["Location"] == "/threadmill/default/default/deferred/?task=tests.tasks.add"
    assert raw.zcard("threadmill:{default}:default:ready") == 30
    assert raw.zcard("threadmill:{default}:default:deferred") == 30
    assert AuditEntry.objects.get().count == 30


def test_the_confirmation_as_an_htmx_request_is_a_partial(operator_client, seeded):
    response = csrf_post(
        operator_client,
        "/threadmill/default/default/failed/requeue/",
        {"scope": "view"},
        headers={"HX-Request": "true"},
    )
    assert response.content.decode().lstrip().startswith('<div id="action-confirmation"')


def test_requeueing_the_ready_segment_is_a_400(operator_client, seeded):
    response = csrf_post(operator_client, "/threadmill/default/default/ready/requeue/", {"scope": "view"})
    assert response.status_code == 400
    assert "already waiting to run" in response.content.decode()


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        ({"scope": "selected"}, "Select at least one task."),
        ({"scope": "selected", "ids": ["bad id!"]}, "The selection holds a malformed task id."),
        ({"scope": "selected", "ids": ["good-id\n"]}, "The selection holds a malformed task id."),
        ({"scope": "everything"}, "Select a valid choice."),
        ({"scope": "selected", "ids": [f"id-{i}" for i in range(501)]}, "Select at most 500 tasks"),
        ({"scope": "view", "task": "no spaces"}, "The task path filter must be a dotted Python path"),
    ],
)
def test_a_malformed_selection_is_a_400_with_the_reason(operator_client, seeded, data, reason):
    response = csrf_post(operator_client, "/threadmill/default/default/failed/requeue/", data)
    assert response.status_code == 400
    assert reason in response.content.decode()


def test_delete_selected_removes_only_tasks_of_this_segment(operator_client, seeded, raw):
    url = "/threadmill/default/default/failed/delete/"
    data = {"scope": "selected", "ids": [seeded["failed"], seeded["ready"]], "confirmed": "yes"}
    response = csrf_post(operator_client, url, data)
    assert response.status_code == 302
    assert not raw.exists("threadmill:{default}:task:" + seeded["failed"])
    assert raw.exists("threadmill:{default}:task:" + seeded["ready"])
    assert AuditEntry.objects.get().task_ids == [seeded["failed"]]


def test_purge_needs_the_queue_name_typed(operator_client, seeded, raw):
    url = "/threadmill/default/default/failed/purge/"
    page = operator_client.get(url)
    assert 'id="confirm-count">1 task<' in page.content.decode()
    wrong = csrf_post(operator_client, url, {"confirm": "defaul"})
    assert wrong.status_code == 400
    assert "Type the queue name, default, exactly to purge it." in wrong.content.decode()
    assert raw.zcard("threadmill:{default}:default:failed") == 1
    done = csrf_post(operator_client, url, {"confirm": "default"})
    assert done.status_code == 302
    assert raw.zcard("threadmill:{default}:default:failed") == 0
    entry = AuditEntry.objects.get()
    assert (entry.action, entry.count) == ("purge", 1)
    assert "Purged 1 task from default failed." in operator_client.get(done.headers["Location"]).content.decode()


def test_requeue_one_unreadable_task_from_its_detail_page(operator_client, seeded, raw):
    task_id = seeded["unreadable"]
    response = csrf_post(operator_client, f"/threadmill/default/task/{task_id}/requeue/", {})
    assert response.status_code == 302
    assert raw.hget("threadmill:{default}:task:" + task_id, "segment") == b"ready"
    assert AuditEntry.objects.get().task_ids == [task_id]


def test_the_audit_log_lists_entries_for_staff(operator_client, seeded):
    csrf_post(operator_client, "/threadmill/default/default/failed/purge/", {"confirm": "default"})
    html = operator_client.get("/threadmill/audit/").content.decode()
    assert 'data-action="purge"' in html and "operator" in html
    assert operator_client.get("/threadmill/audit/?page=x").status_code == 400
    assert operator_client.get("/threadmill/audit/?page=9").status_code == 404


@pytest.mark.parametrize("url", ["/threadmill/default/default/ready/", "/threadmill/", "/threadmill/metrics"])
def test_an_unreachable_server_is_a_503_page_not_a_500(operator_client, backend, monkeypatch, url):
    monkeypatch.setattr(backend, "_client", None)
    monkeypatch.setattr(backend, "_scripts", None)
    monkeypatch.setattr(backend, "redis_url", "redis://127.0.0.1:1/0")
    response = operator_client.get(url)
    assert response.status_code == 503
    assert "Cannot reach the Redis server" in response.content.decode()


def test_requeue_selected_ignores_the_ids_of_another_queue_s_tasks(operator_client, seeded, raw):
    # requeue_many.lua checks a task's segment, not its queue: given a default task's id on the emails
    # queue, it put the task in emails' ready set while it stayed in default's deferred set.
    url = "/threadmill/default/emails/deferred/requeue/"
    response = csrf_post(operator_client, url, {"scope": "selected", "ids": [seeded["deferred"]], "confirmed": "yes"})
    assert response.status_code == 302
    assert raw.zcard("threadmill:{default}:emails:ready") == 0
    assert raw.zrange("threadmill:{default}:default:deferred", 0, -1) == [seeded["deferred"].encode()]
    assert raw.hget("threadmill:{default}:task:" + seeded["deferred"], "segment") == b"deferred"
    assert AuditEntry.objects.get().count == 0


def test_a_task_page_s_requeue_leaves_a_task_that_left_the_segment_the_page_showed(operator_client, seeded, raw):
    # The page showed the task as failed; an operator elsewhere requeued it and it succeeded since:
    # a requeue posted from the stale page must not run it again.
    task_id = seeded["successful"]
    url = f"/threadmill/default/task/{task_id}/requeue/"
    page = operator_client.get(f"/threadmill/default/task/{task_id}/").content.decode()
    assert 'name="seen" form="requeue-task" value="successful"' in page

    response = csrf_post(operator_client, url, {"seen": "failed"})

    assert response.status_code == 302
    assert raw.hget("threadmill:{default}:task:" + task_id, "segment") == b"successful"
    assert (
        "was not requeued: it is no longer failed" in operator_client.get(response.headers["Location"]).content.decode()
    )
    assert AuditEntry.objects.get().count == 0
    assert csrf_post(operator_client, url, {"seen": "finished"}).status_code == 400
    assert csrf_post(operator_client, url, {"seen": "successful"}).status_code == 302
    assert raw.hget("threadmill:{default}:task:" + task_id, "segment") == b"ready"


def test_purging_the_ready_segment_settles_a_workflow_task_there(operator_client, raw):
    from django.tasks import task_backends

    from tests.tasks import echo
    from threadmill.workflows import Workflow

    wf = Workflow(name="purged")
    parent = wf.add(echo, ("parent",))
    child = wf.add(echo, ("child",), after=[parent])
    run = wf.enqueue()
    done = csrf_post(operator_client, "/threadmill/default/default/ready/purge/", {"confirm": "default"})
    assert done.status_code == 302
    backend = task_backends["default"]
    error = backend.get_result(child.id).errors[-1]
    assert error.exception_class_path == "threadmill.exceptions.UpstreamFailed"
    assert backend.get_workflow(run.id).counts["FAILED"] == 2
    assert raw.ttl("threadmill:{default}:workflow:" + run.id) > 0  # finished: it expires with the results


def test_a_refused_script_is_a_503_saying_redis_refused_it_not_that_it_is_unreachable(
    operator_client, settings, raw, redis_url
):
    from threadmill.backends.keys import KeySchema

    # A user the server refuses every script: it answers, so the page must not say unreachable.
    raw.acl_setuser("noscripts", enabled=True, passwords=["+pw"], keys=["*"], channels=["*"],
                    commands=["+@all", "-evalsha", "-eval", "-eval_ro", "-evalsha_ro", "-fcall"])  # fmt: skip
    try:
        alias = settings.TASKS["default"]
        options = {**alias.get("OPTIONS", {}), "connection": {"username": "noscripts", "password": "pw"}}
        settings.TASKS = {"default": {**alias, "OPTIONS": options}}
        response = csrf_post(operator_client, "/threadmill/default/default/pause/", {})
        page = response.content.decode()
        assert response.status_code == 503, page[:500]
        assert "Redis refused the request" in page and "unreachable" not in page
        assert raw.hgetall(KeySchema("default").paused()) == {}
    finally:
        raw.acl_deluser("noscripts")
