"""The stored document's encoder and decoder, and the bounds on their caches."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

from tests.tasks import echo
from threadmill.backends import codec
from threadmill.base import Segment


def test_decoding_many_distinct_run_afters_keeps_the_task_cache_bounded():
    start = datetime.now(UTC)
    for i in range(codec.TASK_CACHE_SIZE + 500):
        task = echo.using(run_after=start + timedelta(seconds=i))
        decoded = codec.decode(
            codec.encode_new(task, codec.new_task_id(), [i], {}, time.time()).encode(), Segment.READY
        )
        assert decoded.task.run_after == task.run_after
    assert len(codec._tasks) <= codec.TASK_CACHE_SIZE


def test_encoding_results_of_many_task_objects_keeps_the_spec_cache_bounded():
    start = datetime.now(UTC)
    for i in range(codec.SPEC_CACHE_SIZE + 500):
        task = echo.using(run_after=start + timedelta(seconds=i))
        result = codec.decode(codec.encode_new(task, codec.new_task_id(), [i], {}, time.time()).encode(), Segment.READY)
        assert f'"run_after":{task.run_after.timestamp()}' in codec.encode_result(result)
    assert len(codec._spec_texts) <= codec.SPEC_CACHE_SIZE


def test_a_bounded_cache_forgets_its_oldest_entry_first():
    cache = codec.BoundedCache(3)
    for key in "abcd":
        cache.put(key, key.upper())
    assert dict(cache) == {"b": "B", "c": "C", "d": "D"}
    cache.put("c", "again")
    assert len(cache) == 3 and cache["c"] == "again"


def test_an_acquires_first_leases_read_their_shared_start_and_enqueue_time_once(backend):
    enqueued = {r.id: r.enqueued_at for r in backend.enqueue_many(echo, [((i,), {}) for i in range(5)])}

    leased = backend.acquire("default", count=5, worker="w-1")  # partitioned: one partition's tasks

    assert leased and {r.id: r.enqueued_at for r in leased}.items() <= enqueued.items()
    assert len({id(r.started_at) for r in leased}) == len({id(r.enqueued_at) for r in leased}) == 1
    assert all(abs((r.started_at - r.lease_started_at).total_seconds()) < 1e-3 for r in leased)


def test_reading_times_in_turn_reads_each_as_its_own_value():
    texts = [b"1764650000.5", b"1764650000.5", b"1764650001.25", 1764650000.5, "1764650001.25", None, b"", 7]
    assert [codec.moment(value) for value in texts] == [
        None if value in (None, b"") else datetime.fromtimestamp(float(value), UTC) for value in texts
    ]
