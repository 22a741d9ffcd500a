"""The backend contract, run against every configured server kind."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.tasks import TaskResultStatus
from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
from django.tasks.signals import task_enqueued

from tests.backends.conftest import enqueue, finish, same_server
from tests.tasks import add, echo, explode, send_email, urgent
from threadmill.backends.redis import RedisTaskBackend
from threadmill.base import Page, Segment
from threadmill.outcome import error_of, mark_failed, mark_successful


def test_enqueue_stores_a_ready_task_with_a_uuid7_id(backend, raw):
    result = enqueue(backend, add, 1, 2)
    assert result.status == TaskResultStatus.READY
    assert result.id[14] == "7"
    assert raw.zrange("threadmill:{default}:default:ready", 0, -1) == [result.id.encode()]
    assert raw.hget(f"threadmill:{{default}}:task:{result.id}", "segment") == b"ready"


def test_enqueue_sends_the_task_enqueued_signal(backend):
    seen = []

    def receiver(sender, task_result, **kwargs):
        seen.append(task_result.id)

    task_enqueued.connect(receiver)
    try:
        result = enqueue(backend, echo, 1)
    finally:
        task_enqueued.disconnect(receiver)
    assert seen == [result.id]


def test_enqueue_with_run_after_lands_in_deferred(backend, raw):
    later = datetime.now(UTC) + timedelta(hours=1)
    result = enqueue(backend, echo.using(run_after=later), 1)
    assert raw.zscore("threadmill:{default}:default:deferred", result.id) == pytest.approx(later.timestamp())
    assert backend.get_result(result.id).status == TaskResultStatus.READY


def test_get_result_of_an_unknown_id_raises(backend):
    with pytest.raises(TaskResultDoesNotExist):
        backend.get_result("no-such-task")


def test_get_result_of_a_running_task_applies_the_lease(backend):
    result = enqueue(backend, echo, "x")
    [leased] = backend.acquire("default", worker="host:1")
    running = backend.get_result(result.id)
    assert running.status == TaskResultStatus.RUNNING
    assert running.worker_ids == ["host:1"]
    assert running.started_at == leased.started_at
    assert running.last_attempted_at == leased.lease_started_at


def test_get_result_of_a_finished_task_returns_its_value(backend):
    result = enqueue(backend, add, 2, 3)
    [leased] = backend.acquire("default", worker="w")
    assert finish(backend, leased, 5)
    stored = backend.get_result(result.id)
    assert stored.status == TaskResultStatus.SUCCESSFUL
    assert stored.return_value == 5
    assert stored.finished_at is not None


def test_a_result_stored_by_layout_one_is_still_read_and_requeued(backend, raw):
    # Layout 1 kept a finished task's result in a key of its own; it is read until it expires.
    result = enqueue(backend, add, 2, 3)
    [leased] = backend.acquire("default", worker="w")
    assert finish(backend, leased, 5)
    task_key, old_key = backend.keys.task(result.id), backend.keys.result(result.id)
    raw.set(old_key, raw.hget(task_key, "result"))
    raw.hdel(task_key, "result")
    assert backend.get_result(result.id).return_value == 5
    [row] = backend.peek("default", segment=Segment.SUCCESSFUL)
    assert row.return_value == 5
    assert backend.requeue(result.id)
    assert not raw.exists(old_key)
    assert backend.get_result(result.id).status == TaskResultStatus.READY


def test_acquire_leaves_the_payload_untouched(backend, raw):
    result = enqueue(backend, echo, {"big": "x" * 5000})
    key = f"threadmill:{{default}}:task:{result.id}"
    before = raw.hget(key, "data")
    backend.acquire("default", worker="w")
    assert raw.hget(key, "data") == before
    assert raw.hget(key, "lease_worker") == b"w"
    assert raw.hget(key, "lease_token")


@pytest.mark.single_partition
def test_acquire_pops_higher_priority_first_then_fifo(backend):
    first = enqueue(backend, echo, 1)
    second = enqueue(backend, echo, 2)
    high = enqueue(backend, urgent, 3)
    got = backend.acquire("default", count=3, worker="w")
    assert [r.id for r in got] == [high.id, first.id, second.id]


@pytest.mark.single_partition
def test_acquire_is_round_robin_across_queues(backend):
    for i in range(4):
        enqueue(backend, echo, i)
    emails = [enqueue(backend, send_email, f"{i}@x") for i in range(2)]
    got = backend.acquire("default", "emails", count=4, worker="w")
    assert [r.task.queue_name for r in got] == ["default", "emails", "default", "emails"]
    assert {r.id for r in got} >= {e.id for e in emails}


@pytest.mark.single_partition
def test_acquire_rotation_lets_a_backlogged_queue_not_starve_its_neighbour(backend):
    for i in range(10):
        enqueue(backend, echo, i)
    enqueue(backend, send_email, "a@x")
    first = backend.acquire("default", "emails", count=1, worker="w")
    second = backend.acquire("default", "emails", count=1, worker="w")
    assert {first[0].task.queue_name, second[0].task.queue_name} == {"default", "emails"}


def test_acquire_with_nothing_ready_returns_an_empty_list(backend):
    assert backend.acquire("default", worker="w") == []


def test_acquire_with_a_timeout_waits_for_a_task(backend):
    timer = threading.Timer(0.05, lambda: enqueue(backend, echo, 1))
    timer.start()
    got = backend.acquire("default", worker="w", timeout=timedelta(seconds=5))
    timer.join()
    assert len(got) == 1


def test_acquire_with_a_timeout_gives_up_at_the_deadline(backend):
    assert backend.acquire("default", worker="w", timeout=timedelta(milliseconds=50)) == []


def test_two_acquirers_never_get_the_same_task(backend):
    for i in range(200):
        enqueue(backend, echo, i)
    seen: list[list[str]] = [[], []]

    def drain(slot):
        other = RedisTaskBackend("default", same_server(backend, QUEUES=["default"]))
        while got := other.acquire("default", count=3, worker=f"w{slot}"):
            seen[slot].extend(r.id for r in got)

    threads = [threading.Thread(target=drain, args=(slot,)) for slot in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(seen[0]) + len(seen[1]) == 200
    assert not set(seen[0]) & set(seen[1])


def test_acknowledge_moves_the_task_to_successful_and_clears_the_lease(backend, raw):
    result = enqueue(backend, echo, 1)
    [leased] = backend.acquire("default", worker="w")
    assert finish(backend, leased, 1)
    key = f"threadmill:{{default}}:task:{result.id}"
    assert raw.zcard("threadmill:{default}:default:running") == 0
    assert raw.zrange("threadmill:{default}:default:successful", 0, -1) == [result.id.encode()]
    assert raw.hget(key, "lease_token") is None
    assert 0 < raw.ttl(key) <= backend.config.result_ttl


def test_acknowledge_without_a_return_value_stores_the_one_on_the_result(backend):
    result = enqueue(backend, add, 2, 3)
    [leased] = backend.acquire("default", worker="w")
    mark_successful(leased, datetime.now(UTC))
    object.__setattr__(leased, "_return_value", {"sum": 5})
    assert backend.acknowledge(leased)
    assert backend.get_result(result.id).return_value == {"sum": 5}


def test_acknowledge_with_an_explicit_return_value_prefers_it(backend):
    result = enqueue(backend, add, 2, 3)
    [leased] = backend.acquire("default", worker="w")
    mark_successful(leased, datetime.now(UTC))
    object.__setattr__(leased, "_return_value", "on the result")
    assert backend.acknowledge(leased, None)
    assert backend.get_result(result.id).return_value is None


def test_acknowledge_of_a_failure_keeps_the_error(backend):
    result = enqueue(backend, explode)
    [leased] = backend.acquire("default", worker="w")
    mark_failed(leased, error_of(RuntimeError("boom")), datetime.now(UTC))
    assert backend.acknowledge(leased)
    stored = backend.get_result(result.id)
    assert stored.status == TaskResultStatus.FAILED
    assert stored.errors[0].exception_class_path == "builtins.RuntimeError"
    assert "boom" in stored.errors[0].traceback


def test_a_fenced_acknowledge_cannot_clobber_a_newer_lease(backend):
    result = enqueue(backend, echo, 1)
    [stale] = backend.acquire("default", worker="old")
    assert backend.requeue(result.id)
    [fresh] = backend.acquire("default", worker="new")
    assert not finish(backend, stale, "stale")
    assert backend.get_result(result.id).status == TaskResultStatus.RUNNING
    assert finish(backend, fresh, "fresh")
    assert backend.get_result(result.id).return_value == "fresh"


@pytest.mark.single_partition
def test_lease_tokens_are_unique_per_lease(backend):
    for i in range(50):
        enqueue(backend, echo, i)
    tokens = [r.lease_token for _ in range(5) for r in backend.acquire("default", count=10, worker="w")]
    assert len(tokens) == len(set(tokens)) == 50


def test_acknowledge_trims_the_history_to_the_result_ttl(backend, raw):
    raw.zadd("threadmill:{default}:default:successful", {"ancient": 1.0})
    enqueue(backend, echo, 1)
    [leased] = backend.acquire("default", worker="w")
    finish(backend, leased)
    assert raw.zscore("threadmill:{default}:default:successful", "ancient") is None


def test_requeue_clears_the_lease_and_keeps_the_id(backend, raw):
    result = enqueue(backend, echo, 1)
    backend.acquire("default", worker="w")
    assert backend.requeue(result.id)
    key = f"threadmill:{{default}}:task:{result.id}"
    assert raw.hget(key, "lease_worker") is None
    assert raw.hget(key, "segment") == b"ready"
    assert raw.zrange("threadmill:{default}:default:ready", 0, -1) == [result.id.encode()]


def test_requeue_of_a_running_task_records_the_abandoned_attempt(backend):
    result = enqueue(backend, echo, 1)
    [leased] = backend.acquire("default", worker="host:1")
    assert backend.requeue(result.id)
    requeued = backend.get_result(result.id)
    assert requeued.status == TaskResultStatus.READY
    assert requeued.worker_ids == ["host:1"]
    assert requeued.started_at == leased.started_at
    [error] = requeued.errors
    assert error.exception_class_path == "threadmill.exceptions.AttemptAbandoned"
    assert "The attempt of worker host:1, leased at " in error.traceback
    assert "by requeue(task_id)" in error.traceback
    [again] = backend.acquire("default", worker="host:2")
    assert again.worker_ids == ["host:1", "host:2"]


def test_requeue_of_a_running_task_with_a_live_lease_still_works(backend, raw):
    result = enqueue(backend, echo, 1)
    backend.acquire("default", worker="host:1")
    seconds, _ = raw.time()
    raw.zadd("threadmill:{default}:workers", {"host:1": seconds})
    assert backend.live_leases("default", [result.id]) == [result.id]
    assert backend.requeue(result.id)
    assert backend.get_result(result.id).status == TaskResultStatus.READY


def test_requeue_from_failed_keeps_errors_and_worker_ids(backend):
    result = enqueue(backend, explode)
    [leased] = backend.acquire("default", worker="first")
    mark_failed(leased, error_of(RuntimeError("once")), datetime.now(UTC))
    backend.acknowledge(leased)
    assert backend.requeue(result.id)
    [again] = backend.acquire("default", worker="second")
    assert again.worker_ids == ["first", "second"]
    assert [e.exception_class_path for e in again.errors] == ["builtins.RuntimeError"]


def test_requeue_with_run_after_defers_the_task(backend, raw):
    result = enqueue(backend, echo, 1)
    backend.acquire("default", worker="w")
    assert backend.requeue(result.id, run_after=timedelta(hours=1))
    assert raw.zscore("threadmill:{default}:default:deferred", result.id) > datetime.now(UTC).timestamp() + 3000


def test_requeue_of_a_result_is_fenced_by_its_lease(backend):
    result = enqueue(backend, echo, 1)
    [stale] = backend.acquire("default", worker="old")
    backend.requeue(result.id)
    backend.acquire("default", worker="new")
    assert not backend.requeue(stale, run_after=timedelta(seconds=5))
    assert backend.get_result(result.id).status == TaskResultStatus.RUNNING


def test_requeue_by_id_leaves_a_task_that_was_promoted_and_acquired_since_it_was_read(backend, raw, caplog):
    later = datetime.now(UTC) + timedelta(hours=1)
    result = enqueue(backend, echo.using(run_after=later), 1)
    read = backend.read_for_requeue(result.id)
    assert read.segment == "deferred"
    # Between the read and the move: its time comes, the mover promotes it, another process acquires it.
    raw.zadd("threadmill:{default}:default:deferred", {result.id: 1})
    backend.scripts.promote("default", 10)
    other = RedisTaskBackend("default", same_server(backend, QUEUES=["default"]))
    [leased] = other.acquire("default", worker="host:2")

    assert backend.requeue_as_read(read, None) != 1

    assert backend.get_result(result.id).status == TaskResultStatus.RUNNING
    assert backend.acquire("default", worker="host:3") == []
    assert finish(other, leased, 1)
    assert f"Requeue of task {result.id} refused: it left the deferred segment since it was read" in caplog.text


def test_requeue_of_a_ready_or_unknown_task_does_nothing(backend):
    result = enqueue(backend, echo, 1)
    assert not backend.requeue(result.id)
    assert not backend.requeue("no-such-task")


def test_purge_deletes_a_segment_and_its_task_data_in_batches(backend, raw):
    ids = [enqueue(backend, echo, i).id for i in range(20)]
    keep = enqueue(backend, send_email, "a@x")
    assert backend.purge("default", segment="ready") == 20
    assert raw.zcard("threadmill:{default}:default:ready") == 0
    assert not any(raw.exists(f"threadmill:{{default}}:task:{i}") for i in ids)
    assert backend.get_result(keep.id).status == TaskResultStatus.READY


def test_delete_removes_selected_tasks(backend):
    a, b, c = (enqueue(backend, echo, i) for i in range(3))
    assert backend.delete([a.id, c.id, "missing"]) == 2
    assert [r.id for r in backend.peek("default", segment=Segment.READY)] == [b.id]


@pytest.mark.single_partition
def test_delete_many_deletes_only_tasks_still_in_the_segment_it_names(backend):
    a, b, c = (enqueue(backend, echo, i) for i in range(3))
    backend.acquire("default", count=1, worker="w")
    assert backend.delete_many("default", segment="ready", task_ids=[a.id, b.id, "missing"]) == [b.id]
    assert backend.get_result(a.id).status == TaskResultStatus.RUNNING
    assert [r.id for r in backend.peek("default", segment=Segment.READY)] == [c.id]


def test_delete_finds_each_task_wherever_it_is(backend):
    a, b = (enqueue(backend, echo, i) for i in range(2))
    backend.acquire("default", count=1, worker="w")
    assert backend.delete([a.id, b.id]) == 2
    assert backend.queue_stats()["default"] == dict.fromkeys(Segment, 0)


def test_peek_returns_a_page_and_the_total_in_queue_order(backend):
    ids = [enqueue(backend, echo, i).id for i in range(12)]
    page = backend.peek("default", segment="ready", offset=5, count=4)
    assert isinstance(page, Page)
    assert page.total == 12
    assert [r.id for r in page] == ids[5:9]


@pytest.mark.single_partition
def test_peek_lists_finished_tasks_newest_first(backend):
    for i in range(3):
        enqueue(backend, echo, i)
    for leased in backend.acquire("default", count=3, worker="w"):
        finish(backend, leased, leased.args[0])
    page = backend.peek("default", segment=Segment.SUCCESSFUL)
    assert [r.return_value for r in page] == [2, 1, 0]


def test_peek_of_running_applies_the_lease(backend):
    enqueue(backend, echo, 1)
    backend.acquire("default", worker="host:9")
    [row] = backend.peek("default", segment="running")
    assert row.status == TaskResultStatus.RUNNING
    assert row.lease_worker == "host:9"
    assert row.lease_deadline > row.lease_started_at


def test_segments_accept_members_or_strings_and_reject_unknown_ones(backend):
    assert backend.peek("default", segment=Segment.READY).total == backend.peek("default", segment="ready").total
    with pytest.raises(ValueError, match="Unknown segment 'stuck'"):
        backend.peek("default", segment="stuck")
    with pytest.raises(ValueError, match="Unknown segment"):
        backend.purge("default", segment="everything")


def test_queue_stats_counts_every_segment(backend):
    enqueue(backend, echo, 1)
    enqueue(backend, echo, 2)
    enqueue(backend, send_email, "a@x")
    backend.acquire("emails", worker="w")
    stats = backend.queue_stats()
    assert stats["default"][Segment.READY] == 2
    assert stats["emails"][Segment.RUNNING] == 1
    assert set(stats["reports"].values()) == {0}


def test_enqueue_validates_the_task(backend):
    with pytest.raises(InvalidTask):
        enqueue(backend, echo.using(queue_name="nowhere"), 1)


def test_a_missing_redis_url_names_it():
    with pytest.raises(ImproperlyConfigured, match="needs a REDIS_URL"):
        RedisTaskBackend("x", {})


def test_an_unknown_option_is_named():
    with pytest.raises(ImproperlyConfigured, match="unknown option.*lease_tll"):
        RedisTaskBackend("x", {"REDIS_URL": "redis://127.0.0.1:1/0", "OPTIONS": {"lease_tll": 3}})


def test_durations_accept_timedeltas_and_reject_nonsense():
    backend = RedisTaskBackend(
        "x", {"REDIS_URL": "redis://127.0.0.1:1/0", "OPTIONS": {"lease_ttl": timedelta(minutes=2)}}
    )
    assert backend.config.lease_ttl == 120.0
    with pytest.raises(ImproperlyConfigured, match="result_ttl"):
        RedisTaskBackend("x", {"REDIS_URL": "redis://127.0.0.1:1/0", "OPTIONS": {"result_ttl": -1}})


def test_async_enqueue_and_get_result(backend):
    import asyncio

    async def roundtrip():
        result = await backend.aenqueue(echo, ["a"], {})
        return await backend.aget_result(result.id)

    assert asyncio.run(roundtrip()).args == ["a"]


def test_throughput_counts_ingress_and_egress_per_minute(backend):
    enqueue(backend, echo, 1)
    enqueue(backend, echo, 2)
    [leased] = backend.acquire("default", worker="w")
    finish(backend, leased)
    counts = backend.throughput("default", minutes=2)
    # Two minutes read: the calls may straddle a minute's end (CI once saw 1 + 1).
    assert sum(counts["ingress"]) == 2
    assert sum(counts["egress"]) == 1


def test_options_stay_the_mapping_django_sets_and_the_parsed_ones_live_in_config():
    raw = {"lease_ttl": timedelta(minutes=2), "worker_timeout": 7}
    backend = RedisTaskBackend("x", {"REDIS_URL": "redis://127.0.0.1:1/0", "OPTIONS": raw})
    assert backend.options == raw
    assert backend.options["worker_timeout"] == 7
    assert backend.config.lease_ttl == 120.0
    assert backend.config.worker_timeout == 7.0
