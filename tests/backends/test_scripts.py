"""Each Lua script through its one Python wrapper, asserting its effect on the keys."""

from __future__ import annotations

import pytest

from tests.backends.conftest import enqueue
from tests.tasks import echo
from threadmill.backends.merge import ROW_WIDTH
from threadmill.backends.scripts import ENDED_BY_ABORT, ENDED_BY_TIME_LIMIT
from threadmill.base import Segment

T = "threadmill:{default}:task:"
Q = "threadmill:{default}:default:"


@pytest.fixture
def scripts(backend):
    return backend.scripts


def test_enqueue_writes_the_hash_the_segment_the_queue_set_and_a_counter(scripts, raw):
    scripts.enqueue("id-1", '{"x":1}', "default", Segment.READY, "100", "100", 42)
    assert raw.hgetall(T + "id-1") == {
        b"data": b'{"x":1}',
        b"queue": b"default",
        b"segment": b"ready",
        b"score": b"100",
    }
    assert raw.zscore(Q + "ready", "id-1") == 100
    assert raw.smembers("threadmill:{default}:queues") == {b"default"}
    assert raw.get(Q + "ingress:42") == b"1"
    assert 0 < raw.ttl(Q + "ingress:42")


def test_enqueue_leaves_a_task_already_stored_as_it_is_and_counts_only_the_new_ones(scripts, raw):
    # A retried call whose first reply was lost: its task may have been leased since.
    scripts.enqueue("id-1", '{"x":1}', "default", Segment.READY, "100", "100", 42)
    scripts.acquire(["default"], 1, "w", 30, "tok")
    entries = [("id-1", '{"x":1}', Segment.READY, "100", "100"), ("id-2", "{}", Segment.READY, "200", "200")]
    assert scripts.enqueue_many("default", entries, 42, retried=True).stored == 1
    assert raw.hget(T + "id-1", "segment") == b"running"
    assert raw.zrange(Q + "ready", 0, -1) == [b"id-2"]
    assert raw.get(Q + "ingress:42") == b"2"
    assert raw.hget(Q + "totals", "enqueued") == b"2"
    assert scripts.enqueue_many("default", entries, 42, retried=True).stored == 0
    assert raw.hget(Q + "totals", "enqueued") == b"2"


def test_acquire_moves_ids_to_running_with_a_deadline_from_the_server_clock(scripts, raw):
    for i in range(3):
        scripts.enqueue(f"id-{i}", "{}", "default", Segment.READY, str(i), str(i), 1)
    reply = scripts.acquire(["default"], 2, "w", 30, "base")
    now = int(reply[0])
    assert [reply[2], reply[8]] == [b"id-0", b"id-1"]
    assert [reply[5], reply[11]] == [b"base:1", b"base:2"]
    assert [reply[7], reply[13]] == [None, None]  # neither is a suspect
    assert raw.zrange(Q + "ready", 0, -1) == [b"id-2"]
    assert now + 29 <= raw.zscore(Q + "running", "id-0") <= now + 31
    assert raw.hget(T + "id-0", "segment") == b"running"


def test_acknowledge_refuses_a_wrong_token_and_stores_a_right_one(scripts, raw):
    scripts.enqueue("id", "{}", "default", Segment.READY, "1", "1", 1)
    scripts.acquire(["default"], 1, "w", 30, "tok")
    entries = [("id", "default", "wrong", "{}", Segment.SUCCESSFUL)]
    assert scripts.acknowledge(entries, 60, 1) == [0]
    assert raw.hget(T + "id", "result") is None
    assert scripts.acknowledge([("id", "default", "tok:1", '{"r":1}', Segment.SUCCESSFUL)], 60, 1) == [1]
    assert raw.hmget(T + "id", "result", "segment", "lease_token", "lease_worker") == [
        b'{"r":1}', b"successful", None, None
    ]  # fmt: skip
    assert 0 < raw.ttl(T + "id") <= 60
    assert raw.keys("threadmill:{default}:result:*") == []
    assert raw.zrange(Q + "successful", 0, -1) == [b"id"]
    assert raw.zcard(Q + "running") == 0
    assert raw.get(Q + "egress:1") == b"1"


def test_acknowledge_moves_a_batch_over_both_finished_segments_and_refuses_a_repeat(scripts, raw):
    for i in range(4):
        scripts.enqueue(f"id-{i}", "{}", "default", Segment.READY, str(i), str(i), 1)
    scripts.acquire(["default"], 4, "w", 30, "tok")
    entries = [
        ("id-0", "default", "tok:1", "r0", Segment.SUCCESSFUL),
        ("id-1", "default", "tok:2", "r1", Segment.FAILED),
        ("id-2", "default", "tok:3", "r2", Segment.SUCCESSFUL),
        ("id-2", "default", "tok:3", "again", Segment.SUCCESSFUL),
    ]
    assert scripts.acknowledge(entries, 60, 1) == [1, 1, 1, 0]
    assert raw.zrange(Q + "successful", 0, -1) == [b"id-0", b"id-2"]
    assert raw.zrange(Q + "failed", 0, -1) == [b"id-1"]
    assert raw.zrange(Q + "running", 0, -1) == [b"id-3"]
    assert raw.hget(T + "id-2", "result") == b"r2"
    assert raw.get(Q + "failed:1") == b"1"
    assert raw.hmget(Q + "totals", "finished", "failed") == [b"3", b"1"]


def test_acknowledge_counts_the_runs_a_time_limit_or_an_abort_ended_only_where_stored(scripts, raw):
    for i in range(3):
        scripts.enqueue(f"id-{i}", "{}", "default", Segment.READY, str(i), str(i), 1)
    scripts.acquire(["default"], 3, "w", 30, "tok")
    entries = [
        ("id-0", "default", "tok:1", "r0", Segment.FAILED, ENDED_BY_TIME_LIMIT),
        ("id-1", "default", "tok:2", "r1", Segment.FAILED, ENDED_BY_ABORT),
        ("id-2", "default", "wrong", "r2", Segment.FAILED, ENDED_BY_TIME_LIMIT),
    ]
    assert scripts.acknowledge(entries, 60, 1) == [1, 1, 0]
    assert raw.hmget(Q + "totals", "failed", "timed_out", "aborted") == [b"2", b"1", b"1"]
    # Without a letter (the usual call, or an older caller's) nothing more is counted.
    assert scripts.acknowledge([("id-2", "default", "tok:3", "r2", Segment.FAILED)], 60, 1) == [1]
    assert raw.hmget(Q + "totals", "failed", "timed_out", "aborted") == [b"3", b"1", b"1"]


def test_requeue_counts_the_totals_field_it_is_given_once_requeued(scripts, raw):
    scripts.enqueue("id", "{}", "default", Segment.READY, "1", "1", 1)
    scripts.acquire(["default"], 1, "w", 30, "tok")
    assert scripts.requeue("id", "default", run_after=None, token="wrong", counted="timed_out") == -1
    assert raw.hget(Q + "totals", "timed_out") is None
    assert scripts.requeue("id", "default", run_after=None, token="tok:1", counted="timed_out") == 1
    assert raw.hget(Q + "totals", "timed_out") == b"1"


def test_requeue_moves_from_any_segment_and_keeps_the_priority_band(scripts, raw):
    scripts.enqueue("id", "{}", "default", Segment.READY, "30000000000005", "30000000000005", 1)
    scripts.acquire(["default"], 1, "w", 30, "tok")
    assert scripts.requeue("id", "default", run_after=None) == 1
    assert raw.zscore(Q + "ready", "id") // 10**13 == 3
    assert scripts.requeue("id", "default", run_after=None) == 0


def test_requeue_refuses_a_task_that_left_the_segment_it_was_read_in(scripts, raw):
    scripts.enqueue("id", "{}", "default", Segment.DEFERRED, "1", "1", 1)
    scripts.promote("default", 10)
    scripts.acquire(["default"], 1, "w", 30, "tok")
    assert scripts.requeue("id", "default", run_after=None, segment="deferred") == -1
    assert raw.hmget(T + "id", "segment", "lease_token") == [b"running", b"tok:1"]
    assert raw.zrange(Q + "running", 0, -1) == [b"id"]
    assert scripts.requeue("id", "default", run_after=None, token="tok:1", segment="running") == 1


def test_quarantine_moves_to_unreadable_and_records_the_error(scripts, raw):
    scripts.enqueue("id", "junk", "default", Segment.READY, "1", "1", 1)
    assert scripts.quarantine("id", "default", Segment.READY, "ValueError: junk") == 1
    assert raw.zrange(Q + "unreadable", 0, -1) == [b"id"]
    assert raw.hget(T + "id", "read_error") == b"ValueError: junk"
    assert raw.hget(T + "id", "data") == b"junk"


def test_quarantine_refuses_a_task_no_longer_in_the_segment_it_was_read_in(scripts, raw):
    scripts.enqueue("id", "junk", "default", Segment.READY, "1", "1", 1)
    scripts.acquire(["default"], 1, "w", 30, "tok")
    assert scripts.quarantine("id", "default", Segment.READY, "ValueError: junk") == -1
    assert raw.hmget(T + "id", "segment", "lease_token") == [b"running", b"tok:1"]
    assert raw.zcard(Q + "unreadable") == 0
    assert scripts.quarantine("id", "default", Segment.RUNNING, "ValueError: junk", "tok:1") == 1
    assert (raw.zcard(Q + "running"), raw.zcard(Q + "unreadable")) == (0, 1)


def test_pass_wake_pushes_one_token_for_the_first_unpaused_queue_with_ready_tasks_and_none(scripts, raw):
    assert scripts.pass_wake(["default", "emails"]) == 0
    for queue in ("default", "emails"):
        scripts.enqueue(f"id-{queue}", "{}", queue, Segment.READY, "1", "1", 1)
    raw.delete(Q + "wake", "threadmill:{default}:emails:wake")
    scripts.pause("default", "ops")
    assert scripts.pass_wake(["default", "emails"]) == 1
    assert (raw.llen(Q + "wake"), raw.llen("threadmill:{default}:emails:wake")) == (0, 1)
    assert scripts.pass_wake(["default", "emails"]) == 0
    assert raw.llen("threadmill:{default}:emails:wake") == 1


def test_promote_moves_due_ids_with_their_stored_ready_score(scripts, raw):
    scripts.enqueue("due", "{}", "default", Segment.DEFERRED, "77", "1", 1)
    scripts.enqueue("later", "{}", "default", Segment.DEFERRED, "78", "99999999999", 1)
    moved, due_in = scripts.promote("default", 10)
    assert moved == 1
    assert due_in > 10**9  # "later" falls due at epoch second 99,999,999,999
    assert raw.zrange(Q + "ready", 0, -1, withscores=True) == [(b"due", 77.0)]
    # An idle worker is woken for the promoted task: one token.
    assert raw.lrange(Q + "wake", 0, -1) == [b"1"]


def test_promote_says_when_nothing_is_deferred(scripts, raw):
    assert scripts.promote("default", 10) == (0, None)
    assert raw.llen(Q + "wake") == 0


def test_enqueue_pushes_one_wake_token_however_many_ready_tasks_arrive(scripts, raw):
    for i in range(3):
        scripts.enqueue(f"id-{i}", "{}", "default", Segment.READY, str(i), str(i), 1)
    scripts.enqueue("later", "{}", "default", Segment.DEFERRED, "9", "9", 1)
    assert raw.lrange(Q + "wake", 0, -1) == [b"1"]


def test_a_full_acquire_passes_the_wake_token_on_when_tasks_are_left(scripts, raw):
    for i in range(3):
        scripts.enqueue(f"id-{i}", "{}", "default", Segment.READY, str(i), str(i), 1)
    raw.delete(Q + "wake")  # An idle worker took the enqueue's token.
    scripts.acquire(["default"], 2, "w", 30, "a")
    assert raw.llen(Q + "wake") == 1
    raw.delete(Q + "wake")
    scripts.acquire(["default"], 2, "w", 30, "b")  # Takes the last one: nothing to pass on.
    assert raw.llen(Q + "wake") == 0


def test_claim_expired_gives_a_new_token_and_a_claim_window(scripts, raw):
    scripts.enqueue("id", "{}", "default", Segment.READY, "1", "1", 1)
    scripts.acquire(["default"], 1, "w", 30, "tok")
    raw.zadd(Q + "running", {"id": 1})
    reply = scripts.claim_expired("default", 10, 60, "claim")
    assert reply[0] == b"id" and reply[2] == b"w" and reply[5] == b"claim:1"
    assert raw.hget(T + "id", "lease_token") == b"claim:1"
    assert raw.zscore(Q + "running", "id") > 1000
    assert scripts.claim_expired("default", 10, 60, "again") == []


def test_purge_deletes_one_batch_and_spares_tasks_that_moved(scripts, raw):
    for i in range(5):
        scripts.enqueue(f"id-{i}", "{}", "default", Segment.READY, str(i), str(i), 1)
    raw.hset(T + "id-0", "segment", "running")
    assert scripts.purge("default", Segment.READY, 3) == 3
    assert raw.exists(T + "id-0") and not raw.exists(T + "id-1")
    assert raw.zcard(Q + "ready") == 2


def test_delete_removes_the_hash_the_result_and_the_segment_entry(scripts, raw, backend):
    result = enqueue(backend, echo, 1)
    raw.set(f"threadmill:{{default}}:result:{result.id}", "r")
    assert scripts.delete("default", Segment.READY, [result.id, "missing"]) == ([result.id], False)
    assert raw.keys(f"*{result.id}*") == []
    assert raw.zcard(Q + "ready") == 0


def test_delete_leaves_a_task_that_moved_to_another_segment_or_queue(scripts, raw, backend):
    moved, other_queue, stays = (enqueue(backend, echo, i).id for i in range(3))
    backend.acquire("default", count=1, worker="w")
    raw.hset(T + other_queue, "queue", "emails")
    assert scripts.delete("default", Segment.READY, [moved, other_queue, stays]) == ([stays], False)
    assert raw.hget(T + moved, "segment") == b"running"
    assert raw.zscore(Q + "running", moved) is not None
    assert raw.exists(T + other_queue)


def test_delete_removes_the_entry_of_a_task_whose_data_expired(scripts, raw):
    raw.zadd(Q + "failed", {"ghost": 1.0})
    assert scripts.delete("default", Segment.FAILED, ["ghost"]) == (["ghost"], False)
    assert raw.zcard(Q + "failed") == 0


@pytest.mark.single_partition
def test_peek_returns_the_total_and_rows_in_one_reply(scripts, backend):
    ids = [enqueue(backend, echo, i).id for i in range(4)]
    reply = scripts.peek("default", Segment.READY, 1, 2, False)
    assert reply[0] == 4
    assert [reply[2], reply[2 + ROW_WIDTH]] == [ids[1].encode(), ids[2].encode()]


def test_trim_finished_drops_only_ids_older_than_the_ttl_up_to_the_limit(scripts, raw):
    now = float(raw.time()[0])
    raw.zadd(Q + "successful", {"a": 1.0, "b": 2.0, "c": 3.0, "fresh": now})
    raw.zadd(Q + "failed", {"f": 1.0})
    assert scripts.trim_finished("default", 60, 2) == 3
    assert raw.zrange(Q + "successful", 0, -1) == [b"c", b"fresh"]
    assert scripts.trim_finished("default", 60, 2) == 1
    assert scripts.trim_finished("default", 60, 2) == 0


def test_requeue_many_refuses_a_running_task_read_under_another_lease(scripts, raw):
    scripts.enqueue("id", "{}", "default", Segment.READY, "1", "1", 1)
    scripts.acquire(["default"], 1, "w", 30, "tok")
    args = ("default", Segment.RUNNING)
    assert scripts.requeue_many(*args, [("id", "stale", '{"new":1}')], [], True, 15) == ([], ["id"])
    assert scripts.requeue_many(*args, [("id", "", "")], [], True, 15) == ([], ["id"])
    assert raw.hget(T + "id", "data") == b"{}"
    assert scripts.requeue_many(*args, [("id", "tok:1", '{"new":1}')], [], True, 15) == (["id"], [])
    assert raw.hget(T + "id", "data") == b'{"new":1}'
    assert raw.zrange(Q + "ready", 0, -1) == [b"id"]


def test_requeue_many_matches_needles_against_the_stored_document(scripts, raw):
    scripts.enqueue("a", '{"path":"x.a"}', "default", Segment.DEFERRED, "1", "1", 1)
    scripts.enqueue("b", '{"path":"x.b"}', "default", Segment.DEFERRED, "2", "2", 1)
    moved = scripts.requeue_many("default", Segment.DEFERRED, [("a", "", ""), ("b", "", "")], ["x.b"], False, 15)
    assert moved == (["b"], [])


def test_live_leases_keeps_tasks_with_a_future_deadline_and_a_fresh_heartbeat_or_a_young_lease(scripts, raw):
    ids = ["fresh", "stale", "unknown", "unknown-old"]
    for i, worker in enumerate(ids):
        scripts.enqueue(worker, "{}", "default", Segment.READY, str(i), str(i), 1)
        scripts.acquire(["default"], 1, worker, 30, worker)
    now = int(raw.time()[0])
    raw.zadd("threadmill:{default}:workers", {"fresh": now, "stale": now - 20})
    raw.hset("threadmill:{default}:task:unknown-old", "lease_started_at", str(now - 20))
    assert scripts.live_leases("default", ids, 15) == ["fresh", "unknown"]
    # The same from another partition's point of view: the heartbeats come in ARGV.
    assert scripts.live_leases("default", ids, 15, {"fresh": 0.5, "stale": 20.0}) == ["fresh", "unknown"]
    raw.zadd(Q + "running", {"fresh": 1})
    assert scripts.live_leases("default", ids, 15) == ["unknown"]


def test_no_old_heartbeat_is_silent_until_the_server_has_been_up_the_settle_time(scripts, raw):
    ids = ["stale", "unknown-old"]
    for i, worker in enumerate(ids):
        scripts.enqueue(worker, "{}", "default", Segment.READY, str(i), str(i), 1)
        scripts.acquire(["default"], 1, worker, 30, worker)
    now = int(raw.time()[0])
    raw.zadd("threadmill:{default}:workers", {"stale": now - 20})
    raw.hset(T + "unknown-old", "lease_started_at", str(now - 20))
    # Up fewer seconds than that: the old heartbeat may be one restored from before a restart.
    # A worker with no heartbeat at all is judged by its lease as before (a restart restores both).
    uptime = int(raw.info("server")["uptime_in_seconds"])
    assert scripts.live_leases("default", ids, 15, settle_s=uptime + 60) == ["stale"]
    assert scripts.live_leases("default", ids, 15, settle_s=uptime) == []
    entry = [("stale", "stale:1", "")]
    assert scripts.requeue_many("default", Segment.RUNNING, entry, [], False, 15, None, uptime + 60) == ([], [])
    assert scripts.requeue_many("default", Segment.RUNNING, entry, [], False, 15, None, uptime) == (["stale"], [])


@pytest.mark.parametrize("newest_first", [False, True])
def test_scan_walks_a_segment_by_cursor_through_ties_and_removals(scripts, raw, newest_first):
    raw.zadd(Q + "failed", {f"tie-{i:02d}": 5.0 for i in range(10)} | {"a-low": 1.0, "z-high": 9.0, "m": 5.5})
    order = [m.decode() for m in raw.zrange(Q + "failed", 0, -1, desc=newest_first)]
    seen, cursor = [], (b"", b"")
    while entries := scripts.scan("default", Segment.FAILED, cursor, 3, newest_first):
        seen += [task_id.decode() for task_id, _ in entries]
        cursor = (entries[-1][1], entries[-1][0])
        # Remove what was just read and one entry not yet read: nothing still there is skipped.
        raw.zrem(Q + "failed", *[task_id for task_id, _ in entries])
        if len(seen) == 3:
            raw.zrem(Q + "failed", order[5])
    assert seen == [task_id for task_id in order if task_id != order[5]]


def test_trim_full_drops_the_oldest_successful_tasks_and_leaves_a_tombstone_each(scripts, raw, backend):
    old, kept, unique = (enqueue(backend, echo, i).id for i in range(3))
    for task_id, score in ((old, 1.0), (unique, 2.0), (kept, 3.0)):
        raw.hset(T + task_id, "segment", "successful")
        raw.zadd(Q + "successful", {task_id: score})
    raw.hset(T + unique, "unique", "digest")
    raw.set(f"threadmill:{{default}}:result:{old}", "r")
    assert scripts.trim_full("default", 2) == 1
    assert raw.keys(f"*{old}*") == []
    assert raw.zrange(Q + "successful", 0, -1) == [unique.encode(), kept.encode()]
    assert raw.zrange("threadmill:{default}:trimmed", 0, -1, withscores=True) == [(old.encode(), 1.0)]
    assert raw.exists(T + unique) and raw.exists(T + kept)


def test_send_control_leaves_the_same_document_for_each_worker_as_a_plain_hset_did(scripts, raw):
    # An older release's supervisor takes these with take_control: key and document unchanged.
    assert scripts.send_control(["a:1:x", "b:2:y"], '{"command":"stop"}') == 2
    assert scripts.send_control(["a:1:x"], '{"command":"quiet"}') == 0
    assert raw.hgetall("threadmill:{default}:control") == {
        b"a:1:x": b'{"command":"quiet"}',
        b"b:2:y": b'{"command":"stop"}',
    }
    assert scripts.take_control(["a:1:x"]) == [b"a:1:x", b'{"command":"quiet"}']


def test_wake_worker_pushes_one_expiring_token_on_the_workers_own_list(scripts, raw):
    assert scripts.wake_worker("a:1:x", 60) == 1
    key = "threadmill:{default}:worker:a:1:x:wake"
    assert raw.lrange(key, 0, -1) == [b"1"]
    assert 0 < raw.ttl(key) <= 60


def test_pause_schedule_keeps_the_first_pause(scripts, raw):
    assert scripts.pause_schedule("nightly:paused", '{"by":"a"}') == 1
    assert scripts.pause_schedule("nightly:paused", '{"by":"b"}') == 0
    assert raw.hget("threadmill:{default}:schedules", "nightly:paused") == b'{"by":"a"}'


def test_copy_paused_sets_only_the_fields_the_partition_lacks(scripts, raw):
    raw.hset("threadmill:{default}:paused", "emails", "mine")
    paused = {b"emails": b"theirs", b"reports": b"theirs"}
    assert scripts.copy_paused(paused, {b"default": b"3||"}) == 2
    assert raw.hgetall("threadmill:{default}:paused") == {b"emails": b"mine", b"reports": b"theirs"}
    assert raw.hgetall("threadmill:{default}:limits") == {b"default": b"3||"}
