"""The console's scripts, each through its wrapper: peek_matching and requeue_many."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from tests.backends.conftest import enqueue
from tests.tasks import add, echo, explode
from threadmill.backends.base import Segment, UnreadableTask
from threadmill.outcome import error_of, mark_failed

TASK = "threadmill:{default}:task:"


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
    assert backend.requeue_many("default", segment="running", task_ids=ids[:2]) == ids[:2]
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
