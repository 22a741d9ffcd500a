"""Every final outcome of a workflow task settles: the reaper's, recovery's and a cancel's, and a waiting task's cancel.

The reaper and recovery record their failures through acknowledge.lua, so they settle as a
worker's acknowledgement does; cancel.lua settles in its own call. Each fault is real: a lease
left to expire on the server's clock, a worker whose heartbeats stop, a cancel through the backend.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.tasks import TaskResultStatus, task_backends
from django.tasks.exceptions import TaskResultDoesNotExist

from tests import tasks
from tests.backends.conftest import finish, same_server
from tests.worker.conftest import wait_until
from threadmill.backends.broker.reaper import Reaper
from threadmill.backends.broker.recovery import Recovery
from threadmill.backends.broker.sweeper import Sweeper
from threadmill.backends.redis import RedisTaskBackend
from threadmill.base import Segment
from threadmill.outcome import WORKER_LOSS_LIMIT
from threadmill.workflows import Workflow

PREFIX = "threadmill:{default}"
UPSTREAM_FAILED = "threadmill.exceptions.UpstreamFailed"
CANCELLED = "threadmill.exceptions.TaskCancelled"


@pytest.fixture
def backend():
    return task_backends["default"]


def _short(backend, **options) -> RedisTaskBackend:
    """Another backend on the same server and keys, with short timeouts `options`."""
    return RedisTaskBackend("default", same_server(backend, QUEUES=["default"], OPTIONS=options))


def _chain(*policies: str):
    """Enqueue a chain parent -> child (-> grandchild ...), each link with its child's failure policy."""
    wf = Workflow()
    nodes = [wf.add(tasks.echo, ("root",))]
    for policy in policies:
        nodes.append(wf.add(tasks.echo, (policy,), after=[nodes[-1]], on_parent_failure=policy))
    return wf.enqueue(), nodes


def _counts(backend, run) -> dict[str, int]:
    return backend.get_workflow(run.id).counts


def _settled_once(backend, run, failed: int, successful: int = 0) -> None:
    """Assert the record counts `failed` and `successful` and expires, and a sweep finds nothing left to settle."""
    assert Sweeper(backend).sweep("default", 0) == 0
    assert _counts(backend, run) == {
        "WAITING": 0, "READY": 0, "RUNNING": 0, "SUCCESSFUL": successful, "FAILED": failed,
    }  # fmt: skip
    assert backend.client.ttl(f"{PREFIX}:workflow:{run.id}") > 0
    assert not backend.client.exists(*(f"{PREFIX}:{kind}:{t}" for t in run.tasks.values() for kind in ("children",
        "pending")))  # fmt: skip


def _error_path(backend, task_id: str) -> str:
    return backend.get_result(task_id).errors[-1].exception_class_path


def test_the_reaper_fails_an_expired_parent_and_its_child_once(backend):
    run, (parent, child) = _chain("cancel")
    short = _short(backend, lease_ttl=1)
    assert short.acquire("default", worker="h:gone")[0].id == parent.id
    wait_until(lambda: Reaper(short).reap("default") == 1, "the lease expired and the reaper failed it")
    assert _error_path(backend, parent.id).endswith("AcknowledgementTimeout")
    assert _error_path(backend, child.id) == UPSTREAM_FAILED
    _settled_once(backend, run, failed=2)


def test_recovery_fails_a_parent_that_keeps_losing_its_worker_and_its_child_once(backend):
    run, (parent, child) = _chain("cancel")
    short = _short(backend, worker_timeout=1, socket_timeout=1)
    for _ in range(WORKER_LOSS_LIMIT):
        leased = short.acquire("default", worker="h:lost")[0]
        assert leased.id == parent.id
        short.heartbeat("h:lost", {"type": "worker", "running": [parent.id]})
        short.record_progress(leased, "started")  # what a worker records for a suspect it starts
        # The worker stops here: its heartbeat goes stale on the server's clock.
        wait_until(lambda: Recovery(short).recover("default") == 1, "recovery took back the lost worker's lease")
    assert backend.get_result(parent.id).status == TaskResultStatus.FAILED
    assert _error_path(backend, child.id) == UPSTREAM_FAILED
    _settled_once(backend, run, failed=2)


def test_cancelling_a_ready_parent_fails_its_child_and_finishes_the_workflow(backend):
    run, (parent, child) = _chain("cancel")
    assert backend.cancel(parent.id) is True
    assert _error_path(backend, parent.id) == CANCELLED
    assert _error_path(backend, child.id) == UPSTREAM_FAILED
    _settled_once(backend, run, failed=2)


def test_cancelling_a_leaf_counts_it_so_the_record_expires(backend):
    wf = Workflow()
    leaf = wf.add(tasks.echo)
    run = wf.enqueue()
    assert backend.cancel(leaf.id) is True
    _settled_once(backend, run, failed=1)


def test_cancelling_a_ready_parent_releases_a_child_whose_policy_is_run(backend):
    run, (parent, child) = _chain("run")
    backend.client.delete(f"{PREFIX}:default:wake")
    assert backend.cancel(parent.id) is True
    assert backend.get_result(child.id).segment is Segment.READY
    assert backend.client.lrange(f"{PREFIX}:default:wake", 0, -1) == [b"1"]
    assert _counts(backend, run) == {"WAITING": 0, "READY": 1, "RUNNING": 0, "SUCCESSFUL": 0, "FAILED": 1}


def test_cancelling_a_waiting_task_fails_it_and_cascades_to_its_children(backend):
    run, (root, middle, leaf) = _chain("cancel", "cancel")
    assert backend.cancel(middle.id) is True
    assert _error_path(backend, middle.id) == CANCELLED
    assert _error_path(backend, leaf.id) == UPSTREAM_FAILED
    assert backend.client.zcard(f"{PREFIX}:default:waiting") == 0
    assert _counts(backend, run) == {"WAITING": 0, "READY": 1, "RUNNING": 0, "SUCCESSFUL": 0, "FAILED": 2}
    # The root still runs; its acknowledgement finds its only child final and settles nothing more.
    leased = backend.acquire("default", worker="w")[0]
    assert leased.id == root.id
    assert finish(backend, leased) is True
    _settled_once(backend, run, failed=2, successful=1)


def test_cancelling_a_waiting_task_releases_a_child_whose_policy_is_run(backend):
    run, (_root, middle, leaf) = _chain("cancel", "run")
    assert backend.cancel(middle.id) is True
    assert backend.get_result(leaf.id).segment is Segment.READY
    assert backend.client.zrange(f"{PREFIX}:default:waiting", 0, -1) == []
    assert _counts(backend, run)["WAITING"] == 0


def test_a_plain_cancel_reads_the_workflow_fields_in_the_read_it_made_anyway(backend):
    warm, result = tasks.echo.enqueue(0), tasks.echo.enqueue(1)
    assert backend.cancel(warm.id) is True  # loads the script
    backend.client.config_resetstat()
    assert backend.cancel(result.id) is True
    stats = backend.client.info("commandstats")
    calls = {name.removeprefix("cmdstat_"): stat["calls"] for name, stat in stats.items()}
    del calls["config|resetstat"]
    # The Python read (HMGET) and the script's: its one HMGET reads the segment, `unique` and the workflow fields.
    assert calls.pop("hmget") == 2
    assert calls == {
        "evalsha": 1, "time": 1, "zrem": 1, "zadd": 1, "hset": 1, "expire": 1, "hincrby": 3, "incr": 2,
    }  # fmt: skip


def _poison(backend, task_id: str) -> bytes:
    """Make a task's stored payload unreadable; return the readable one it had."""
    key = f"{PREFIX}:task:{task_id}"
    readable = backend.client.hget(key, "data")
    backend.client.hset(key, "data", b"{this is not json")
    return readable


def test_a_quarantined_parent_fails_its_child_and_finishes_the_workflow(backend):
    run, (parent, child) = _chain("cancel")
    _poison(backend, parent.id)
    assert backend.acquire("default", worker="w") == []  # acquire quarantines what it cannot read
    assert backend.peek_task(parent.id).segment is Segment.UNREADABLE
    assert _error_path(backend, child.id) == UPSTREAM_FAILED
    _settled_once(backend, run, failed=2)


def test_a_quarantined_parent_releases_a_child_whose_policy_is_run(backend):
    run, (parent, child) = _chain("run")
    _poison(backend, parent.id)
    assert backend.acquire("default", worker="w") == []
    assert backend.get_result(child.id).segment is Segment.READY
    assert _counts(backend, run) == {"WAITING": 0, "READY": 1, "RUNNING": 0, "SUCCESSFUL": 0, "FAILED": 1}


def test_a_quarantined_waiting_task_leaves_its_wait_and_fails_its_child(backend):
    run, (root, middle, leaf) = _chain("cancel", "cancel")
    _poison(backend, middle.id)
    backend.peek("default", segment=Segment.WAITING)  # a peek quarantines what it cannot read
    assert backend.peek_task(middle.id).segment is Segment.UNREADABLE
    assert _error_path(backend, leaf.id) == UPSTREAM_FAILED
    assert backend.client.zcard(f"{PREFIX}:default:waiting") == 0
    assert _counts(backend, run) == {"WAITING": 0, "READY": 1, "RUNNING": 0, "SUCCESSFUL": 0, "FAILED": 2}
    leased = backend.acquire("default", worker="w")[0]
    assert leased.id == root.id
    assert finish(backend, leased) is True
    _settled_once(backend, run, failed=2, successful=1)


def test_a_requeued_quarantined_task_that_then_succeeds_is_not_counted_again(backend):
    run, (parent, child) = _chain("cancel")
    readable = _poison(backend, parent.id)
    assert backend.acquire("default", worker="w") == []
    # The code that reads it is deployed again; the console requeues the unreadable task and it runs.
    backend.client.hset(f"{PREFIX}:task:{parent.id}", "data", readable)
    assert backend.requeue_many("default", segment=Segment.UNREADABLE, task_ids=[parent.id]) == [parent.id]
    leased = backend.acquire("default", worker="w")[0]
    assert leased.id == parent.id
    assert finish(backend, leased) is True
    assert backend.get_result(parent.id).status == TaskResultStatus.SUCCESSFUL
    # The quarantine was its outcome for the workflow: the record keeps it, and its child stays failed.
    assert _error_path(backend, child.id) == UPSTREAM_FAILED
    record = backend.client.hmget(f"{PREFIX}:workflow:{run.id}", "successful", "failed", "total")
    assert record == [b"0", b"2", b"2"]


def test_the_sweeper_settles_a_parent_an_older_release_quarantined(backend):
    run, (parent, child) = _chain("cancel")
    # What an older release's quarantine leaves: the task unreadable, its child still waiting on it.
    key = f"{PREFIX}:task:{parent.id}"
    backend.client.zrem(f"{PREFIX}:default:ready", parent.id)
    backend.client.zadd(f"{PREFIX}:default:unreadable", {parent.id: 1})
    backend.client.hset(key, mapping={"segment": "unreadable", "read_error": "ValueError: junk"})
    assert Sweeper(backend).sweep("default", 0) == 1
    assert _error_path(backend, child.id) == UPSTREAM_FAILED
    _settled_once(backend, run, failed=2)


def test_deleting_a_waiting_task_settles_it_as_a_cancel_would(backend):
    run, (root, middle, leaf) = _chain("cancel", "cancel")
    assert backend.delete([middle.id]) == 1
    failure = backend.get_result(leaf.id).errors[-1]
    assert failure.exception_class_path == UPSTREAM_FAILED
    assert f"Parent task 'echo_2' ({middle.id}) failed" in failure.traceback
    assert backend.client.zcard(f"{PREFIX}:default:waiting") == 0
    assert _counts(backend, run) == {"WAITING": 0, "READY": 1, "RUNNING": 0, "SUCCESSFUL": 0, "FAILED": 2}
    leased = backend.acquire("default", worker="w")[0]
    assert leased.id == root.id
    assert finish(backend, leased) is True
    _settled_once(backend, run, failed=2, successful=1)


def test_deleting_a_ready_parent_releases_a_child_whose_policy_is_run(backend):
    run, (parent, child) = _chain("run")
    assert backend.delete([parent.id]) == 1
    assert backend.get_result(child.id).segment is Segment.READY
    assert _counts(backend, run) == {"WAITING": 0, "READY": 1, "RUNNING": 0, "SUCCESSFUL": 0, "FAILED": 1}


def test_deleting_a_running_parent_fails_its_child_and_its_acknowledgement_is_refused(backend):
    run, (parent, child) = _chain("cancel")
    leased = backend.acquire("default", worker="w")[0]
    assert backend.delete([parent.id]) == 1
    assert _error_path(backend, child.id) == UPSTREAM_FAILED
    assert finish(backend, leased) is False
    record = backend.client.hmget(f"{PREFIX}:workflow:{run.id}", "successful", "failed", "waiting")
    assert record == [b"0", b"2", b"0"]
    assert backend.client.ttl(f"{PREFIX}:workflow:{run.id}") > 0


def test_deleting_a_successful_parent_changes_nothing_in_its_workflow(backend):
    run, (parent, child) = _chain("cancel")
    assert finish(backend, backend.acquire("default", worker="w")[0]) is True
    assert backend.delete([parent.id]) == 1
    assert backend.get_result(child.id).segment is Segment.READY
    record = backend.client.hmget(f"{PREFIX}:workflow:{run.id}", "successful", "failed", "waiting")
    assert record == [b"1", b"0", b"0"]


def test_deleting_a_task_of_a_finished_workflow_leaves_its_record_as_it_was(backend):
    run, (parent, child) = _chain("cancel")
    for _ in range(2):
        assert finish(backend, backend.acquire("default", worker="w")[0]) is True
    record = f"{PREFIX}:workflow:{run.id}"
    finished = backend.client.hmget(record, "finished_at", "successful", "failed")
    backend.client.expire(record, 1000)  # shorter than the result TTL a settle would set again
    assert backend.delete([parent.id, child.id]) == 2
    assert backend.client.hmget(record, "finished_at", "successful", "failed") == finished
    assert backend.client.ttl(record) <= 1000


def test_deleting_a_ready_parent_from_its_segment_page_fails_its_child(backend):
    run, (parent, child) = _chain("cancel")
    assert backend.delete_many("default", segment=Segment.READY, task_ids=[parent.id]) == [parent.id]
    assert _error_path(backend, child.id) == UPSTREAM_FAILED
    assert backend.client.hmget(f"{PREFIX}:workflow:{run.id}", "failed", "waiting") == [b"2", b"0"]


def test_purging_the_ready_segment_fails_a_parents_child_and_finishes_the_workflow(backend):
    run, (_parent, child) = _chain("cancel")
    assert backend.purge("default", segment=Segment.READY) == 1
    assert _error_path(backend, child.id) == UPSTREAM_FAILED
    _settled_once(backend, run, failed=2)


def test_purging_the_deferred_segment_releases_a_child_whose_policy_is_run(backend):
    wf = Workflow()
    parent = wf.add(tasks.echo.using(run_after=datetime.now(UTC) + timedelta(hours=1)), ("later",))
    child = wf.add(tasks.echo, ("run",), after=[parent], on_parent_failure="run")
    run = wf.enqueue()
    assert backend.get_result(parent.id).segment is Segment.DEFERRED
    assert backend.purge("default", segment=Segment.DEFERRED) == 1
    assert backend.get_result(child.id).segment is Segment.READY
    assert _counts(backend, run) == {"WAITING": 0, "READY": 1, "RUNNING": 0, "SUCCESSFUL": 0, "FAILED": 1}


def test_purging_the_running_segment_counts_the_task_once_and_its_acknowledgement_is_refused(backend):
    run, (_parent, child) = _chain("cancel")
    leased = backend.acquire("default", worker="w")[0]
    assert backend.purge("default", segment=Segment.RUNNING) == 1
    assert finish(backend, leased) is False
    assert _error_path(backend, child.id) == UPSTREAM_FAILED
    assert backend.purge("default", segment=Segment.RUNNING) == 0
    _settled_once(backend, run, failed=2)


def test_purging_the_successful_segment_leaves_a_finished_workflows_record_as_it_was(backend):
    run, _nodes = _chain("cancel")
    for _ in range(2):
        assert finish(backend, backend.acquire("default", worker="w")[0]) is True
    record = f"{PREFIX}:workflow:{run.id}"
    finished = backend.client.hmget(record, "finished_at", "successful", "failed")
    assert backend.purge("default", segment=Segment.SUCCESSFUL) == 2
    assert backend.client.hmget(record, "finished_at", "successful", "failed") == finished


def test_a_purge_past_one_calls_budget_counts_each_task_once_and_the_sweeper_settles_the_rest(backend):
    wf = Workflow()
    wide, narrow = wf.add(tasks.echo, ("wide",)), wf.add(tasks.echo, ("narrow",))
    for i in range(1100):  # past the 1,000 children one call visits (lib/workflow's WORKFLOW_BUDGET)
        wf.add(tasks.echo, (i,), after=[wide])
    last = wf.add(tasks.echo, ("last",), after=[narrow])
    run = wf.enqueue()
    assert backend.purge("default", segment=Segment.READY) == 2
    assert _error_path(backend, last.id) == UPSTREAM_FAILED
    assert backend.client.zcard(f"{PREFIX}:default:waiting") == 100
    # The purged parent's mark that it was counted outlives its hash, so the sweep settles the rest uncounted.
    assert 0 < backend.client.ttl(f"{PREFIX}:task:{wide.id}") <= backend.config.result_ttl
    with pytest.raises(TaskResultDoesNotExist):
        backend.get_result(wide.id)  # the mark is no task
    assert Sweeper(backend).sweep("default", 0) == 1
    _settled_once(backend, run, failed=1103)


def test_a_plain_purge_sends_the_commands_it_sent_before_workflows_settled(backend):
    tasks.echo.enqueue(0)
    assert backend.purge("default", segment=Segment.READY) == 1  # loads the script
    for i in range(3):
        tasks.echo.enqueue(i)
    backend.client.config_resetstat()
    assert backend.purge("default", segment=Segment.READY) == 3
    stats = backend.client.info("commandstats")
    calls = {name.removeprefix("cmdstat_"): stat["calls"] for name, stat in stats.items()}
    del calls["config|resetstat"]
    # Two calls (the batch, then the empty one that ends the loop); per task one HMGET, one DEL, one ZREM.
    assert calls == {"evalsha": 2, "zrange": 2, "hmget": 3, "del": 3, "zrem": 3}


def test_a_delete_past_one_calls_budget_counts_the_task_once_when_the_sweeper_settles_the_rest(backend):
    wf = Workflow()
    wide = wf.add(tasks.echo, ("wide",))
    for i in range(1100):
        wf.add(tasks.echo, (i,), after=[wide])
    run = wf.enqueue()
    assert backend.delete([wide.id]) == 1
    assert Sweeper(backend).sweep("default", 0) == 1
    _settled_once(backend, run, failed=1101)


def test_the_mark_the_sweeper_leaves_for_a_parent_whose_hash_is_gone_expires_with_the_results(backend):
    run, (parent, child) = _chain("cancel")
    # What an expired parent or an older release's delete leaves: no hash, its child still waiting on it.
    key = f"{PREFIX}:task:{parent.id}"
    backend.client.delete(key)
    backend.client.zrem(f"{PREFIX}:default:ready", parent.id)
    assert Sweeper(backend).sweep("default", 0) == 1
    assert _error_path(backend, child.id) == UPSTREAM_FAILED
    assert backend.client.hgetall(key) == {b"counted": b"1"}
    assert 0 < backend.client.ttl(key) <= backend.config.result_ttl
    _settled_once(backend, run, failed=2)
