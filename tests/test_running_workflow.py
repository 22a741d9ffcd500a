"""`current_workflow()` in tasks run by real worker pools: parents read by reference and fan-out at run time."""

from __future__ import annotations

import pytest
from django.tasks import TaskResultStatus, task_backends

from tests import tasks
from tests.test_workflows import _finish, _spells
from tests.worker.conftest import start_worker, wait_until  # noqa: F401 - start_worker is a fixture
from threadmill.workflows import Workflow

pytestmark = pytest.mark.slow


@pytest.fixture
def backend():
    return task_backends["default"]


@pytest.fixture
def pool(start_worker):
    """One worker pool of two threads on the default queue, running for the test."""
    return start_worker("-w", "1", "-t", "2", "-q", "default")


def _final(backend, task_id: str):
    """Wait until task `task_id` is final; return its result."""
    wait_until(lambda: backend.get_result(task_id).is_finished, f"task {task_id} is final")
    return backend.get_result(task_id)


def test_a_plain_task_sees_no_workflow_and_a_workflow_task_sees_its_own(backend, pool):
    plain = tasks.workflow_seen.enqueue()
    wf = Workflow(name="seen")
    node = wf.add(tasks.workflow_seen, name="look")
    run = wf.enqueue()
    assert _final(backend, plain.id).return_value is None
    assert _final(backend, node.id).return_value == [run.id, "seen", "look", True]


def test_a_join_reads_its_parents_results_and_a_failed_parents_error(backend, pool):
    wf = Workflow()
    parents = [wf.add(tasks.echo, (f"value-{i}",), name=f"p{i}") for i in range(3)]
    bad = wf.add(tasks.explode, ("kaput",), name="bad")
    join = wf.add(tasks.read_parents, ("join",), after=[*parents, bad], on_parent_failure="run")
    run = wf.enqueue()
    _finish(run)
    result = backend.get_result(join.id)
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == {
        "p0": "value-0",
        "p1": "value-1",
        "p2": "value-2",
        "bad": "builtins.RuntimeError",
    }
    # By reference: the join's stored arguments are what it was enqueued with, no parent's value.
    assert result.args == ["join"] and result.kwargs == {}


def test_an_async_join_reads_its_parents_through_aparents(backend, pool):
    wf = Workflow()
    first = wf.add(tasks.echo, ("one",), name="first")
    second = wf.add(tasks.echo, ("two",), name="second")
    join = wf.add(tasks.async_read_parents, after=[first, second])
    _finish(wf.enqueue())
    assert backend.get_result(join.id).return_value == {"first": "one", "second": "two"}


def test_a_task_adds_five_that_the_join_waits_for_and_sees(backend, pool):
    wf = Workflow(name="fan-out")
    spread = wf.add(tasks.fan_out, (5, "join"), name="spread")
    join = wf.add(tasks.read_parents, ("join",), after=[spread], name="join")
    run = wf.enqueue()
    wait_until(lambda: len(backend.get_workflow(run.id).tasks) == 7, "the five tasks are added")
    _finish(run)
    added = backend.get_result(spread.id).return_value
    assert added == ["spell", "spell_2", "spell_3", "spell_4", "spell_5"]
    outcomes = backend.get_result(join.id).return_value
    assert outcomes == {"spread": added, **{name: f"added-{i}" for i, name in enumerate(added)}}
    spells = _spells(backend)
    assert all(spells[f"added-{i}"][0] >= spells["fan-out"][1] for i in range(5))
    assert spells["join"][0] >= max(spells[f"added-{i}"][1] for i in range(5))
    run.refresh()
    assert run.status == TaskResultStatus.SUCCESSFUL
    assert run.counts == {"WAITING": 0, "READY": 0, "RUNNING": 0, "SUCCESSFUL": 7, "FAILED": 0}


def test_an_async_task_adds_through_aadd(backend, pool):
    wf = Workflow()
    spread = wf.add(tasks.async_fan_out, (2, "join"), name="spread")
    join = wf.add(tasks.read_parents, ("join",), after=[spread], name="join")
    _finish(wf.enqueue())
    assert backend.get_result(join.id).return_value == {
        "spread": ["spell", "spell_2"],
        "spell": "added-0",
        "spell_2": "added-1",
    }


def test_bad_before_names_raise_in_the_task_and_store_nothing(backend, pool):
    wf = Workflow()
    root = wf.add(tasks.echo, ("root",), name="root")
    caller = wf.add(tasks.add_badly, ([["root"], ["nowhere"], ["elsewhere"]],), after=[root], name="caller")
    last = wf.add(tasks.echo, ("last",), after=[caller], name="last")
    wf.add(tasks.echo, ("elsewhere",), after=[last], name="elsewhere")
    run = wf.enqueue()
    _finish(run)
    messages = backend.get_result(caller.id).return_value
    assert messages == [
        "before= names 'root', which has started or is final: only a waiting task can wait for more. Nothing was stored.",
        f"before= names 'nowhere', which is not a node of workflow {run.id}.",
        (
            "before= names 'elsewhere', which is not a child of this task: it may not wait for this task's "
            "additions. Nothing was stored."
        ),
    ]
    run.refresh()
    assert list(run.tasks) == ["root", "caller", "last", "elsewhere"]
    assert run.counts["SUCCESSFUL"] == 4
    assert backend.client.zcard("threadmill:{default}:default:waiting") == 0


def test_a_plain_task_after_a_workflow_task_on_the_same_thread_sees_no_workflow(backend, start_worker):
    start_worker("-w", "1", "-t", "1", "-q", "default")
    wf = Workflow(name="first")
    node = wf.add(tasks.workflow_seen, name="look")
    wf.enqueue()
    assert _final(backend, node.id).return_value[2] == "look"
    assert _final(backend, tasks.workflow_seen.enqueue().id).return_value is None


def test_a_retried_task_that_names_its_additions_adds_each_once(backend, pool):
    wf = Workflow()
    spread = wf.add(tasks.add_named_then_fail_once, (3, "join"), name="spread")
    join = wf.add(tasks.read_parents, ("join",), after=[spread], name="join")
    run = wf.enqueue()
    _finish(run)
    assert int(backend.client.hget("test:runs", "add_named_then_fail_once")) == 2
    assert list(run.tasks) == ["spread", "join", "chunk-0", "chunk-1", "chunk-2"]
    assert backend.get_result(join.id).return_value == {
        "spread": [run.tasks[f"chunk-{i}"].id for i in range(3)],
        **{f"chunk-{i}": f"chunk-{i}" for i in range(3)},
    }


def test_a_retried_task_that_adds_without_names_adds_each_once(backend, pool):
    wf = Workflow()
    spread = wf.add(tasks.add_unnamed_then_fail_once, (3, "join"), name="spread")
    join = wf.add(tasks.read_parents, ("join",), after=[spread], name="join")
    run = wf.enqueue()
    _finish(run)
    assert int(backend.client.hget("test:runs", "add_unnamed_then_fail_once")) == 2
    assert backend.get_result(spread.id).return_value == ["spell", "spell_2", "spell_3"]
    assert list(run.tasks) == ["spread", "join", "spell", "spell_2", "spell_3"]
    assert backend.get_result(join.id).return_value == {
        "spread": ["spell", "spell_2", "spell_3"],
        **{name: f"unnamed-{i}" for i, name in enumerate(["spell", "spell_2", "spell_3"])},
    }
    assert run.counts == {"WAITING": 0, "READY": 0, "RUNNING": 0, "SUCCESSFUL": 5, "FAILED": 0}
