"""Workflows on an alias of three partitions (`OPTIONS["partitions"] = 3`) on one server, with real pools.

A workflow lives in one partition, taken in turn as an `enqueue_many` batch takes one: its id and its
tasks' ids name it, and every key it has carries that partition's hash tag. So each release stays
one single-slot script call, and everything that finds a workflow by id goes to that partition.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
from django.tasks import TaskResultStatus

from tests import tasks
from tests.cli.test_status import threadmill
from tests.servers import partition
from tests.worker.conftest import run_worker, worker_env
from threadmill import api
from threadmill.backends.broker.passes import BrokerPass, PassFailures
from threadmill.backends.broker.recounter import Recounter
from threadmill.backends.broker.sweeper import Sweeper
from threadmill.backends.partitions import partition_of
from threadmill.base import Segment
from threadmill.testing import drain
from threadmill.workflows import Workflow

pytestmark = pytest.mark.slow

UPSTREAM_FAILED = "threadmill.exceptions.UpstreamFailed"


@pytest.fixture
def backend(settings):
    """The `default` backend in three partitions on the session's Valkey."""
    return partition(settings)


@pytest.fixture
def env(redis_url):
    """A worker process's environment on the same three partitions."""
    return worker_env(THREADMILL_TEST_REDIS_URL=redis_url, THREADMILL_TEST_PARTITIONS="3")


def _diamond(name: str):
    wf = Workflow(name=name)
    top = wf.add(tasks.add, (1, 1), name="top")
    left = wf.add(tasks.add, (2, 2), after=[top], name="left")
    right = wf.add(tasks.send_email, (f"{name}@example.com",), after=[top], name="right")
    wf.add(tasks.add, (3, 3), after=[left, right], name="join")
    return wf.enqueue()


def _drain(env) -> None:
    done = run_worker("-w", "1", "-t", "2", "-q", "default,emails", "--exit-empty", env=env)
    assert done.returncode == 0, done.stderr


def test_workflows_take_the_partitions_in_turn_and_every_key_carries_the_workflows_tag(backend):
    runs = [_diamond(f"d{i}") for i in range(3)]

    assert sorted(partition_of(run.id) for run in runs) == [0, 1, 2]
    for run in runs:
        keys = backend.keys_for(partition_of(run.id))
        assert {partition_of(task.id) for task in run.tasks.values()} == {partition_of(run.id)}
        assert backend.client.exists(keys.workflow(run.id))
        assert backend.client.zscore(keys.workflows(), run.id) is not None
        assert backend.client.smembers(keys.workflow_pending(run.tasks["join"].id)) == {
            run.tasks["left"].id.encode(),
            run.tasks["right"].id.encode(),
        }
        assert backend.client.zscore(keys.segment("emails", Segment.WAITING), run.tasks["right"].id) is not None
    assert len({backend.keys_for(partition_of(run.id)).prefix for run in runs}) == 3  # three hash tags
    # Partition 0 is the alias's own keys, as every workflow's before partitions held them.
    assert backend.keys_for(0).workflows() == "threadmill:{default}:workflows"
    assert backend.queue_stats()["emails"][Segment.WAITING] == 3
    [emails] = [summary for summary in api.overview() if summary.queue_name == "emails"]  # the console's counts
    assert emails.counts[Segment.WAITING] == 3


def test_a_pool_with_exit_empty_runs_every_partitions_workflows_to_their_outcomes(backend, env):
    runs = [_diamond(f"d{i}") for i in range(3)]
    wf = Workflow(name="failing")
    boom = wf.add(tasks.explode, ("bad",), name="boom")
    skipped = wf.add(tasks.echo, ("never",), after=[boom], name="skipped")
    wf.add(tasks.echo, ("never either",), after=[skipped], name="below")
    wf.add(tasks.echo, ("clean-up",), after=[skipped], name="clean_up", on_parent_failure="run")
    failing = wf.enqueue()
    assert partition_of(failing.id) == partition_of(runs[0].id)  # the fourth workflow, back to the first's turn

    _drain(env)  # it must wait for the released tasks of every partition, not stop at its first empty fetch

    for run in runs:
        run.refresh()
        assert run.status == TaskResultStatus.SUCCESSFUL
        assert [run.tasks[n].return_value for n in ("top", "left", "join")] == [2, 4, 6]
    failing.refresh()
    assert failing.status == TaskResultStatus.FAILED
    assert failing.counts == {"WAITING": 0, "READY": 0, "RUNNING": 0, "SUCCESSFUL": 1, "FAILED": 3}
    for node in ("skipped", "below"):
        assert failing.tasks[node].errors[-1].exception_class_path == UPSTREAM_FAILED
    assert failing.tasks["clean_up"].return_value == "clean-up"


def test_cancel_and_retry_by_id_reach_the_workflows_own_partition(backend, env):
    runs = [_diamond(f"d{i}") for i in range(2)]
    target = next(run for run in runs if partition_of(run.id) != 0)

    assert backend.cancel_workflow(target.id) == 4
    target.refresh()
    assert target.counts["FAILED"] == 4 and target.status == TaskResultStatus.FAILED
    assert api.workflows.workflow_detail("default", target.id).status == "FAILED"

    assert backend.retry_workflow(target.id) == 4
    target.refresh()
    assert target.counts == {"WAITING": 3, "READY": 1, "RUNNING": 0, "SUCCESSFUL": 0, "FAILED": 0}
    _drain(env)
    target.refresh()
    assert target.status == TaskResultStatus.SUCCESSFUL and target.tasks["join"].return_value == 6


def test_a_task_added_at_run_time_goes_into_its_workflows_partition(backend, env):
    first = _diamond("d0")  # partition 1 next
    wf = Workflow(name="fan-out")
    fan = wf.add(tasks.fan_out, (3, "join"), name="fan")
    wf.add(tasks.read_parents, ("join",), after=[fan], name="join")
    run = wf.enqueue()
    assert partition_of(run.id) != partition_of(first.id)

    _drain(env)

    run.refresh()
    assert run.status == TaskResultStatus.SUCCESSFUL
    added = run.tasks["fan"].return_value
    assert len(added) == 3 and {partition_of(run.tasks[name].id) for name in added} == {partition_of(run.id)}
    assert set(run.tasks["join"].return_value) == {"fan", *added}


def test_the_console_list_merges_every_partitions_index_newest_first(backend):
    runs = [_diamond(f"d{i}") for i in range(5)]
    assert len({partition_of(run.id) for run in runs}) == 3

    page = api.workflows.workflows("default", first=1, count=3)
    assert (page.total, [row.id for row in page.rows]) == (5, [run.id for run in reversed(runs[1:4])])
    assert page.rows[0].total == 4 and page.rows[0].waiting == 3
    backend.cancel_workflow(runs[2].id)
    failed = api.workflows.workflows("default", state="failed")
    assert [row.id for row in failed.rows] == [runs[2].id] and failed.complete
    assert api.workflows.find_workflow(["default"], runs[4].id) == "default"
    relatives = api.workflows.task_workflow("default", runs[4].tasks["join"].id)
    assert relatives.workflow_id == runs[4].id and {p.name for p in relatives.parents} == {"left", "right"}


def test_the_broker_sweeps_and_recounts_every_partition(backend):
    runs = [_diamond(f"d{i}") for i in range(3)]
    target = next(run for run in runs if partition_of(run.id) == 2)
    keys = backend.keys_for(2)
    top = target.tasks["top"]
    # An older release's acknowledge: final in its hash, its children never released, nothing counted.
    backend.client.hset(keys.task(top.id), "segment", "successful")
    backend.client.zrem(keys.segment("default", Segment.READY), top.id)
    every = BrokerPass(["default", "emails"], range(3), PassFailures(backend))

    assert Sweeper(backend).run_once(every) == 1

    assert backend.get_result(target.tasks["left"].id).segment is Segment.READY
    assert backend.get_workflow(target.id).counts["SUCCESSFUL"] == 1
    others = [run for run in runs if run is not target]
    for run in others:  # outcomes an older release recorded in partitions 0 and 1, which no sweep reaches yet
        top = run.tasks["top"]
        backend.client.hset(backend.task_keys(top.id).task(top.id), "segment", "failed")
    assert Recounter(backend).run_once(every) == 2
    assert [backend.get_workflow(run.id).counts["FAILED"] for run in others] == [1, 1]


def test_an_acknowledgement_cut_short_is_continued_in_its_own_partition(backend):
    _diamond("d0")
    wf = Workflow(name="wide")
    root = wf.add(tasks.explode, name="root")
    for i in range(1_200):
        wf.add(tasks.echo, (i,), after=[root], name=f"child-{i}")
    run = wf.enqueue()
    assert partition_of(run.id) == 2
    leased = []
    for _ in range(3):  # one acquire takes from one partition
        leased += [r for r in backend.acquire("default", count=10, worker="w") if r.id == run.tasks["root"].id]
    assert backend.acknowledge(dataclasses.replace(leased[0], status=TaskResultStatus.FAILED))

    assert backend.get_workflow(run.id).counts["FAILED"] == 1_201
    assert backend.client.llen(backend.keys_for(2).workflow_settling()) == 0


def test_the_command_line_shows_cancels_and_retries_a_workflow_of_any_partition(backend, redis_url):
    runs = [_diamond(f"d{i}") for i in range(2)]
    target = next(run for run in runs if partition_of(run.id) == 2)
    env = {"THREADMILL_TEST_REDIS_URL": redis_url, "THREADMILL_TEST_PARTITIONS": "3"}

    shown = threadmill("workflow", "show", target.id, "--json", **env)
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["counts"] == {"WAITING": 3, "READY": 1, "RUNNING": 0, "SUCCESSFUL": 0, "FAILED": 0}
    cancelled = threadmill("workflow", "cancel", target.id, **env)
    assert cancelled.stdout.strip() == f"Workflow {target.id}: 4 tasks cancelled or asked to abort."
    retried = threadmill("workflow", "retry", target.id, **env)
    assert retried.stdout.strip() == f"Workflow {target.id}: 4 tasks made ready or waiting again."
    status = threadmill("status", "--json", **env)
    waiting = {q["queue"]: q["waiting"] for q in json.loads(status.stdout)["queues"]}
    assert (waiting["default"], waiting["emails"]) == (4, 2)  # both workflows' waiting tasks, partitions 1 and 2


def test_exit_empty_waits_for_a_release_in_any_partition(backend):
    runs = [_diamond(f"d{i}") for i in range(2)]
    assert {partition_of(run.id) for run in runs} == {1, 2}  # none in partition 0

    assert backend.awaits_release(["default"])  # a waiting task and its ready parent, in partitions 1 and 2
    assert not backend.awaits_release(["emails"])  # its waiting tasks' parents are in a queue it does not serve
    for run in runs:
        backend.cancel_workflow(run.id)
    assert not backend.awaits_release(["default", "emails"])


def test_drain_in_the_test_process_runs_every_partitions_workflows(backend):
    runs = [_diamond(f"d{i}") for i in range(3)]

    while drain().results:  # as docs/how-to/workflows.md drains: a call may end before the last release
        pass

    for run in runs:
        run.refresh()
        assert run.status == TaskResultStatus.SUCCESSFUL and run.tasks["join"].return_value == 6


def test_a_quarantine_and_a_delete_settle_a_workflow_in_its_own_partition(backend):
    runs = [_diamond(f"gone{i}") for i in range(3)]
    for run in runs:
        keys = backend.keys_for(partition_of(run.id))
        if partition_of(run.id) % 2:  # one partition's workflow loses its top to a quarantine
            backend.client.hset(keys.task(run.tasks["top"].id), "data", b"{this is not json")
            backend.peek("default", segment=Segment.READY)
        else:  # the others' tops are deleted
            assert backend.delete([run.tasks["top"].id]) == 1
        assert backend.get_result(run.tasks["join"].id).errors[-1].exception_class_path == UPSTREAM_FAILED
        assert backend.client.hmget(keys.workflow(run.id), "failed", "waiting") == [b"4", b"0"]


def test_the_broker_drops_expired_workflows_from_every_partitions_index(backend):
    runs = [_diamond(f"d{i}") for i in range(3)]
    assert sorted(partition_of(run.id) for run in runs) == [0, 1, 2]
    for run in runs:  # what a finished record's expiry after a tiny result_ttl leaves
        backend.client.delete(backend.keys_for(partition_of(run.id)).workflow(run.id))
    every = BrokerPass(["default", "emails"], range(3), PassFailures(backend))

    Recounter(backend).run_once(every)

    assert [backend.client.zcard(backend.keys_for(p).workflows()) for p in range(3)] == [0, 0, 0]
