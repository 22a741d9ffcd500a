"""The console's bulk cancel on segment pages: counts, typed confirmation, audit, permissions, bad input."""

from __future__ import annotations

import pytest
from django.tasks import TaskResultStatus

from inspector.models import AuditEntry
from tests.inspector.conftest import TASK_KEY, csrf_post

pytestmark = pytest.mark.django_db

READY = "threadmill:{default}:default:ready"


def test_cancel_selected_ready_tasks_confirms_the_count_then_cancels_and_audits(operator_client, backend, seeded, raw):
    url = "/threadmill/default/default/ready/cancel/"
    ids = [seeded["ready"], seeded["successful"]]  # the successful one has finished
    assert "Cancel selected…" in operator_client.get("/threadmill/default/default/ready/").content.decode()
    confirm = csrf_post(operator_client, url, {"scope": "selected", "ids": ids}).content.decode()
    assert 'id="cancel-count">1 task<' in confirm and 'id="abort-count">0 running tasks<' in confirm
    assert raw.zcard(READY) == 1

    done = csrf_post(operator_client, url, {"scope": "selected", "ids": ids, "confirmed": "yes"})

    assert done.status_code == 302 and done.headers["Location"] == "/threadmill/default/default/ready/"
    assert raw.zcard(READY) == 0
    assert backend.get_result(seeded["ready"]).status == TaskResultStatus.FAILED
    assert backend.get_result(seeded["successful"]).status == TaskResultStatus.SUCCESSFUL
    entry = AuditEntry.objects.get()
    assert (entry.username, entry.action, entry.segment, entry.scope, entry.count, entry.task_ids) == (
        "operator", "cancel", "ready", "selected tasks", 1, [seeded["ready"]]
    )  # fmt: skip
    page = operator_client.get(done.headers["Location"]).content.decode()
    assert "Cancelled 1 task; abort requested for 0 running tasks; 1 already finished." in page


def test_cancel_all_of_a_running_view_asks_each_worker_to_abort(operator_client, seeded, raw):
    url = "/threadmill/default/default/running/cancel/"
    confirm = csrf_post(operator_client, url, {"scope": "view"}).content.decode()
    assert 'id="cancel-count">0 tasks<' in confirm and 'id="abort-count">1 running task<' in confirm

    done = csrf_post(operator_client, url, {"scope": "view", "confirmed": "yes"})

    assert b'"by": "operator"' in raw.hget(TASK_KEY + seeded["running"], "abort_requested")
    page = operator_client.get(done.headers["Location"]).content.decode()
    assert "Cancelled 0 tasks; abort requested for 1 running task; 0 already finished." in page
    assert AuditEntry.objects.get().task_ids == [seeded["running"]]


def test_cancel_all_of_a_filtered_deferred_view_leaves_the_rest(operator_client, backend, raw):
    from datetime import UTC, datetime, timedelta

    from tests.tasks import add, echo

    later = datetime.now(UTC) + timedelta(hours=1)
    kept = [echo.using(run_after=later).enqueue(i).id for i in range(3)]
    for i in range(4):
        add.using(run_after=later).enqueue(i, i)
    url = "/threadmill/default/default/deferred/cancel/"
    data = {"scope": "view", "task": "tests.tasks.add"}
    assert 'id="confirm-count">4 tasks<' in csrf_post(operator_client, url, data).content.decode()

    done = csrf_post(operator_client, url, {**data, "confirmed": "yes"})

    assert done.headers["Location"] == "/threadmill/default/default/deferred/?task=tests.tasks.add"
    assert sorted(raw.zrange("threadmill:{default}:default:deferred", 0, -1)) == sorted(i.encode() for i in kept)
    assert raw.zcard("threadmill:{default}:default:failed") == 4
    assert AuditEntry.objects.get().count == 4


def test_cancelling_more_than_the_threshold_needs_the_queue_name_typed(operator_client, raw):
    from inspector.forms import TYPED_CANCEL_ABOVE
    from tests.tasks import echo

    for i in range(TYPED_CANCEL_ABOVE + 1):
        echo.enqueue(i)
    url = "/threadmill/default/default/ready/cancel/"
    assert 'name="confirm"' in csrf_post(operator_client, url, {"scope": "view"}).content.decode()

    refused = csrf_post(operator_client, url, {"scope": "view", "confirmed": "yes", "confirm": "defualt"})

    assert refused.status_code == 400
    assert "Type the queue name, default, exactly to cancel more than 100 tasks." in refused.content.decode()
    assert raw.zcard(READY) == TYPED_CANCEL_ABOVE + 1 and not AuditEntry.objects.exists()
    done = csrf_post(operator_client, url, {"scope": "view", "confirmed": "yes", "confirm": "default"})
    assert done.status_code == 302 and raw.zcard(READY) == 0
    assert AuditEntry.objects.get().count == TYPED_CANCEL_ABOVE + 1


def test_a_few_tasks_need_no_typing(operator_client, seeded):
    url = "/threadmill/default/default/ready/cancel/"
    confirm = csrf_post(operator_client, url, {"scope": "view"}).content.decode()
    assert 'id="cancel-count">1 task<' in confirm and 'name="confirm"' not in confirm


def test_cancel_is_refused_to_a_viewer_without_csrf_and_over_get(client_as, viewer, operator_client, seeded, raw):
    url = "/threadmill/default/default/ready/cancel/"
    data = {"scope": "selected", "ids": [seeded["ready"]], "confirmed": "yes"}
    assert "Cancel selected" not in client_as(viewer).get("/threadmill/default/default/ready/").content.decode()
    assert csrf_post(client_as(viewer), url, data).status_code == 403
    assert operator_client.post(url, data).status_code == 403  # no CSRF token
    assert operator_client.get(url).status_code == 405
    assert raw.zcard(READY) == 1 and not AuditEntry.objects.exists()


@pytest.mark.parametrize(
    ("path", "data", "status", "reason"),
    [
        (
            "failed",
            {"scope": "view"},
            400,
            "Only waiting, ready, deferred and running tasks can be cancelled, not failed ones.",
        ),
        ("successful", {"scope": "view"}, 400, "not successful ones."),
        ("ready", {"scope": "selected"}, 400, "Select at least one task."),
        ("ready", {"scope": "selected", "ids": ["<b>bad</b>"]}, 400, "The selection holds a malformed task id."),
        ("ready", {"scope": "everything"}, 400, "Select a valid choice."),
        ("ready", {"scope": "view", "task": "no spaces"}, 400, "The task path filter must be a dotted Python path"),
    ],
)
def test_bad_input_is_a_4xx_with_the_reason(operator_client, seeded, raw, path, data, status, reason):
    response = csrf_post(operator_client, f"/threadmill/default/default/{path}/cancel/", {**data, "confirmed": "yes"})
    assert response.status_code == status
    assert reason in response.content.decode()
    assert raw.zcard(READY) == 1 and not AuditEntry.objects.exists()


def test_an_unknown_queue_is_a_404(operator_client, seeded):
    response = csrf_post(operator_client, "/threadmill/default/nope/ready/cancel/", {"scope": "view"})
    assert response.status_code == 404 and "No queue named" in response.content.decode()


def test_cancel_selected_leaves_another_queue_s_task_alone(operator_client, seeded, raw):
    url = "/threadmill/default/emails/ready/cancel/"
    response = csrf_post(operator_client, url, {"scope": "selected", "ids": [seeded["ready"]], "confirmed": "yes"})
    assert response.status_code == 302
    assert raw.hget(TASK_KEY + seeded["ready"], "segment") == b"ready"
    assert AuditEntry.objects.get().count == 0
    assert "1 task could not be cancelled" in operator_client.get(response.headers["Location"]).content.decode()


def test_the_confirmation_escapes_the_filter_text_and_is_a_partial_for_htmx(operator_client, db):
    from tests.tasks import echo

    echo.enqueue("<script>alert(1)</script>")
    data = {"scope": "view", "q": "<script>alert(1)</script>"}
    response = csrf_post(
        operator_client, "/threadmill/default/default/ready/cancel/", data, headers={"HX-Request": "true"}
    )
    html = response.content.decode()
    assert html.lstrip().startswith('<div id="cancel-confirmation"') and 'id="cancel-count">1 task<' in html
    assert "<script>alert(1)</script>" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
