"""cancel_workflow and retry_workflow beside real worker pools: an abort that reaches a run, a retry that finishes."""

from __future__ import annotations

import pytest
from django.tasks import TaskResultStatus, task_backends

from tests import tasks
from tests.worker.conftest import start_worker, wait_until  # noqa: F401 - start_worker is a fixture
from threadmill.workflows import Workflow

pytestmark = pytest.mark.slow

CANCELLED = "threadmill.exceptions.TaskCancelled"
UPSTREAM_FAILED = "threadmill.exceptions.UpstreamFailed"


@pytest.fixture
def backend():
    return task_backends["default"]


def _final(run) -> None:
    """Wait until every task of the workflow `run` is final."""

    def final():
        run.refresh()
        return run.counts["SUCCESSFUL"] + run.counts["FAILED"] == len(run.tasks)

    wait_until(final, f"workflow {run.id} is final")


def test_cancel_workflow_aborts_the_running_task_and_cancels_the_rest(backend, start_worker):
    wf = Workflow()
    root = wf.add(tasks.run_until_aborted, ("root",), name="root")
    left = wf.add(tasks.echo, after=[root], name="left")
    wf.add(tasks.echo, after=[root], name="right")
    wf.add(tasks.echo, after=[left], name="last")
    run = wf.enqueue()
    start_worker("-w", "1", "-t", "1", "-q", "default")
    wait_until(lambda: backend.client.sismember("test:started", "root"), "the root started")
    assert backend.cancel_workflow(run.id) == 4
    _final(run)
    assert run.status == TaskResultStatus.FAILED
    assert {name: r.errors[-1].exception_class_path for name, r in run.tasks.items()} == dict.fromkeys(
        ("root", "left", "right", "last"), CANCELLED
    )
    assert run.tasks["root"].worker_ids  # it ran, and ended when it saw the request


def test_retry_workflow_reruns_the_failed_and_the_upstream_failed_tasks_until_the_workflow_succeeds(
    backend, start_worker
):
    backend.client.sadd("test:failing", "root")
    wf = Workflow()
    root = wf.add(tasks.fail_while_flagged, ("root",), name="root")
    left = wf.add(tasks.echo, ("left",), after=[root], name="left")
    wf.add(tasks.echo, ("right",), after=[root], name="right")
    wf.add(tasks.echo, ("last",), after=[left], name="last")
    run = wf.enqueue()
    start_worker("-w", "1", "-t", "2", "-q", "default")
    _final(run)
    assert run.status == TaskResultStatus.FAILED
    assert run.tasks["last"].errors[-1].exception_class_path == UPSTREAM_FAILED
    backend.client.srem("test:failing", "root")
    assert backend.retry_workflow(run.id) == 4
    _final(run)
    assert run.status == TaskResultStatus.SUCCESSFUL
    assert run.counts == {"WAITING": 0, "READY": 0, "RUNNING": 0, "SUCCESSFUL": 4, "FAILED": 0}
    assert [r.return_value for r in run.tasks.values()] == ["root", "left", "right", "last"]
    assert backend.client.ttl(f"threadmill:{{default}}:workflow:{run.id}") > 0


def test_a_parent_that_passes_its_time_limit_fails_its_child_and_the_workflow_finishes(backend, start_worker):
    wf = Workflow()
    root = wf.add(tasks.sleep_past_its_limit, name="root")
    wf.add(tasks.echo, after=[root], name="child")
    run = wf.enqueue()
    start_worker("-w", "1", "-t", "1", "-q", "default")
    _final(run)
    assert run.tasks["root"].errors[-1].exception_class_path == "threadmill.exceptions.TaskTimeout"
    assert run.tasks["child"].errors[-1].exception_class_path == UPSTREAM_FAILED
    assert run.counts == {"WAITING": 0, "READY": 0, "RUNNING": 0, "SUCCESSFUL": 0, "FAILED": 2}
    assert backend.client.ttl(f"threadmill:{{default}}:workflow:{run.id}") > 0
