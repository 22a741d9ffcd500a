"""The console's scripts, each through its wrapper: peek_matching and requeue_many."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from tests.backends.conftest import enqueue, same_server
from tests.servers import wait_until_settled
from tests.tasks import add, echo, explode
from threadmill.api.controls import LeaseCheck
from threadmill.backends.redis import RedisTaskBackend
from threadmill.base import Segment, UnreadableTask
from threadmill.outcome import error_of, mark_failed

TASK = "threadmill:{default}:task:"
RUNNING = "threadmill:{default}:default:running"
WORKERS = "threadmill:{default}:workers"


def beat(backend, worker: str, age_s: float = 0.0) -> None:
    """Record a heartbeat of `worker` `age_s` seconds ago on the server's clock."""
    if age_s > backend.config.worker_timeout:
        wait_until_settled(backend)
    seconds, micros = backend.client.time()
    backend.client.zadd(backend.keys.workers(), {worker: seconds + micros / 1e6 - age_s})


def running(backend, count: int, worker: str) -> list[str]:
    ids = [enqueue(backend, echo, i).id for i in range(count)]
    assert len(backend.acquire("default", count=count, worker=worker)) == count
    return ids


def fail(backend, result):
    mark_failed(result, error_of(RuntimeError("boom")), datetime.now(UTC))
    assert backend.acknowledge(result)


def test_peek_matching_pages_the_matches_and_counts_them(backend):
    ids = [enqueue(backend, echo, i).id for i in range(5)]
    for i in range(3):
        enqueue(backend, add, i, i)
    page, complete = backend.peek_matching(
        "default", segment=Segment.READY, needles=['"path":"tests.tasks.echo"'], offset=1, count=2
    )
    assert complete
    assert page.total == 5
    assert [r.id for r in page] == ids[1:3]


@pytest.mark.single_partition
def test_peek_matching_reports_an_incomplete_scan(backend):
    for i in range(6):
        enqueue(backend, echo, i)
    page, complete = backend.peek_matching("default", segment="ready", needles=["echo"], count=10, scan_limit=4)
    assert not complete
    assert page.total == 4


def test_peek_matching_matches_the_error_class_of_a_failed_task(backend):
    failed = enqueue(backend, explode)
    enqueue(backend, echo)
    for result in backend.acquire("default", count=2):
        if result.id == failed.id:
            fail(backend, result)
    page, _ = backend.peek_matching(
        "default", segment="failed", needles=['"exception_class_path":"builtins.RuntimeError"']
    )
    assert [r.id for r in page] == [failed.id]


def test_requeue_many_moves_the_selected_tasks_and_clears_their_lease(backend, raw):
    ids = [enqueue(backend, echo, i).id for i in range(3)]
    backend.acquire("default", count=3, worker="ghost:1")
    assert backend.requeue_many("default", segment="running", task_ids=ids[:2], force=True) == ids[:2]
    assert raw.zcard("threadmill:{default}:default:running") == 1
    assert raw.zrange("threadmill:{default}:default:ready", 0, -1) == [i.encode() for i in ids[:2]]
    assert raw.hget(TASK + ids[0], "segment") == b"ready"
    assert raw.hget(TASK + ids[0], "lease_token") is None


def test_requeue_many_leaves_tasks_of_other_segments_alone(backend, raw):
    ready = enqueue(backend, echo).id
    deferred = backend.enqueue(echo.using(run_after=datetime.now(UTC) + timedelta(hours=1)), [], {}).id
    assert backend.requeue_many("default", segment="deferred", task_ids=[ready, deferred, "missing"]) == [deferred]
    assert raw.hget(TASK + deferred, "segment") == b"ready"
    assert raw.zcard("threadmill:{default}:default:deferred") == 0


def test_requeue_many_keeps_a_failed_task_s_errors(backend):
    result = enqueue(backend, explode)
    fail(backend, backend.acquire("default")[0])
    assert backend.requeue_many("default", segment="failed", task_ids=[result.id]) == [result.id]
    requeued = backend.get_result(result.id)
    assert requeued.status == "READY"
    assert requeued.errors[0].exception_class_path == "builtins.RuntimeError"


def test_requeue_matching_moves_only_the_matching_tasks_across_windows(backend, raw):
    # batch_size is 7 in the contract backend, so 20 tasks take several windows.
    for i in range(20):
        backend.enqueue(echo.using(run_after=datetime.now(UTC) + timedelta(hours=1)), [i], {})
        backend.enqueue(add.using(run_after=datetime.now(UTC) + timedelta(hours=1)), [i, i], {})
    assert len(backend.requeue_matching("default", segment="deferred", needles=['"path":"tests.tasks.add"'])) == 20
    page = backend.peek("default", segment="deferred", count=100)
    assert {r.task.name for r in page} == {"echo"}
    assert page.total == 20


def test_requeue_matching_without_needles_requeues_the_whole_unreadable_segment(backend, raw):
    ids = [enqueue(backend, echo).id for _ in range(9)]
    for task_id in ids:
        raw.hset(TASK + task_id, "data", b"\xff not json")
    assert backend.acquire("default", count=9) == []
    assert raw.zcard("threadmill:{default}:default:unreadable") == 9
    assert sorted(backend.requeue_matching("default", segment="unreadable")) == sorted(ids)
    assert raw.zcard("threadmill:{default}:default:ready") == 9
    assert raw.hget(TASK + ids[0], "read_error") is None


def test_in_segment_keeps_only_the_ids_present(backend):
    ids = [enqueue(backend, echo).id for _ in range(3)]
    assert backend.in_segment("default", "ready", [*ids[:2], "nope"]) == ids[:2]


def test_peek_task_returns_an_unreadable_task_as_stored(backend, raw):
    task_id = enqueue(backend, echo).id
    raw.hset(TASK + task_id, "data", b"<script>x</script>")
    backend.acquire("default")
    found = backend.peek_task(task_id)
    assert isinstance(found, UnreadableTask)
    assert found.raw == b"<script>x</script>"
    assert found.segment is Segment.UNREADABLE


def test_peek_matching_without_needles_reads_a_deep_page_in_either_order(backend):
    ids = [enqueue(backend, echo, i).id for i in range(10)]
    page, complete = backend.peek_matching("default", segment="ready", needles=[], offset=7, count=5)
    assert complete and page.total == 10
    assert [r.id for r in page] == ids[7:]
    page, _ = backend.peek_matching("default", segment="ready", needles=[], offset=0, count=2, newest_first=True)
    assert [r.id for r in page] == ids[::-1][:2]


def test_requeue_many_skips_a_running_task_whose_lease_is_live(backend, raw):
    silent, beating = running(backend, 1, "never-beat:1") + running(backend, 1, "alive:1")
    beat(backend, "alive:1")
    assert backend.requeue_many("default", segment="running", task_ids=[silent, beating]) == []
    assert raw.zcard(RUNNING) == 2
    assert backend.get_result(silent).errors == []


def test_requeue_many_moves_a_running_task_whose_lease_is_overdue(backend, raw):
    overdue, live = running(backend, 2, "alive:1")
    beat(backend, "alive:1")
    raw.zadd(RUNNING, {overdue: 1})
    assert backend.requeue_many("default", segment="running", task_ids=[overdue, live]) == [overdue]
    assert raw.zrange(RUNNING, 0, -1) == [live.encode()]


def test_requeue_many_moves_a_running_task_whose_worker_stopped_beating(backend, raw):
    # Liveness timeouts of seconds: a server this session started lately (redis, the cluster) is
    # settled 4 s after its start, not after the defaults' worker_timeout + socket_timeout (20 s).
    options = {**backend.options, "worker_timeout": 3, "socket_timeout": 1}
    backend = RedisTaskBackend("default", same_server(backend, OPTIONS=options))
    [dead] = running(backend, 1, "dead:1")
    [alive] = running(backend, 1, "alive:1")
    beat(backend, "dead:1", age_s=backend.config.worker_timeout + 1)
    beat(backend, "alive:1", age_s=backend.config.worker_timeout - 2)
    assert backend.requeue_many("default", segment="running", task_ids=[dead, alive]) == [dead]
    assert backend.live_leases("default", [dead, alive]) == [alive]


def test_a_worker_with_no_heartbeat_is_silent_once_its_lease_is_worker_timeout_old(backend, raw):
    old, fresh = running(backend, 1, "lost:1:abc") + running(backend, 1, "new:1:abc")
    seconds, micros = backend.client.time()
    raw.hset(TASK + old, "lease_started_at", f"{seconds + micros / 1e6 - backend.config.worker_timeout - 1:.6f}")

    assert backend.live_leases("default", [old, fresh]) == [fresh]
    assert _gone_by_the_console_check(backend) == [old]
    assert backend.requeue_many("default", segment="running", task_ids=[old, fresh]) == [old]
    assert raw.zrange(RUNNING, 0, -1) == [fresh.encode()]


def test_the_console_check_takes_no_worker_with_a_heartbeat_for_gone_while_the_server_settles():
    now = 1_000_000.0
    check = LeaseCheck(now, {"old:1:a": now - 60}, 15, uptime_s=3, settle_s=20)
    assert not check.worker_gone("old:1:a") and check.held_back("old:1:a") and check.settles_in_s == 17
    # No heartbeat at all: judged by the lease's age, as before (a restart restores a live worker's heartbeat).
    assert check.worker_gone("lost:1:a", datetime.fromtimestamp(now - 60, UTC)) and not check.held_back("lost:1:a")
    up = replace(check, uptime_s=20)
    assert up.worker_gone("old:1:a") and not up.held_back("old:1:a") and up.settles_in_s == 0


def _gone_by_the_console_check(backend) -> list[str]:
    """The running tasks the console flags "worker gone" (what "requeue all orphaned" takes)."""
    check = LeaseCheck(backend.server_time().timestamp(), backend.worker_heartbeats(), backend.config.worker_timeout)
    page = backend.peek("default", segment=Segment.RUNNING, count=10)
    return [item.id for item in page.items if "gone" in check.flags(item)]


def test_requeue_many_records_the_abandoned_attempt_of_a_running_task(backend):
    [task_id] = running(backend, 1, "host:7")
    assert backend.requeue_many("default", segment="running", task_ids=[task_id], force=True) == [task_id]
    requeued = backend.get_result(task_id)
    assert requeued.worker_ids == ["host:7"]
    [error] = requeued.errors
    assert error.exception_class_path == "threadmill.exceptions.AttemptAbandoned"
    assert "worker host:7" in error.traceback
    assert "requeue_many (forced)" in error.traceback
    [again] = backend.acquire("default", worker="host:8")
    assert again.worker_ids == ["host:7", "host:8"]


def test_requeue_many_of_a_running_unreadable_task_keeps_its_payload_and_logs_the_attempt(backend, raw, caplog):
    [task_id] = running(backend, 1, "host:7")
    raw.hset(TASK + task_id, "data", b"\xff not json")
    assert backend.requeue_many("default", segment="running", task_ids=[task_id], force=True) == [task_id]
    assert raw.hget(TASK + task_id, "data") == b"\xff not json"
    assert f"Task {task_id} on queue default was requeued while worker host:7 ran it" in caplog.text


def test_live_leases_names_the_running_tasks_requeue_many_would_skip(backend, raw):
    live, overdue = running(backend, 2, "host:1")
    raw.zadd(RUNNING, {overdue: 1})
    ready = enqueue(backend, echo).id
    assert backend.live_leases("default", [live, overdue, ready, "missing"]) == [live]


def test_requeue_matching_skips_live_leases_unless_forced(backend, raw):
    ids = running(backend, 10, "host:1")
    raw.zadd(RUNNING, {ids[3]: 1})
    assert backend.requeue_matching("default", segment="running") == [ids[3]]
    assert sorted(backend.requeue_matching("default", segment="running", force=True)) == sorted(ids[:3] + ids[4:])
    assert all(backend.get_result(i).worker_ids == ["host:1"] for i in ids)


def test_requeue_matching_misses_no_task_when_the_segment_changes_between_windows(backend, raw):
    # batch_size is 7: each window holds interleaved echo (not matching) and add (matching) tasks,
    # and after each window something else removes the oldest echo tasks from the segment.
    start = datetime.now(UTC) + timedelta(hours=1)
    for i in range(20):
        backend.enqueue(echo.using(run_after=start + timedelta(seconds=2 * i)), [i], {})
        backend.enqueue(add.using(run_after=start + timedelta(seconds=2 * i + 1)), [i, i], {})
    scripts, run = backend.scripts, backend.scripts._run

    def run_then_remove_echoes(script, keys, args):
        reply = run(script, keys, args)
        if script is scripts._requeue_many:
            oldest = raw.zrange("threadmill:{default}:default:deferred", 0, 5)
            echoes = [i.decode() for i in oldest if b"echo" in raw.hget(TASK + i.decode(), "data")][:3]
            backend.delete_many("default", segment="deferred", task_ids=echoes)
        return reply

    scripts._run = run_then_remove_echoes
    moved = backend.requeue_matching("default", segment="deferred", needles=['"path":"tests.tasks.add"'])
    assert len(moved) == 20
    assert {r.task.name for r in backend.peek("default", segment="ready", count=100)} == {"add"}


def test_requeue_many_leaves_a_task_of_another_queue_alone(backend, raw):
    from datetime import UTC, datetime, timedelta

    from tests.tasks import echo

    result = backend.enqueue(echo.using(run_after=datetime.now(UTC) + timedelta(hours=1)), [1], {})

    assert backend.requeue_many("emails", segment="deferred", task_ids=[result.id]) == []

    assert raw.zcard("threadmill:{default}:emails:ready") == 0
    assert raw.zrange("threadmill:{default}:default:deferred", 0, -1) == [result.id.encode()]
    assert raw.hget(f"threadmill:{{default}}:task:{result.id}", "segment") == b"deferred"
