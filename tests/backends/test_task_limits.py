"""Per-task limits (`@task(concurrency=, rate=)`): acquire holds a path to its limit and serves the tasks behind it.

With 3 partitions each holds a share of 1 (enqueues go round the partitions, so 9 tasks put 3 in each).
"""

from __future__ import annotations

import pytest
from django.tasks import TaskResultStatus
from django.tasks.exceptions import InvalidTask

from tests.backends.conftest import enqueue, finish, same_server
from tests.tasks import echo, send_email, three_a_minute, three_at_a_time
from threadmill.backends.redis import RedisTaskBackend
from threadmill.base import ThreadmillTask
from threadmill.limits import TASK_LIMIT_LOOK


def _drain(backend, *queues: str, count: int = 50) -> list:
    """Acquire until a call leases nothing (one acquire takes from one partition); return every lease."""
    leased = []
    while batch := backend.acquire(*queues, count=count, worker="w:1"):
        leased += batch
    return leased


def _names(leased) -> list[str]:
    return sorted(r.task.module_path.rsplit(".", 1)[1] for r in leased)


def _one_partition(backend) -> RedisTaskBackend:
    return RedisTaskBackend("default", same_server(backend, QUEUES=["default"], OPTIONS={"lease_ttl": 300}))


def test_a_task_s_concurrency_holds_its_runs_and_an_acknowledgement_frees_a_slot(backend):
    for i in range(9):
        enqueue(backend, three_at_a_time, i)

    leased = _drain(backend, "default")

    assert _names(leased) == ["three_at_a_time"] * 3
    held = backend.acquire("default", count=5, worker="w:1")
    assert held == [] and held.held_back and held.next_token_s is None
    assert finish(backend, leased[0])
    assert len(_drain(backend, "default")) == 1


def test_tasks_behind_a_held_head_are_served(backend):
    limited = [enqueue(backend, three_at_a_time, i).id for i in range(9)]
    others = {enqueue(backend, echo, i).id for i in range(6)}

    leased = _drain(backend, "default", count=3)

    assert {r.id for r in leased} - set(limited) == others
    assert len([r for r in leased if r.id in limited]) == 3


def test_the_held_tasks_keep_their_places_and_the_others_go_in_order(backend):
    backend = _one_partition(backend)
    limited = [enqueue(backend, three_at_a_time, i).id for i in range(5)]
    others = [enqueue(backend, echo, i).id for i in range(3)]

    leased = _drain(backend, "default", count=4)

    assert [r.id for r in leased] == limited[:3] + others
    finish(backend, leased[0])
    assert [r.id for r in _drain(backend, "default")] == [limited[3]]


def test_a_task_s_limit_counts_its_runs_in_every_queue(backend):
    for i in range(9):
        enqueue(backend, three_at_a_time, i)
        enqueue(backend, three_at_a_time.using(queue_name="emails"), i)

    leased = _drain(backend, "default", "emails")

    assert len(leased) == 3


def test_a_task_s_rate_admits_its_burst_then_says_when_the_next_token_comes(backend):
    for i in range(9):
        enqueue(backend, three_a_minute, i)
    enqueue(backend, send_email, "a@example.com")

    leased = _drain(backend, "default", "emails")

    assert _names(leased) == ["send_email"] + ["three_a_minute"] * 3
    held = backend.acquire("default", count=5, worker="w:1")
    assert held == [] and held.held_back
    assert 59 < held.next_token_s <= 60


def test_a_slot_is_free_again_once_its_lease_is_released_or_requeued(backend):
    for i in range(9):
        enqueue(backend, three_at_a_time, i)
    first, second, _ = _drain(backend, "default")

    assert backend.release([first]) == 1
    assert backend.requeue(second.id)

    assert len(_drain(backend, "default")) == 2


def test_acquire_looks_a_bounded_number_of_tasks_past_a_held_head(backend):
    backend = _one_partition(backend)
    for i in range(3):
        enqueue(backend, three_at_a_time, i)
    assert len(_drain(backend, "default")) == 3
    for i in range(TASK_LIMIT_LOOK - 1):
        enqueue(backend, three_at_a_time, i)
    near = enqueue(backend, echo, "near")
    assert [r.id for r in _drain(backend, "default")] == [near.id]

    enqueue(backend, three_at_a_time, "one more")  # TASK_LIMIT_LOOK held tasks now lie ahead of the next
    far = enqueue(backend, echo, "far")
    held = backend.acquire("default", count=5, worker="w:1")

    assert held == [] and held.held_back
    assert backend.get_result(far.id).status == TaskResultStatus.READY


def test_plain_tasks_leave_no_trace_of_per_task_limits(backend, server):
    backend = _one_partition(backend)
    result = enqueue(backend, echo, 1)
    keys = backend.keys_for(0)
    raw = server.client_for(keys.task(result.id))

    assert _drain(backend, "default")
    assert not raw.exists(keys.limited_queues(), keys.task_limits())
    assert raw.hget(keys.task(result.id), "limit_path") is None


def test_a_limited_task_records_its_path_and_limit_for_acquire(backend, server):
    backend = _one_partition(backend)
    result = enqueue(backend, three_a_minute, 1)
    keys = backend.keys_for(0)
    raw = server.client_for(keys.task(result.id))

    assert raw.hget(keys.task(result.id), "limit_path") == b"tests.tasks.three_a_minute"
    assert raw.hgetall(keys.task_limits()) == {b"tests.tasks.three_a_minute": b"|3|60"}
    assert raw.hgetall(keys.limited_queues()) == {b"default": b"1"}


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"concurrency": 0}, "A concurrency limit is a whole number of at least 1, not 0."),
        ({"concurrency": True}, "A concurrency limit is a whole number of at least 1, not True."),
        ({"rate": "5/x"}, "A rate is N/s, N/m or N/h with N a whole number, not '5/x'."),
    ],
)
def test_a_bad_per_task_limit_is_refused_where_the_task_is_declared(options, message):
    with pytest.raises(InvalidTask) as caught:
        ThreadmillTask(
            priority=0, func=echo.func, queue_name="default", backend="default", takes_context=False, **options
        )
    assert str(caught.value) == message


def test_a_per_task_limit_below_the_partition_count_is_refused_at_enqueue(backend):
    partitioned = RedisTaskBackend("default", same_server(backend, OPTIONS={"partitions": 4}))

    with pytest.raises(InvalidTask, match=r"tests.tasks.three_at_a_time: A concurrency limit of 3 is below the 4 "):
        partitioned.enqueue(three_at_a_time, (1,), {})
    assert partitioned.acquire("default", count=5, worker="w:1") == []


def test_the_tooling_reads_each_limited_path_with_its_runs_and_next_token(backend):
    for i in range(9):
        enqueue(backend, three_at_a_time, i)
        enqueue(backend, three_a_minute, i)
    leased = _drain(backend, "default")
    finish(backend, next(r for r in leased if r.task.module_path.endswith("three_at_a_time")))

    limits = backend.task_limits()

    assert sorted(limits) == ["tests.tasks.three_a_minute", "tests.tasks.three_at_a_time"]
    concurrency, rate = limits["tests.tasks.three_at_a_time"], limits["tests.tasks.three_a_minute"]
    assert (str(concurrency.limit.concurrency), concurrency.running, concurrency.at_concurrency) == ("3", 2, False)
    assert concurrency.next_token_s is None
    assert rate.limit.rate is not None and str(rate.limit.rate) == "3/m"
    assert rate.running == 0 and 59 < rate.next_token_s <= 60
