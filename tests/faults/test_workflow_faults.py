"""A fan-in of 500 parents and a join under real faults: a worker process killed -9, a server restart, a frozen process.

Every task is `tests.tasks.count_step`, which logs each start and finish, with its attempt, in
one list on the counter server: the list's order is one clock for every process, so "the
join started after every parent's final run finished" is read, not inferred. A parent's final
run is its last attempt's (a run the fault cut off, or whose acknowledgement was refused, has
an older attempt). The parents succeed, fail once and are retried, or fail; the join runs
once, after every parent is final, or (a failed parent, the default policy) never starts and
is FAILED with UpstreamFailed, while a join with policy "run" runs once after all of them.
"""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import psutil
import pytest
from django.tasks import TaskResult, TaskResultStatus, task_backends

from tests import tasks
from tests.faults.conftest import FAULT_TIMEOUTS, FaultServer, Pool, Tally, wait_for
from threadmill.backends.options import DEFAULT_SWEEP_INTERVAL_S
from threadmill.outcome import WORKER_LOSS_LIMIT
from threadmill.workflows import POLICIES, Workflow, WorkflowNode, WorkflowResult

pytestmark = pytest.mark.slow

#: The fan-in's parents, and the milliseconds each sleeps: about 1.5 s of work for two processes of two threads, so the
#: fault still lands mid-drain (about 100 parents in, 400 to go); 20 ms cost the ten runs 15 to 20 s more.
PARENTS = 500
SLEEP_MS = 10
THREADS = 2
WORKER_TIMEOUT_S = float(FAULT_TIMEOUTS["THREADMILL_TEST_WORKER_TIMEOUT"])
#: How long the frozen process stays stopped: past the worker timeout, so the broker recovers its leases.
FREEZE_S = 2 * WORKER_TIMEOUT_S
#: Seconds the workflow may take to be final once the fault is over (the recovery, the rest of the drain).
AFTER_FAULT_S = 30.0
#: The error a task failed by its parent records.
UPSTREAM_FAILED = "threadmill.exceptions.UpstreamFailed"


@dataclass(frozen=True)
class Step:
    """One start or finish of a run, at its place `at` in the counter server's log."""

    at: int
    kind: str
    task_id: str
    attempt: int
    leased_at: float
    worker: str


def read_steps(tally: Tally) -> list[Step]:
    """Every start and finish count_step logged on the counter server, in the order it saw them."""
    steps = []
    for at, line in enumerate(tally.counter.lrange("faults:steps", 0, -1)):
        kind, task_id, attempt, leased_at, worker = line.decode().split()
        steps.append(Step(at, kind, task_id, int(attempt), float(leased_at), worker))
    return steps


def final_finish(steps: list[Step], result: TaskResult) -> Step:
    """The finish of the run whose outcome `result` holds: the one leased when its last attempt record says.

    A run the fault cut off, or whose acknowledgement was refused, was leased earlier.
    """
    (last,) = [a for a in result.attempt_records if a.outcome in ("successful", "failed")][-1:]
    finishes = [s for s in steps if s.kind == "finish" and s.task_id == result.id]
    final = [s for s in finishes if abs(s.leased_at - last.leased_at.timestamp()) < 0.001]
    assert len(final) == 1, f"task {result.id}: no single run leased at {last.leased_at} among {finishes}"
    return final[0]


def starts_of(steps: list[Step], task_id: str) -> list[Step]:
    return [s for s in steps if s.kind == "start" and s.task_id == task_id]


@pytest.fixture
def make_server(make_fault_server, settings) -> Callable[[str], FaultServer]:
    """Start a server under test and point this process's `default` backend (the workflows') at it."""

    def make(appendfsync: str) -> FaultServer:
        server = make_fault_server(appendfsync=appendfsync)
        default = settings.TASKS["default"]
        settings.TASKS = {"default": {**default, "REDIS_URL": server.url, "OPTIONS": {"lease_ttl": 60}}}
        return server

    return make


def fan_in(
    fail: str, policies: tuple[str, ...], parent_task=tasks.count_step
) -> tuple[WorkflowResult, list[WorkflowNode], dict[str, WorkflowNode]]:
    """Enqueue PARENTS parents (count_step or `parent_task`, failing as `fail` says) and a count_step join per policy."""
    wf = Workflow(name=f"fan-in-{fail}")
    kwargs = {"sleep_ms": SLEEP_MS, "fail": fail}
    parents = [wf.add(parent_task, kwargs=kwargs, name=f"p{i}") for i in range(PARENTS)]
    joins = {p: wf.add(tasks.count_step, name=f"join-{p}", after=parents, on_parent_failure=p) for p in policies}
    return wf.enqueue(), parents, joins


# -- the faults ---------------------------------------------------------------------------


@dataclass
class FaultEffect:
    """The tasks a fault may cost a run: those it may make run again (at most `rerun_limit` of them), cut off, held."""

    may_run_twice: set[str]
    cut_off: set[str]
    held: set[str]
    rerun_limit: int = 0


def kill_a_worker_process(server: FaultServer, pool: Pool, tally: Tally) -> FaultEffect:
    """kill -9 one worker process; only a task it had finished, unacknowledged, may run again."""
    victim = pool.children()[0]
    name = pool.worker_name(victim)
    handle = psutil.Process(victim)
    handle.send_signal(signal.SIGKILL)
    _, alive = psutil.wait_procs([handle], timeout=5)
    assert not alive, f"worker process {victim} outlived kill -9"
    held, started, finished = tally.leased_by(name), tally.started(), tally.finished()
    assert held and len(finished) < PARENTS, f"the killed process held no parent ({tally.summary()})"
    unacknowledged = {task_id for task_id in held if finished[task_id]}
    cut_off = {task_id for task_id in held if started[task_id] > finished[task_id]}
    return FaultEffect(unacknowledged, cut_off, set(held), len(unacknowledged))


def restart_the_server(server: FaultServer, pool: Pool, tally: Tally) -> FaultEffect:
    """Stop the server (appendfsync always) and start it again: nothing may run twice."""
    server.restart()
    assert len(tally.finished()) < PARENTS, f"the drain ended before the restart ({tally.summary()})"
    return FaultEffect(set(), set(), set(), 0)


def freeze_a_worker_process(server: FaultServer, pool: Pool, tally: Tally) -> FaultEffect:
    """SIGSTOP one worker process past the worker timeout; only a task it had taken to run may run again.

    Its runs are not cut off: they go on when it resumes, and their acknowledgements are refused.
    A consumer thread may have taken a task from the buffer and not reached its first line at the
    freeze, so beside the tasks started by then (finished unacknowledged, or running) one a thread
    may run again; every other task it held was buffered and goes back unstarted.
    """
    victim = pool.children()[0]
    name = pool.worker_name(victim)
    os.kill(victim, signal.SIGSTOP)
    try:
        started, held = set(tally.started()), tally.leased_by(name)
        assert held and len(started) < PARENTS, f"the frozen process held no parent ({tally.summary()})"
        time.sleep(FREEZE_S)  # The freeze itself, not a synchronisation.
        assert not tally.leased_by(name), "the broker did not recover the frozen process's leases"
    finally:
        os.kill(victim, signal.SIGCONT)
    wait_for(
        lambda: pool.alive() and _holds_nothing(tally.backend.worker_document(name)),
        lambda: f"the resumed process settles its buffer ({tally.backend.worker_document(name)})",
        15,
    )
    started_held = set(held) & started
    return FaultEffect(set(held), set(), set(held), len(started_held) + THREADS)


def _holds_nothing(document: dict | None) -> bool:
    return document is None or (document["buffered"] == [] and document["running"] == [])


FAULTS = {"kill-9": kill_a_worker_process, "restart": restart_the_server, "freeze": freeze_a_worker_process}


# -- the run --------------------------------------------------------------------------------


@dataclass
class Drained:
    """What a fan-in drained through a fault left: the log, the counts and who may have run twice."""

    steps: list[Step]
    finished: Counter
    effect: FaultEffect
    run: WorkflowResult


def drain_through(fault: str, fail: str, policies: tuple[str, ...], make_server, counter, start_pool, **parent_task):
    """Enqueue the fan-in, start a pool, cause `fault` mid-drain, and wait until the workflow is final."""
    server = make_server("always" if fault == "restart" else "everysec")
    tally = Tally(task_backends["default"], counter)
    run, parents, joins = fan_in(fail, policies, **parent_task)
    tally.ids = [node.id for node in parents] + [node.id for node in joins.values()]
    pool = start_pool(server, "-w", "2", "-t", str(THREADS))
    wait_for(
        lambda: pool.alive() and len(pool.children()) == 2 and len(tally.finished()) >= 100,
        lambda: f"both worker processes drain the parents ({tally.summary()})",
        30,
    )
    effect = FAULTS[fault](server, pool, tally)
    record = tally.backend.keys.workflow(run.id)

    def final() -> bool:
        total, successful, failed = (
            int(n or 0) for n in tally.backend.client.hmget(record, "total", "successful", "failed")
        )
        return pool.alive() and successful + failed == total

    wait_for(final, lambda: f"the workflow is final after the {fault} ({tally.summary()})", AFTER_FAULT_S)
    run.refresh()
    steps = read_steps(tally)
    twice = {i: n for i, n in tally.finished().items() if n > (2 if fail == "first" else 1)}
    lost = set(tally.never_ran()) - {node.id for name, node in joins.items() if name == "cancel" and fail == "always"}
    print(
        f"\n{fault}, parents failing {fail}: enqueued {len(tally.ids)}, ran {len(tally.ran())}, never ran {len(lost)} "
        f"(the cancel join of failing parents aside), "
        f"ran twice {len(twice)} (of {len(effect.may_run_twice)} the fault could make), "
        f"{len(effect.cut_off)} runs cut off, counts {run.counts}"
    )
    return tally, parents, joins, Drained(steps, tally.finished(), effect, run)


def assert_each_parent_final_once(tally: Tally, parents, drained: Drained, fail: str, status) -> None:
    """Every parent's final run happened once (a failing first run aside); a rerun only where the fault allows.

    A run the fault cut off finished nothing: for a parent planned to fail once, that run was its failure.
    """
    runs = 2 if fail == "first" else 1
    effect = drained.effect
    planned = {node.id: runs - (fail == "first" and node.id in effect.cut_off) for node in parents}
    rerun = [node.name for node in parents if drained.finished[node.id] > planned[node.id]]
    assert len(rerun) <= effect.rerun_limit, (
        f"{len(rerun)} parents ran again, at most {effect.rerun_limit} may: {rerun}"
    )
    for node in parents:
        allowed = {planned[node.id], planned[node.id] + 1} if node.id in effect.may_run_twice else {planned[node.id]}
        assert drained.finished[node.id] in allowed, (
            f"parent {node.name} finished {drained.finished[node.id]} runs, not {sorted(allowed)} "
            f"({len(effect.may_run_twice)} may run twice, {len(effect.cut_off)} cut off): its runs "
            f"{[s for s in drained.steps if s.task_id == node.id]}, its attempts {drained.run.tasks[node.name].attempt_records}"
        )
    statuses = Counter(drained.run.tasks[node.name].status for node in parents)
    assert statuses == {status: PARENTS}, statuses


def assert_joined_once_after_every_parent(join: WorkflowNode, parents, drained: Drained) -> None:
    """The join started once, after the final run of every parent finished, and succeeded."""
    (start,) = starts_of(drained.steps, join.id)
    last = max((final_finish(drained.steps, drained.run.tasks[node.name]) for node in parents), key=lambda s: s.at)
    assert start.at > last.at, (
        f"the join started at step {start.at}, before parent {last.task_id} finished at {last.at}"
    )
    assert drained.finished[join.id] == 1
    assert drained.run.tasks[join.name].status == TaskResultStatus.SUCCESSFUL


@pytest.mark.parametrize("fault", FAULTS)
def test_a_fan_in_of_500_joins_once_after_every_parent_through_a_fault(fault, make_server, counter, start_pool):
    tally, parents, joins, drained = drain_through(fault, "never", ("cancel",), make_server, counter, start_pool)

    assert_each_parent_final_once(tally, parents, drained, "never", TaskResultStatus.SUCCESSFUL)
    assert_joined_once_after_every_parent(joins["cancel"], parents, drained)
    assert drained.run.status == TaskResultStatus.SUCCESSFUL
    assert drained.run.counts == {"WAITING": 0, "READY": 0, "RUNNING": 0, "SUCCESSFUL": PARENTS + 1, "FAILED": 0}


@pytest.mark.parametrize("fault", FAULTS)
def test_a_fan_in_of_parents_that_fail_once_joins_once_after_their_retries_through_a_fault(
    fault, make_server, counter, start_pool
):
    tally, parents, joins, drained = drain_through(fault, "first", ("cancel",), make_server, counter, start_pool)

    assert_each_parent_final_once(tally, parents, drained, "first", TaskResultStatus.SUCCESSFUL)
    # A parent the fault's victim held may also record the lost worker, and may have lost its failure's acknowledgement.
    for node in parents:
        errors = [e.exception_class_path for e in drained.run.tasks[node.name].errors]
        assert node.id in drained.effect.held or errors == ["tests.tasks.PlannedFailure"], (node.name, errors)
    assert_joined_once_after_every_parent(joins["cancel"], parents, drained)
    assert drained.run.status == TaskResultStatus.SUCCESSFUL


@pytest.mark.parametrize("fault", FAULTS)
def test_a_fan_in_of_failing_parents_fails_the_cancel_join_unstarted_and_runs_the_run_join_once_through_a_fault(
    fault, make_server, counter, start_pool
):
    tally, parents, joins, drained = drain_through(fault, "always", ("cancel", "run"), make_server, counter, start_pool)

    assert_each_parent_final_once(tally, parents, drained, "always", TaskResultStatus.FAILED)
    cancelled = drained.run.tasks["join-cancel"]
    assert starts_of(drained.steps, joins["cancel"].id) == [] and cancelled.started_at is None
    assert cancelled.status == TaskResultStatus.FAILED
    assert [e.exception_class_path for e in cancelled.errors] == [UPSTREAM_FAILED]
    assert_joined_once_after_every_parent(joins["run"], parents, drained)
    assert drained.run.status == TaskResultStatus.FAILED
    assert drained.run.counts == {"WAITING": 0, "READY": 0, "RUNNING": 0, "SUCCESSFUL": 1, "FAILED": PARENTS + 1}


def test_a_parent_that_kills_its_worker_is_failed_by_recovery_which_fails_the_cancel_join_and_releases_the_other(
    make_server, counter, start_pool
):
    # A parent that kills its worker process (kill -9) is failed by recovery after WORKER_LOSS_LIMIT
    # kills. Recovery claims the lease and records the failure through acknowledge.lua, so the
    # release runs in that call, not a sweep later.
    server = make_server("everysec")
    tally = Tally(task_backends["default"], counter)
    wf = Workflow(name="poisoned-fan-in")
    parents = [wf.add(tasks.count_step, kwargs={"sleep_ms": SLEEP_MS}, name=f"p{i}") for i in range(PARENTS - 1)]
    poison = wf.add(tasks.kill_own_process, name="poison")
    joins = {
        p: wf.add(tasks.count_step, name=f"join-{p}", after=[*parents, poison], on_parent_failure=p) for p in POLICIES
    }
    run = wf.enqueue()
    tally.ids = [node.id for node in wf.nodes]
    pool = start_pool(server, "-w", "2", "-t", "2")
    wait_for(lambda: pool.alive() and run.refresh() is None and run.counts["WAITING"] == 0 and run.counts["SUCCESSFUL"] + run.counts["FAILED"] == len(wf.nodes),
             lambda: f"the workflow is final ({tally.summary()})", 60)  # fmt: skip

    steps, finished = read_steps(tally), tally.finished()
    killed = run.tasks["poison"]
    assert killed.status == TaskResultStatus.FAILED and tally.started()[poison.id] == WORKER_LOSS_LIMIT
    assert killed.errors[-1].exception_class_path == "threadmill.exceptions.WorkerLost", killed.errors
    assert len(pool.respawns()) == WORKER_LOSS_LIMIT, pool.respawns()
    # The poison's neighbours were cut off or lost their acknowledgement at a kill: run again (once a kill), never lost.
    assert all(1 <= finished[node.id] <= 1 + WORKER_LOSS_LIMIT for node in parents), tally.summary()
    assert {run.tasks[node.name].status for node in parents} == {TaskResultStatus.SUCCESSFUL}
    cancelled = run.tasks["join-cancel"]
    assert starts_of(steps, joins["cancel"].id) == [] and cancelled.started_at is None
    assert [e.exception_class_path for e in cancelled.errors] == [UPSTREAM_FAILED]
    assert "Parent task 'poison'" in cancelled.errors[-1].traceback
    # Failed in the call that recorded the poison's failure, not a sweep (DEFAULT_SWEEP_INTERVAL_S) later.
    failed_in = (cancelled.finished_at - killed.finished_at).total_seconds()
    assert 0 <= failed_in < 1.0 < DEFAULT_SWEEP_INTERVAL_S, failed_in
    assert_joined_once_after_every_parent(
        joins["run"], parents, Drained(steps, finished, FaultEffect(set(), set(), set(), 0), run)
    )
    assert run.tasks["join-run"].started_at >= killed.finished_at
    assert run.counts == {"WAITING": 0, "READY": 0, "RUNNING": 0, "SUCCESSFUL": PARENTS, "FAILED": 2}
    reruns = Counter(finished[node.id] for node in parents)
    print(
        f"\nthe poison was failed by recovery; the cancel join {failed_in:.3f} s later; parents by runs {dict(reruns)}"
    )
