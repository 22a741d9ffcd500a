"""cancel_workflow and retry_workflow through the backend, key by key, and a crash between two of their calls."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.tasks import TaskResultStatus, task_backends
from django.tasks.exceptions import TaskResultDoesNotExist

from tests import tasks
from tests.backends.conftest import finish
from threadmill.backends import workflows as backend_workflows
from threadmill.backends.broker.sweeper import Sweeper
from threadmill.base import Segment
from threadmill.outcome import error_of, mark_failed
from threadmill.workflows import Workflow

PREFIX = "threadmill:{default}"
UPSTREAM_FAILED = "threadmill.exceptions.UpstreamFailed"
CANCELLED = "threadmill.exceptions.TaskCancelled"


@pytest.fixture
def backend():
    return task_backends["default"]


def _tree():
    """Enqueue root -> (a, b), a -> c, and a deferred root d; return the run and the nodes by name."""
    wf = Workflow()
    root = wf.add(tasks.echo, name="root")
    a = wf.add(tasks.echo, after=[root], name="a")
    wf.add(tasks.echo, after=[root], name="b")
    wf.add(tasks.echo, after=[a], name="c")
    wf.add(tasks.echo.using(run_after=datetime.now(UTC) + timedelta(hours=1)), name="d")
    run = wf.enqueue()
    return run, {node.name: node for node in wf.nodes}


def _counts(backend, run) -> dict[str, int]:
    return backend.get_workflow(run.id).counts


def _error_path(backend, task_id: str) -> str:
    return backend.get_result(task_id).errors[-1].exception_class_path


def _leftover_sets(backend, run) -> list[bytes]:
    return [key for key in backend.client.keys(f"{PREFIX}:*") if b":pending:" in key or b":children:" in key]


def _fail(backend, result) -> bool:
    """Record a leased run failed with an error and acknowledge it, as its worker would."""
    mark_failed(result, error_of(RuntimeError("boom")), datetime.now(UTC))
    return backend.acknowledge(result)


def test_cancel_workflow_records_every_task_that_has_not_run_cancelled(backend):
    run, nodes = _tree()
    assert backend.cancel_workflow(run.id) == 5
    assert {name: _error_path(backend, node.id) for name, node in nodes.items()} == dict.fromkeys(nodes, CANCELLED)
    assert _counts(backend, run) == {"WAITING": 0, "READY": 0, "RUNNING": 0, "SUCCESSFUL": 0, "FAILED": 5}
    assert backend.client.zcard(f"{PREFIX}:default:waiting") == 0
    assert backend.client.ttl(f"{PREFIX}:workflow:{run.id}") > 0
    assert _leftover_sets(backend, run) == []
    assert int(backend.client.hget(f"{PREFIX}:default:totals", "cancelled")) == 5
    assert backend.cancel_workflow(run.id) == 0


def test_cancel_workflow_asks_a_running_task_to_abort_and_counts_it_when_it_ends(backend):
    run, nodes = _tree()
    leased = backend.acquire("default", worker="w")[0]
    assert leased.id == nodes["root"].id
    assert backend.cancel_workflow(run.id, by="ops") == 5
    assert b'"by": "ops"' in backend.client.hget(f"{PREFIX}:task:{leased.id}", "abort_requested")
    assert _counts(backend, run) == {"WAITING": 0, "READY": 0, "RUNNING": 1, "SUCCESSFUL": 0, "FAILED": 4}
    assert _fail(backend, leased) is True  # the worker saw the request and ended the run
    assert backend.get_workflow(run.id).status == TaskResultStatus.FAILED
    assert backend.client.ttl(f"{PREFIX}:workflow:{run.id}") > 0
    assert _leftover_sets(backend, run) == []


def test_an_unknown_workflow_id_raises_for_a_cancel_and_a_retry(backend):
    with pytest.raises(TaskResultDoesNotExist, match="No workflow with id 'nope' is stored."):
        backend.cancel_workflow("nope")
    with pytest.raises(TaskResultDoesNotExist, match="No workflow with id 'nope' is stored."):
        backend.retry_workflow("nope")


def test_retry_workflow_requeues_the_failed_task_and_makes_its_upstream_failed_children_wait(backend):
    run, nodes = _tree()
    assert _fail(backend, backend.acquire("default", worker="w")[0]) is True
    assert _error_path(backend, nodes["c"].id) == UPSTREAM_FAILED
    assert backend.retry_workflow(run.id) == 4
    assert [backend.get_result(nodes[n].id).segment for n in ("root", "a", "b", "c", "d")] == [
        Segment.READY, Segment.WAITING, Segment.WAITING, Segment.WAITING, Segment.DEFERRED,
    ]  # fmt: skip
    client = backend.client
    assert client.smembers(f"{PREFIX}:pending:{nodes['c'].id}") == {nodes["a"].id.encode()}
    assert client.smembers(f"{PREFIX}:children:{nodes['root'].id}") == {nodes["a"].id.encode(), nodes["b"].id.encode()}
    assert _counts(backend, run) == {"WAITING": 3, "READY": 2, "RUNNING": 0, "SUCCESSFUL": 0, "FAILED": 0}
    assert client.ttl(f"{PREFIX}:workflow:{run.id}") == -1
    assert not client.hexists(f"{PREFIX}:workflow:{run.id}", "finished_at")
    # The root's new run releases its children as its first run would have.
    assert finish(backend, backend.acquire("default", worker="w")[0]) is True
    assert backend.get_result(nodes["a"].id).segment is Segment.READY
    assert backend.retry_workflow(run.id) == 0


def test_retry_workflow_sends_a_failed_task_whose_parents_succeeded_to_ready(backend):
    run, nodes = _tree()
    assert finish(backend, backend.acquire("default", worker="w")[0]) is True
    first, second = backend.acquire("default", count=2, worker="w")
    leased_a = first if first.id == nodes["a"].id else second
    assert _fail(backend, leased_a) is True
    assert backend.retry_workflow(run.id) == 2
    result = backend.get_result(nodes["a"].id)
    assert result.segment is Segment.READY
    assert result.errors  # the failed run's errors are kept, as a requeue keeps them
    assert backend.get_result(nodes["c"].id).segment is Segment.WAITING
    assert _counts(backend, run)["FAILED"] == 0


def test_a_retry_cut_short_between_two_calls_is_finished_by_calling_again(backend, monkeypatch):
    run, _ = _tree()
    assert _fail(backend, backend.acquire("default", worker="w")[0]) is True
    monkeypatch.setattr(backend_workflows, "STEPS_PER_CALL", 3)  # the root and a (and its parent), then b, then c
    calls = []
    real = backend.scripts.retry_workflow

    def crash_after_the_first_call(*args):
        if calls:
            raise SystemExit("the process died here")
        calls.append(args)
        return real(*args)

    monkeypatch.setattr(backend.scripts, "retry_workflow", crash_after_the_first_call)
    with pytest.raises(SystemExit):
        backend.retry_workflow(run.id)
    # Consistent between the calls: the root is ready, a waits for it, b and c are still failed; the sweep agrees.
    assert _counts(backend, run) == {"WAITING": 1, "READY": 2, "RUNNING": 0, "SUCCESSFUL": 0, "FAILED": 2}
    assert Sweeper(backend).sweep("default", 0) == 0
    monkeypatch.setattr(backend.scripts, "retry_workflow", real)
    assert backend.retry_workflow(run.id) == 2
    assert _counts(backend, run) == {"WAITING": 3, "READY": 2, "RUNNING": 0, "SUCCESSFUL": 0, "FAILED": 0}


def test_a_cancel_cut_short_between_two_calls_is_finished_by_calling_again(backend, monkeypatch):
    run, _ = _tree()
    monkeypatch.setattr(backend_workflows, "STEPS_PER_CALL", 2)
    calls = []
    real = backend.scripts.cancel_workflow

    def crash_after_the_first_call(*args):
        if calls:
            raise SystemExit("the process died here")
        calls.append(args)
        return real(*args)

    monkeypatch.setattr(backend.scripts, "cancel_workflow", crash_after_the_first_call)
    with pytest.raises(SystemExit):
        backend.cancel_workflow(run.id)
    assert _counts(backend, run) == {"WAITING": 2, "READY": 1, "RUNNING": 0, "SUCCESSFUL": 0, "FAILED": 2}
    monkeypatch.setattr(backend.scripts, "cancel_workflow", real)
    assert backend.cancel_workflow(run.id) == 3
    assert _counts(backend, run)["FAILED"] == 5
    assert _leftover_sets(backend, run) == []


def test_a_settle_cut_short_by_its_budget_lets_the_parents_children_set_expire(backend):
    wf = Workflow()
    root = wf.add(tasks.echo)
    for _ in range(1200):  # more than one call's WORKFLOW_BUDGET of 1,000
        wf.add(tasks.echo, after=[root])
    run = wf.enqueue()
    assert _fail(backend, backend.acquire("default", worker="w")[0]) is True
    # The children left are reached through their pending sets; the set itself goes with the results.
    assert 0 < backend.client.ttl(f"{PREFIX}:children:{root.id}") <= backend.config.result_ttl
    assert Sweeper(backend).sweep("default", 0) > 0
    assert _counts(backend, run)["FAILED"] == 1201
    assert _leftover_sets(backend, run) == []
