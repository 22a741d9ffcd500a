"""The console's cancel on the task page: POST with CSRF, staff with the change permission only, audited."""

from __future__ import annotations

import pytest
from django.tasks import TaskResultStatus

from inspector.models import AuditEntry
from tests.inspector.conftest import TASK_KEY, csrf_post


@pytest.mark.parametrize("segment", ["ready", "deferred"])
def test_cancel_on_a_waiting_task_s_page_finishes_it_failed_and_audits_it(operator_client, backend, seeded, segment):
    task_id = seeded[segment]
    page = operator_client.get(f"/threadmill/default/task/{task_id}/").content.decode()
    assert 'id="cancel-task"' in page and "Cancel this task" in page

    response = csrf_post(operator_client, f"/threadmill/default/task/{task_id}/cancel/", {})

    assert response.status_code == 302
    result = backend.get_result(task_id)
    assert result.status == TaskResultStatus.FAILED
    assert "was cancelled by operator at " in result.errors[0].traceback
    entry = AuditEntry.objects.get()
    assert (entry.action, entry.segment, entry.count, entry.task_ids) == ("cancel", segment, 1, [task_id])
    assert (
        f"Cancelled task {task_id}: it will not run."
        in operator_client.get(response.headers["Location"]).content.decode()
    )


def test_cancel_on_a_running_task_s_page_asks_its_worker_to_abort(operator_client, seeded, raw):
    task_id = seeded["running"]
    assert "Abort this task" in operator_client.get(f"/threadmill/default/task/{task_id}/").content.decode()

    response = csrf_post(operator_client, f"/threadmill/default/task/{task_id}/cancel/", {})

    assert b'"by": "operator"' in raw.hget(TASK_KEY + task_id, "abort_requested")
    assert "its worker was asked to abort it" in operator_client.get(response.headers["Location"]).content.decode()
    assert AuditEntry.objects.get().task_ids == [task_id]


def test_cancel_of_a_finished_task_says_already_finished_and_changes_nothing(operator_client, backend, seeded):
    task_id = seeded["successful"]
    assert 'id="cancel-task"' not in operator_client.get(f"/threadmill/default/task/{task_id}/").content.decode()

    response = csrf_post(operator_client, f"/threadmill/default/task/{task_id}/cancel/", {})

    assert response.status_code == 302
    assert "it had already finished" in operator_client.get(response.headers["Location"]).content.decode()
    assert backend.get_result(task_id).status == TaskResultStatus.SUCCESSFUL
    assert AuditEntry.objects.get().count == 0


def test_cancel_is_refused_to_a_viewer_without_csrf_and_over_get(client_as, viewer, operator_client, seeded, raw):
    task_id = seeded["ready"]
    url = f"/threadmill/default/task/{task_id}/cancel/"
    viewer_client = client_as(viewer)
    assert 'id="cancel-task"' not in viewer_client.get(f"/threadmill/default/task/{task_id}/").content.decode()
    assert csrf_post(viewer_client, url, {}).status_code == 403
    assert operator_client.post(url, {}).status_code == 403  # no CSRF token
    assert operator_client.get(url).status_code == 405
    assert raw.hget(TASK_KEY + task_id, "segment") == b"ready"
    assert AuditEntry.objects.count() == 0
