"""Workflows on a real server with real worker pools: joins, failure policies, counts and bad graphs."""

from __future__ import annotations

import time

import pytest
from django.tasks import TaskResultStatus, task_backends
from django.test import override_settings

from tests import tasks
from tests.worker.conftest import run_worker, start_worker, wait_until  # noqa: F401 - start_worker is a fixture
from threadmill.base import Segment
from threadmill.exceptions import WorkflowError
from threadmill.workflows import MAX_TASKS, Workflow

pytestmark = pytest.mark.slow


@pytest.fixture
def backend():
    return task_backends["default"]


@pytest.fixture
def pool(start_worker):
    """One worker pool of two threads on both queues, running for the test."""
    return start_worker("-w", "1", "-t", "2", "-q", "default,emails")


def _finish(run) -> None:
    """Wait until every task of the workflow `run` is final (the pool runs on: it was started without `--exit-empty`)."""

    def final():
        run.refresh()
        return run.counts["SUCCESSFUL"] + run.counts["FAILED"] == len(run.tasks)

    wait_until(final, f"workflow {run.id} is final")


def _spells(backend) -> dict[str, tuple[float, float]]:
    stored = backend.client.hgetall("test:spells")
    return {k.decode(): tuple(float(x) for x in v.split()) for k, v in stored.items()}


def _keys(backend) -> list[bytes]:
    return sorted(key for key in backend.client.keys("*") if not key.startswith(b"test:"))


def test_a_chain_of_three_runs_each_step_after_the_last_one_ended(backend, pool):
    wf = Workflow(name="chain")
    first = wf.add(tasks.spell, ("a",))
    second = wf.add(tasks.spell, ("b",), after=[first])
    wf.add(tasks.spell, ("c",), after=[second])
    run = wf.enqueue()
    assert run.counts == {"WAITING": 2, "READY": 1, "RUNNING": 0, "SUCCESSFUL": 0, "FAILED": 0}
    assert run.tasks["spell_2"].status == TaskResultStatus.READY
    assert backend.get_result(second.id).segment is Segment.WAITING
    _finish(run)
    spells = _spells(backend)
    assert spells["a"][1] <= spells["b"][0] and spells["b"][1] <= spells["c"][0]
    run.refresh()
    assert run.status == TaskResultStatus.SUCCESSFUL
    assert run.counts == {"WAITING": 0, "READY": 0, "RUNNING": 0, "SUCCESSFUL": 3, "FAILED": 0}
    assert [r.return_value for r in run.tasks.values()] == ["a", "b", "c"]


def test_a_diamond_joins_after_both_branches(backend, pool):
    wf = Workflow()
    top = wf.add(tasks.spell, ("top",))
    left = wf.add(tasks.spell, ("left", 0.05), after=[top])
    right = wf.add(tasks.spell.using(queue_name="emails"), ("right", 0.1), after=[top])
    wf.add(tasks.spell, ("join",), after=[left, right])
    run = wf.enqueue()
    _finish(run)
    spells = _spells(backend)
    assert spells["join"][0] >= max(spells["left"][1], spells["right"][1])
    assert min(spells["left"][0], spells["right"][0]) >= spells["top"][1]


def test_a_fan_in_of_fifty_runs_the_join_once_after_every_parent(backend, pool):
    wf = Workflow(name="fan-in")
    parents = [wf.add(tasks.spell, (f"p{i}",)) for i in range(50)]
    join = wf.add(tasks.spell, ("join",), after=parents)
    run = wf.enqueue()
    assert run.counts["WAITING"] == 1 and run.counts["READY"] == 50
    _finish(run)
    spells = _spells(backend)
    assert spells["join"][0] >= max(spells[f"p{i}"][1] for i in range(50))
    assert backend.get_result(join.id).worker_ids and len(backend.get_result(join.id).worker_ids) == 1
    run.refresh()
    assert run.counts["SUCCESSFUL"] == 51 and run.status == TaskResultStatus.SUCCESSFUL


def test_a_fan_out_of_three_thousand_is_released_well_within_a_sweep_and_runs_each_child_once(backend, pool):
    wf = Workflow(name="fan-out")
    root = wf.add(tasks.spell, ("root",))
    for i in range(3000):
        wf.add(tasks.counted, (f"c{i}",), after=[root])
    run = wf.enqueue()
    waiting = backend.keys.segment("default", Segment.WAITING)
    wait_until(lambda: backend.client.hexists("test:spells", "root"), "the root ran")
    wait_until(lambda: backend.client.zcard(waiting) == 0, "every child was released")
    # More than one call's budget (1,000 children): without the settling list the rest waits for the sweep.
    released_after = time.time() - _spells(backend)["root"][1]
    assert released_after < 1.0, f"the last children were released {released_after:.2f} s after the root ended"
    _finish(run)
    runs = {k.decode(): int(v) for k, v in backend.client.hgetall("test:runs").items()}
    assert runs == {f"c{i}": 1 for i in range(3000)}
    run.refresh()
    assert run.counts["SUCCESSFUL"] == 3001 and run.status == TaskResultStatus.SUCCESSFUL


@pytest.mark.parametrize("processes", ["1", "2"])
def test_an_exit_empty_pool_drains_a_diamond_to_its_join_then_exits(backend, processes):
    wf = Workflow()
    top = wf.add(tasks.spell, ("top", 0.3))
    left = wf.add(tasks.spell, ("left", 0.1), after=[top])
    right = wf.add(tasks.spell.using(queue_name="emails"), ("right", 0.2), after=[top])
    wf.add(tasks.spell, ("join",), after=[left, right])
    run = wf.enqueue()
    # Two processes: one runs the top while the other finds nothing and waits, idle, for the release.
    done = run_worker("--exit-empty", "-w", processes, "-t", "1", "-q", "default,emails")
    assert done.returncode == 0, done.stderr
    run.refresh()
    assert run.counts == {"WAITING": 0, "READY": 0, "RUNNING": 0, "SUCCESSFUL": 4, "FAILED": 0}
    spells = _spells(backend)
    assert spells["join"][0] >= max(spells["left"][1], spells["right"][1]) >= spells["top"][1]


def test_an_exit_empty_pool_exits_with_a_child_waiting_on_a_parent_in_a_queue_it_does_not_serve(backend):
    wf = Workflow()
    parent = wf.add(tasks.spell.using(queue_name="emails"), ("parent",))
    child = wf.add(tasks.spell, ("child",), after=[parent])
    wf.add(tasks.spell, ("alone",))
    wf.enqueue()
    done = run_worker("--exit-empty", "-w", "1", "-t", "1", "-q", "default")
    assert done.returncode == 0, done.stderr
    assert set(_spells(backend)) == {"alone"}
    assert backend.get_result(child.id).segment is Segment.WAITING
    assert backend.get_result(parent.id).segment is Segment.READY


def test_a_failure_cascades_down_a_three_level_graph_and_spares_the_other_branch(backend, pool):
    wf = Workflow()
    root = wf.add(tasks.spell, ("root",))
    bad = wf.add(tasks.explode, ("kaput",), after=[root])
    good = wf.add(tasks.spell, ("good",), after=[root])
    below_bad = wf.add(tasks.spell, ("below-bad",), after=[bad])
    below_both = wf.add(tasks.spell, ("below-both",), after=[bad, good])
    leaf = wf.add(tasks.spell, ("leaf",), after=[below_bad])
    run = wf.enqueue()
    _finish(run)
    assert set(_spells(backend)) == {"root", "good"}
    for node, parent in ((below_bad, "explode"), (below_both, "explode"), (leaf, "spell_3")):
        result = backend.get_result(node.id)
        assert result.status == TaskResultStatus.FAILED and result.started_at is None
        assert result.errors[-1].exception_class_path == "threadmill.exceptions.UpstreamFailed"
        assert f"Parent task {parent!r}" in result.errors[-1].traceback
        assert result.finished_at is not None
    run.refresh()
    assert run.status == TaskResultStatus.FAILED
    assert run.counts == {"WAITING": 0, "READY": 0, "RUNNING": 0, "SUCCESSFUL": 2, "FAILED": 4}
    assert backend.queue_stats()["default"][Segment.WAITING] == 0
    assert backend.queue_stats()["default"][Segment.FAILED] == 4


def test_a_run_policy_runs_the_child_after_its_parent_failed(backend, pool):
    wf = Workflow()
    bad = wf.add(tasks.explode, ("kaput",))
    clean_up = wf.add(tasks.spell, ("clean-up",), after=[bad], on_parent_failure="run")
    wf.add(tasks.spell, ("after-clean-up",), after=[clean_up])
    run = wf.enqueue()
    _finish(run)
    assert set(_spells(backend)) == {"clean-up", "after-clean-up"}
    run.refresh()
    assert run.counts["SUCCESSFUL"] == 2 and run.counts["FAILED"] == 1
    assert run.status == TaskResultStatus.FAILED


def test_a_retrying_parent_releases_its_child_once_after_its_final_success(backend, pool):
    wf = Workflow()
    parent = wf.add(tasks.spell_after_failures, ("parent", 2))
    child = wf.add(tasks.spell, ("child",), after=[parent])
    run = wf.enqueue()
    _finish(run)
    assert int(backend.client.hget("test:runs", "parent")) == 3
    spells = _spells(backend)
    assert spells["child"][0] >= spells["parent"][1]
    result = backend.get_result(child.id)
    assert result.status == TaskResultStatus.SUCCESSFUL and len(result.worker_ids) == 1
    assert len(backend.get_result(parent.id).errors) == 2


def test_get_workflow_reads_the_counts_and_the_tasks_by_node_name(backend, start_worker):
    wf = Workflow(name="report")
    load = wf.add(tasks.echo, ("load",), name="load")
    wf.add(tasks.echo, ("send",), after=[load], name="send")
    run = wf.enqueue()
    read = backend.get_workflow(run.id)
    assert (read.id, read.name, read.status) == (run.id, "report", TaskResultStatus.READY)
    assert list(read.tasks) == ["load", "send"] and read.tasks["load"].id == load.id
    assert read.counts == {"WAITING": 1, "READY": 1, "RUNNING": 0, "SUCCESSFUL": 0, "FAILED": 0}
    start_worker("-w", "1", "-t", "1", "-q", "default")
    _finish(run)
    assert backend.get_workflow(run.id).counts == {"WAITING": 0, "READY": 0, "RUNNING": 0, "SUCCESSFUL": 2, "FAILED": 0}


def test_node_names_default_to_the_function_name_numbered_when_it_repeats():
    wf = Workflow()
    assert [wf.add(tasks.echo).name, wf.add(tasks.echo).name, wf.add(tasks.add, (1, 2)).name] == [
        "echo",
        "echo_2",
        "add",
    ]


def test_an_empty_workflow_raises_and_stores_nothing(backend):
    with pytest.raises(WorkflowError, match="at least one task"):
        Workflow().enqueue()
    assert _keys(backend) == []


def test_a_parent_of_another_workflow_raises_and_stores_nothing(backend):
    other = Workflow().add(tasks.echo)
    wf = Workflow()
    wf.add(tasks.echo)
    with pytest.raises(WorkflowError, match="not a node of this workflow"):
        wf.add(tasks.echo, after=[other])
    with pytest.raises(WorkflowError, match="not a node of this workflow"):
        wf.add(tasks.echo, after=["echo"])
    wf.enqueue()
    assert backend.client.zcard("threadmill:{default}:default:ready") == 1


def test_a_task_of_another_backend_raises_and_stores_nothing(backend, settings):
    with override_settings(TASKS={**settings.TASKS, "other": {"BACKEND": "django.tasks.backends.dummy.DummyBackend"}}):
        wf = Workflow()
        wf.add(tasks.echo)
        wf.add(tasks.echo.using(backend="other"))
        with pytest.raises(WorkflowError, match="backend 'other', not of this workflow's backend 'default'"):
            wf.enqueue()
        assert _keys(backend) == []
        with pytest.raises(WorkflowError, match="not a Threadmill backend"):
            Workflow(backend="other").add(tasks.echo)


def test_a_workflow_holds_its_bound_and_refuses_one_more(backend):
    wf = Workflow()
    root = wf.add(tasks.echo)
    for _ in range(MAX_TASKS - 1):
        wf.add(tasks.echo, after=[root])
    with pytest.raises(WorkflowError, match=f"at most {MAX_TASKS} tasks"):
        wf.add(tasks.echo)
    run = wf.enqueue()
    assert run.counts["WAITING"] == MAX_TASKS - 1 and run.counts["READY"] == 1


def test_a_taken_task_id_refuses_the_whole_workflow(backend):
    wf = Workflow()
    first = wf.add(tasks.echo)
    wf.add(tasks.echo, after=[first])
    backend.client.hset(f"threadmill:{{default}}:task:{first.id}", "data", "{}")
    with pytest.raises(WorkflowError, match="nothing was stored"):
        wf.enqueue()
    assert _keys(backend) == [f"threadmill:{{default}}:task:{first.id}".encode()]
