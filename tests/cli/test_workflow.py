"""`manage.py threadmill workflow show|cancel|retry ID` and the waiting count of `status`."""

from __future__ import annotations

import json

from django.tasks import TaskResultStatus, task_backends

from tests import tasks
from tests.cli.test_status import threadmill
from threadmill.workflows import Workflow


def _chain():
    wf = Workflow(name="nightly")
    first = wf.add(tasks.echo, ("a",), name="first")
    wf.add(tasks.echo, ("b",), after=[first], name="second")
    return wf.enqueue()


def test_show_prints_the_status_the_counts_and_a_row_per_node():
    run = _chain()

    done = threadmill("workflow", "show", run.id)

    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == f"Workflow {run.id} 'nightly': READY"
    assert lines[1] == "waiting 1  ready 1  running 0  successful 0  failed 0"
    assert lines[3].split() == ["node", "state", "queue", "task", "id", "after", "error"]
    assert lines[4].split() == ["first", "READY", "default", run.tasks["first"].id, "-", "-"]
    assert lines[5].split() == ["second", "WAITING", "default", run.tasks["second"].id, "first", "-"]


def test_show_json_is_one_document_with_the_counts_and_every_node():
    run = _chain()

    done = threadmill("workflow", "show", run.id, "--json", "--backend", "default")

    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {
        "id": run.id,
        "name": "nightly",
        "backend": "default",
        "status": "READY",
        "counts": {"WAITING": 1, "READY": 1, "RUNNING": 0, "SUCCESSFUL": 0, "FAILED": 0},
        "nodes": [
            {"name": "first", "task_id": run.tasks["first"].id, "queue": "default", "state": "READY",
             "parents": [], "error": None},
            {"name": "second", "task_id": run.tasks["second"].id, "queue": "default", "state": "WAITING",
             "parents": ["first"], "error": None},
        ],
    }  # fmt: skip


def test_an_unknown_workflow_id_is_a_one_line_error_naming_it_for_each_action():
    for action in ("show", "cancel", "retry"):
        done = threadmill("workflow", action, "no-such-workflow")

        assert done.returncode == 1
        assert (
            done.stderr.strip()
            == "CommandError: No workflow with id 'no-such-workflow' is stored on backend 'default'."
        )


def test_cancel_then_retry_through_the_command_line():
    backend = task_backends["default"]
    run = _chain()

    cancelled = threadmill("workflow", "cancel", run.id)

    assert cancelled.returncode == 0, cancelled.stderr
    assert cancelled.stdout.strip() == f"Workflow {run.id}: 2 tasks cancelled or asked to abort."
    run.refresh()
    assert run.status == TaskResultStatus.FAILED

    retried = threadmill("workflow", "retry", run.id)

    assert retried.returncode == 0, retried.stderr
    assert retried.stdout.strip() == f"Workflow {run.id}: 2 tasks made ready or waiting again."
    run.refresh()
    assert run.counts == {"WAITING": 1, "READY": 1, "RUNNING": 0, "SUCCESSFUL": 0, "FAILED": 0}
    assert backend.get_result(run.tasks["second"].id).status == TaskResultStatus.READY


def test_status_counts_each_queues_waiting_tasks_in_its_json_and_its_table():
    _chain()

    as_json = threadmill("status", "--json")
    as_text = threadmill("status")

    queue = next(q for q in json.loads(as_json.stdout)["queues"] if q["queue"] == "default")
    assert (queue["waiting"], queue["ready"]) == (1, 1)
    lines = as_text.stdout.splitlines()
    header = next(line for line in lines if line.startswith("queue "))
    row = next(line for line in lines if line.startswith("default "))
    assert header.split()[1] == "waiting"
    assert row.split()[1:3] == ["1", "1"]
