"""`OPTIONS["partitions"]`: tasks spread over per-partition keys, found again from their ids, and every
reader and writer covering every partition; on one server and on the session's Valkey Cluster."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta

import pytest
import redis
from django.core.exceptions import ImproperlyConfigured
from django.tasks import TaskResultStatus

from tests.backends.conftest import enqueue, finish
from tests.servers import wait_until_settled
from tests.tasks import echo
from threadmill.backends.broker import RedisBroker
from threadmill.backends.keys import KeySchema, partition_tag
from threadmill.backends.partitions import partition_of
from threadmill.backends.redis import RedisTaskBackend
from threadmill.backends.routing import EmptyHints
from threadmill.base import Segment


@pytest.fixture(params=["valkey", "cluster"])
def where(request):
    """A single Valkey server, then the session's three-primary Valkey Cluster."""
    from tests.conftest import _server

    return _server(request.param)


def backend_on(where, partitions: int = 3, **options) -> RedisTaskBackend:
    return RedisTaskBackend(
        "default",
        where.params(
            QUEUES=["default", "emails"],
            OPTIONS={"partitions": partitions, "poll_interval": 0.005, "poll_max_interval": 0.05, **options},
        ),
    )


def raw_for(where, partition: int) -> redis.Redis:
    """A plain client on the node holding one partition's keys."""
    return where.client_for(KeySchema("default", partition).prefix)


def drain(backend, worker="w", count=10) -> list:
    """Acquire until an acquire comes back empty; return every lease."""
    leased = []
    while batch := backend.acquire("default", "emails", count=count, worker=worker):
        leased += batch
    return leased


# -- ids, keys and options ---------------------------------------------------------------


def test_partition_tags_spread_evenly_over_three_equal_shards_and_never_depend_on_p():
    for alias in ("default", "emails", "a-much-longer-alias-name"):
        for partitions in (3, 6, 12):
            thirds = [0, 0, 0]
            for p in range(partitions):
                slot = redis.crc.key_slot(KeySchema(alias, p).task("x").encode())
                thirds[slot * 3 // 16384] += 1
            assert thirds == [partitions // 3] * 3
    assert KeySchema("default", 0).prefix == "threadmill:{default}"
    assert partition_tag("default", 4).startswith("default/4.")


@pytest.mark.parametrize("bad", [0, -1, 257, 2.0, True, "3"])
def test_a_bad_partitions_option_is_refused_naming_it(settings, bad):
    with pytest.raises(ImproperlyConfigured, match=r"\['partitions'\] must be a whole number from 1 to 256"):
        RedisTaskBackend("default", {"REDIS_URL": "redis://127.0.0.1:1/0", "OPTIONS": {"partitions": bad}})


def test_enqueue_spreads_tasks_over_partitions_in_turn_and_each_id_names_its_own(where):
    backend = backend_on(where)
    results = [enqueue(backend, echo, i) for i in range(9)]
    partitions = [partition_of(r.id) for r in results]
    assert sorted(partitions) == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert all(r.id[14] == "8" for r in results)  # UUIDv8: the partition is in the last byte
    for p in range(3):
        ids = {r.id.encode() for r in results if partition_of(r.id) == p}
        assert set(raw_for(where, p).zrange(KeySchema("default", p).segment("default", "ready"), 0, -1)) == ids
    for result in results:
        assert backend.get_result(result.id).args == result.args


def test_enqueue_many_writes_each_script_call_to_one_partition(where):
    backend = backend_on(where)
    results = backend.enqueue_many(echo, [([i], {}) for i in range(5)])
    assert len({partition_of(r.id) for r in results}) == 1
    assert backend.queue_stats()["default"][Segment.READY] == 5


def test_a_partitioned_process_stamps_layout_3_and_the_partition_count_on_its_first_enqueue(where):
    backend = backend_on(where, partitions=4)
    raw = raw_for(where, 0)
    enqueue(backend, echo)
    assert raw.get("threadmill:{default}:layout") == b"3"
    assert raw.get("threadmill:{default}:partitions") == b"4"
    # A process with fewer partitions keeps layout 3 and still covers all four.
    fewer = backend_on(where, partitions=2)
    fewer.check_layout()
    assert raw.get("threadmill:{default}:layout") == b"3"
    assert raw.get("threadmill:{default}:partitions") == b"4"
    assert list(fewer.covered_partitions()) == [0, 1, 2, 3]


# -- the worker's verbs ------------------------------------------------------------------


def test_acquire_finds_every_task_whatever_its_partition_and_each_once(where):
    backend = backend_on(where)
    results = [enqueue(backend, echo, i) for i in range(20)]
    emails = [backend.enqueue(echo.using(queue_name="emails"), [i], {}) for i in range(4)]
    leased = drain(backend, count=3)
    assert sorted(r.id for r in leased) == sorted(r.id for r in results + emails)
    assert len({r.lease_token for r in leased}) == len(leased)
    assert all(r.status == TaskResultStatus.RUNNING for r in leased)
    assert all(finish(backend, r, r.args[0]) for r in leased)
    assert backend.queue_stats()["default"][Segment.SUCCESSFUL] == 20
    assert backend.get_result(results[7].id).return_value == 7


def test_acknowledge_many_settles_leases_of_several_partitions_in_one_call(where):
    backend = backend_on(where)
    for i in range(9):
        enqueue(backend, echo, i)
    leased = drain(backend)
    assert len({partition_of(r.id) for r in leased}) == 3
    from threadmill.outcome import mark_successful

    for r in leased:
        mark_successful(r, r.enqueued_at)
    assert backend.acknowledge_many([(r, r.args[0]) for r in leased]) == [True] * 9
    assert [backend.get_result(r.id).return_value for r in leased] == [r.args[0] for r in leased]


def test_a_fetch_on_a_backlog_costs_one_acquire_and_empty_partitions_come_last():
    hints = EmptyHints(forget_after_s=60)
    assert hints.order(3) == [0, 1, 2]
    assert hints.order(3) == [1, 2, 0]
    hints.came_back(2, full=False)
    hints.came_back(0, full=False)
    assert hints.order(3) == [1, 2, 0]  # 1 first, then the short ones, longest short first
    hints.woken(0)
    assert hints.order(3) == [0, 1, 2]


def test_release_and_requeue_go_to_the_partition_of_each_task(where):
    backend = backend_on(where)
    for i in range(6):
        enqueue(backend, echo, i)
    leased = drain(backend)
    assert backend.release(leased[:4]) == 4
    assert backend.requeue(leased[4].id)
    assert backend.requeue(leased[5].id, run_after=timedelta(hours=1))
    stats = backend.queue_stats()["default"]
    assert (stats[Segment.READY], stats[Segment.DEFERRED], stats[Segment.RUNNING]) == (5, 1, 0)


def test_release_unanswered_looks_in_every_partition(where):
    backend = backend_on(where)
    for i in range(6):
        enqueue(backend, echo, i)
    for _ in range(3):
        backend.acquire("default", count=2, worker="w", token_base="lost")
    assert backend.queue_stats()["default"][Segment.RUNNING] == 6
    assert backend.release_unanswered(["default"], ["lost"]) == 6
    assert backend.queue_stats()["default"][Segment.READY] == 6


def test_an_idle_wait_wakes_on_an_enqueue_to_any_partition(where):
    waiter, producer = backend_on(where), backend_on(where)
    for _ in range(2):
        # Every partition comes back short: the waiter blocks on all of them.
        assert waiter.acquire("default", worker="w") == []
    woke: list[bool] = []
    thread = threading.Thread(target=lambda: woke.append(waiter.wait_for_tasks(["default"], "w", 10)))
    started = time.monotonic()
    thread.start()
    producer._enqueue_turn = 1  # the next enqueue goes to partition 2
    time.sleep(0.2)  # let the waiter block first; the test passes either way, faster when it does
    result = enqueue(producer, echo, "late")
    assert partition_of(result.id) == 2
    thread.join(10)
    assert woke == [True] and time.monotonic() - started < 5
    [leased] = waiter.acquire("default", worker="w")
    assert leased.id == result.id


def test_pause_holds_on_every_partition_and_resume_wakes_them(where):
    backend = backend_on(where)
    for i in range(6):
        enqueue(backend, echo, i)
    assert backend.pause("default", by="ops")
    assert not backend.pause("default", by="ops")
    assert drain(backend) == []
    assert list(backend.paused_queues()) == ["default"]
    assert backend.resume("default")
    assert len(drain(backend)) == 6


def test_a_console_older_than_a_wider_process_resumes_every_partition_the_pause_was_copied_to(where):
    console = backend_on(where, partitions=1)
    assert list(console.covered_partitions()) == [0]  # read now, not again for SEEN_REFRESH_S
    assert console.pause("default", by="ops")
    wide = backend_on(where, partitions=3)
    wide.check_layout()  # its first start copies the pause into partitions 1 and 2
    for i in range(6):
        enqueue(wide, echo, i)
    assert drain(wide) == []

    assert console.resume("default")

    assert console.paused_queues() == {} and wide.paused_queues() == {}
    assert len(drain(wide)) == 6


def test_a_console_older_than_a_wider_process_pauses_every_partition(where):
    console = backend_on(where, partitions=1)
    assert list(console.covered_partitions()) == [0]
    wide = backend_on(where, partitions=3)
    wide.check_layout()
    for i in range(6):
        enqueue(wide, echo, i)

    assert console.pause("default", by="ops")

    assert drain(wide) == []
    assert list(wide.paused_queues()) == ["default"]


def test_a_queue_paused_in_any_partition_reads_as_paused_and_resume_clears_it(where):
    wide = backend_on(where, partitions=3)
    wide.check_layout()
    for i in range(6):
        enqueue(wide, echo, i)
    # What an older release's resume left behind: partition 2 alone still paused.
    document = '{"by": "ops", "since": 1700000000.5}'
    raw_for(where, 2).hset(KeySchema("default", 2).paused(), "default", document)
    stranded = [r.id for r in drain(wide)]
    assert len(stranded) < 6

    for reader in (wide, backend_on(where, partitions=1)):
        paused = reader.paused_queues()
        assert list(paused) == ["default"] and paused["default"].by == "ops"
    assert backend_on(where, partitions=1).resume("default")
    assert wide.paused_queues() == {}
    assert len(stranded) + len(drain(wide)) == 6


# -- the broker --------------------------------------------------------------------------


def test_the_broker_promotes_reaps_and_recovers_in_every_partition(where):
    backend = backend_on(where, lease_ttl=1, worker_timeout=2, socket_timeout=1)
    broker = RedisBroker(backend, ["default"])
    broker._reachable_since = float("-inf")
    deferred = [
        backend.enqueue(echo.using(run_after=datetime.now(UTC) - timedelta(seconds=1)), [i], {}) for i in range(3)
    ]
    assert {partition_of(r.id) for r in deferred} == {0, 1, 2}
    assert broker.move_all() == 3
    # Leased by a worker that then goes silent: recovery (its heartbeat is stale) in every partition.
    leased = drain(backend, worker="h:dead")
    backend.heartbeat("h:dead", {"type": "worker"})
    raw = raw_for(where, 0)
    seconds, micros = raw.time()
    # Silent past worker_timeout (2 s), not yet past lease_ttl + worker_timeout (3 s), when leases are the reaper's.
    raw.zadd("threadmill:{default}:workers", {"h:dead": seconds + micros / 1e6 - 2.5})
    _, recovered = broker.run_once()
    assert recovered == 3
    assert backend.queue_stats()["default"][Segment.READY] == 3
    assert all(backend.get_result(r.id).errors[-1].exception_class_path.endswith("WorkerLost") for r in leased)
    # Leased again and let run out: the reaper fails or retries them, in every partition.
    drain(backend, worker="h:quiet")
    deadline = time.monotonic() + 5
    reaped = 0
    while reaped < 3 and time.monotonic() < deadline:
        reaped += broker.reap("default")
        time.sleep(0.1)
    assert reaped == 3


def test_the_broker_recovers_the_leases_of_a_worker_with_no_heartbeat_in_every_partition(where):
    backend = backend_on(where, worker_timeout=2, socket_timeout=1)
    broker = RedisBroker(backend, ["default"])
    broker._reachable_since = float("-inf")
    for i in range(3):
        enqueue(backend, echo, i)
    lost = drain(backend, worker="h:1:lost")  # never sent a heartbeat
    for i in range(3):
        enqueue(backend, echo, i)
    fresh = drain(backend, worker="h:2:new")  # leased before its first heartbeat went out
    backend.heartbeat("h:3:other", {"type": "worker"})  # the heartbeats other partitions are told of
    assert {partition_of(r.id) for r in lost} == {0, 1, 2}
    for result in lost:
        raw, keys = raw_for(where, partition_of(result.id)), KeySchema("default", partition_of(result.id))
        seconds, micros = raw.time()
        started = seconds + micros / 1e6 - 2.5  # older than worker_timeout
        raw.hset(keys.task(result.id), "lease_started_at", f"{started:.6f}")
        raw.zadd(keys.segment("default", Segment.RUNNING), {result.id: started + backend.config.lease_ttl})

    assert broker.run_once() == (0, 3)

    assert all(backend.get_result(r.id).errors[-1].exception_class_path.endswith("WorkerLost") for r in lost)
    assert all(backend.get_result(r.id).lease_token == r.lease_token for r in fresh)


def test_a_task_is_failed_at_its_third_lost_worker_in_every_partition_when_the_first_loss_looked_unstarted(where):
    backend = backend_on(where, worker_timeout=2, socket_timeout=1)
    broker = RedisBroker(backend, ["default"])
    broker._reachable_since = float("-inf")
    results = [enqueue(backend, echo, i) for i in range(6)]
    assert {partition_of(r.id) for r in results} == {0, 1, 2}
    raw = raw_for(where, 0)

    for worker in ("h:1", "h:2", "h:3"):
        for result in drain(backend, worker=worker):
            if result.worker_losses is not None:
                assert backend.record_progress(result, "started")
        # The first loss looks unstarted: the heartbeat saw every task waiting in the buffer.
        backend.heartbeat(worker, {"type": "worker", "buffered": [r.id for r in results]})
        seconds, micros = raw.time()
        raw.zadd("threadmill:{default}:workers", {worker: seconds + micros / 1e6 - 2.5})
        assert broker.run_once() == (0, 6)

    for result in results:
        failed = backend.get_result(result.id)
        assert failed.status == TaskResultStatus.FAILED
        assert [e.exception_class_path for e in failed.errors] == ["threadmill.exceptions.WorkerLost"] * 2


# -- the console's reads and actions -----------------------------------------------------


def test_counts_totals_and_history_sum_over_partitions(where):
    backend = backend_on(where)
    for i in range(7):
        enqueue(backend, echo, i)
    leased = drain(backend)
    for r in leased[:4]:
        finish(backend, r)
    stats = backend.queue_stats()["default"]
    assert (stats[Segment.RUNNING], stats[Segment.SUCCESSFUL]) == (3, 4)
    limits = {"cancelled": 0, "abort_requested": 0, "aborted": 0, "timed_out": 0}
    limits |= {"enqueue_retries": 0, "already_stored": 0}
    assert backend.totals()["default"] == {"enqueued": 7, "finished": 4, "failed": 0, **limits}
    history = backend.history("default", minutes=2)
    assert (sum(history["enqueued"]), sum(history["finished"])) == (7, 4)
    assert backend.queue_names() == ["default", "emails"]


def test_peek_merges_the_partitions_in_queue_order(where):
    backend = backend_on(where)
    ids = [enqueue(backend, echo, i).id for i in range(12)]
    page = backend.peek("default", segment="ready", offset=5, count=4)
    assert page.total == 12
    assert [r.id for r in page] == ids[5:9]


def test_keyset_pages_walk_forward_and_back_through_every_partition_in_queue_order(where):
    backend = backend_on(where)
    ids = [r.id for r in backend.enqueue_many(echo, [([i], {}) for i in range(40)])]
    ids += [enqueue(backend, echo, i).id for i in range(40, 65)]
    pages, page = [], backend.peek_page("default", segment="ready", count=20)
    while True:
        assert page.total == 65
        pages.append([r.id for r in page.items])
        if page.next_cursor is None:
            break
        page = backend.peek_page("default", segment="ready", after=page.next_cursor, count=20)
    assert [len(p) for p in pages] == [20, 20, 20, 5]
    assert [task_id for p in pages for task_id in p] == ids
    back = backend.peek_page("default", segment="ready", before=page.previous_cursor, count=20)
    assert [r.id for r in back.items] == pages[2]
    second = backend.peek_page("default", segment="ready", before=back.previous_cursor, count=20)
    assert [r.id for r in second.items] == pages[1]
    first = backend.peek_page("default", segment="ready", before=second.previous_cursor, count=20)
    assert [r.id for r in first.items] == pages[0] and first.previous_cursor is None


def test_finished_pages_merge_newest_first(where):
    backend = backend_on(where)
    for i in range(6):
        enqueue(backend, echo, i)
    for r in sorted(drain(backend), key=lambda r: r.args[0]):
        finish(backend, r, r.args[0])
        time.sleep(0.002)  # finished in distinct milliseconds, so "newest" is well defined
    page = backend.peek_page("default", segment="successful", count=4)
    assert [r.return_value for r in page.items] == [5, 4, 3, 2]
    rest = backend.peek_page("default", segment="successful", after=page.next_cursor, count=4)
    assert [r.return_value for r in rest.items] == [1, 0] and rest.next_cursor is None


def test_requeue_delete_and_purge_act_per_partition_and_report_one_total(where):
    backend = backend_on(where)
    for i in range(9):
        enqueue(backend, echo, i)
    leased = drain(backend)
    for r in leased:
        finish(backend, r)
    moved = backend.requeue_many("default", segment="successful", task_ids=[r.id for r in leased[:5]])
    assert sorted(moved) == sorted(r.id for r in leased[:5])
    assert backend.requeue_matching("default", segment="successful", needles=["echo"]) != []
    assert backend.queue_stats()["default"][Segment.READY] == 9
    assert backend.delete([leased[0].id, leased[4].id, leased[8].id]) == 3
    assert backend.delete_many("default", segment="ready", task_ids=[leased[1].id, leased[2].id]) == [
        leased[1].id,
        leased[2].id,
    ]
    assert backend.purge("default", segment="ready") == 4
    assert backend.queue_stats()["default"] == dict.fromkeys(Segment, 0)


def test_running_tasks_of_a_live_worker_stay_and_a_silent_workers_move_in_every_partition(where):
    backend = backend_on(where, worker_timeout=2)
    for i in range(6):
        enqueue(backend, echo, i)
    live = drain(backend, worker="h:live")
    backend.heartbeat("h:live", {"type": "worker"})
    ids = [r.id for r in live]
    assert sorted(backend.live_leases("default", ids)) == sorted(ids)
    assert backend.requeue_many("default", segment="running", task_ids=ids) == []
    raw = raw_for(where, 0)
    wait_until_settled(backend)
    seconds, micros = raw.time()
    raw.zadd("threadmill:{default}:workers", {"h:live": seconds + micros / 1e6 - 10})  # now silent
    assert backend.live_leases("default", ids) == []
    assert sorted(backend.requeue_many("default", segment="running", task_ids=ids)) == sorted(ids)
    assert all(backend.get_result(i).status == TaskResultStatus.READY for i in ids)


# -- changing P on a live alias ----------------------------------------------------------


def test_lowering_partitions_strands_nothing_from_4_to_2_to_1(where):
    four = backend_on(where, partitions=4)
    four.check_layout()
    waiting = [enqueue(four, echo, i).id for i in range(16)]
    assert {partition_of(i) for i in waiting} == {0, 1, 2, 3}

    two = backend_on(where, partitions=2)
    two.check_layout()
    assert list(two.covered_partitions()) == [0, 1, 2, 3]
    newer = [enqueue(two, echo, i).id for i in range(4)]
    assert {partition_of(i) for i in newer} == {0, 1}
    half = two.acquire("default", count=100, worker="w2")  # one partition's tasks
    assert half and len(half) < 20

    one = backend_on(where, partitions=1)
    one.check_layout()
    legacy = enqueue(one, echo, "v7").id
    assert partition_of(legacy) == 0 and legacy[14] == "7"
    rest = drain(one, worker="w1")
    ran = [r.id for r in half + rest]
    assert sorted(ran) == sorted(waiting + newer + [legacy])
    assert len(ran) == len(set(ran))
