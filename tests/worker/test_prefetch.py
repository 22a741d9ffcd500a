"""The buffer sized by time: the arithmetic of `Prefetch`, and what a real process leases with it."""

from __future__ import annotations

import time

import pytest

from tests import tasks
from tests.worker.conftest import wait_until
from threadmill.backends.redis import RedisTaskBackend
from threadmill.worker.config import WorkerConfig
from threadmill.worker.prefetch import AUTO_MAX_SIZE, COLD_PER_THREAD, Prefetch
from threadmill.worker.process import WorkerProcess
from threadmill.worker.telemetry import TelemetryPublisher


def _timed(prefetch: Prefetch, run_s: float, tasks_run: int = 50) -> int:
    for _ in range(tasks_run):
        prefetch.task_ran(run_s)
    return prefetch.resize()


def test_a_process_that_timed_nothing_leases_four_per_thread():
    assert Prefetch(threads=3, count=0, window_s=0.02, lease_ttl_s=3600).resize() == COLD_PER_THREAD * 3


def test_the_buffer_holds_the_window_of_work_between_one_per_thread_and_the_cap():
    assert _timed(Prefetch(2, 0, window_s=0.02, lease_ttl_s=3600), run_s=0.001) == 40
    assert _timed(Prefetch(2, 0, window_s=0.02, lease_ttl_s=3600), run_s=2.0) == 2
    assert _timed(Prefetch(1, 0, window_s=0.02, lease_ttl_s=3600), run_s=0.00005) == AUTO_MAX_SIZE


def test_the_average_follows_a_change_of_run_time_within_tens_of_tasks():
    prefetch = Prefetch(1, 0, window_s=0.02, lease_ttl_s=3600)
    assert _timed(prefetch, run_s=0.0001) == 200
    assert _timed(prefetch, run_s=0.5, tasks_run=40) == 1


def test_a_slow_round_trip_makes_the_buffer_hide_it():
    prefetch = Prefetch(1, 0, window_s=0.02, lease_ttl_s=3600)
    for _ in range(20):
        prefetch.acquired(0.05)
    # Refilled at half empty, the rest must last the 50 ms trip: 100 ms of 1 ms tasks.
    assert _timed(prefetch, run_s=0.001) == 100


def test_buffered_work_never_takes_more_than_a_tenth_of_the_lease():
    prefetch = Prefetch(1, 0, window_s=5.0, lease_ttl_s=2.0)
    assert _timed(prefetch, run_s=0.01) == 20


def test_a_fixed_count_ignores_run_times():
    prefetch = Prefetch(4, 3, window_s=0.02, lease_ttl_s=3600)
    assert _timed(prefetch, run_s=2.0) == 3 and not prefetch.auto


class RecordsAcquires(RedisTaskBackend):
    """The real backend, keeping the count each acquire asked for."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.counts: list[int] = []

    def acquire(self, *queue_names, count=1, **kwargs):
        self.counts.append(count)
        return super().acquire(*queue_names, count=count, **kwargs)


def _drained(backend: RedisTaskBackend, **config) -> WorkerProcess:
    process = WorkerProcess(backend, WorkerConfig(queues=("default",), exit_empty=True, **config), "h:1:a")
    process.start()
    assert process.finished.wait(60), "the process did not drain"
    assert process.exit_code == 0 and not process.holds_leases
    return process


def test_slow_tasks_are_leased_one_per_thread_once_timed(redis_url):
    backend = RecordsAcquires("default", {"REDIS_URL": redis_url})
    for _ in range(16):
        backend.enqueue(tasks.sleep_for, [0.05], {})

    process = _drained(backend, threads=2)

    assert process.done == 16
    first, *later = [count for count in backend.counts]
    assert first == 2 * COLD_PER_THREAD and later and max(later) <= 2, backend.counts
    snapshot = TelemetryPublisher(process).snapshot("running")
    assert (snapshot["prefetch"], snapshot["buffer_size"]) == ("auto", 2)
    assert snapshot["task_run_seconds"] == pytest.approx(0.05, abs=0.04)


def test_fast_tasks_are_leased_up_to_the_cap(redis_url):
    backend = RecordsAcquires("default", {"REDIS_URL": redis_url})
    backend.enqueue_many(tasks.echo, [([i], {}) for i in range(700)])

    # A long window, so a loaded machine's slow echo still asks for the cap.
    process = _drained(backend, threads=1, prefetch_window=1.0)

    assert process.done == 700
    assert backend.counts[0] == COLD_PER_THREAD and max(backend.counts) == AUTO_MAX_SIZE, backend.counts
    assert len(backend.counts) <= 8, backend.counts


def test_an_explicit_count_is_what_every_acquire_asks_for(redis_url):
    backend = RecordsAcquires("default", {"REDIS_URL": redis_url})
    backend.enqueue_many(tasks.echo, [([i], {}) for i in range(30)])

    process = _drained(backend, threads=1, prefetch_count=3)

    assert process.done == 30 and max(backend.counts) == 3


def test_a_run_still_going_counts_once_it_passes_the_average():
    prefetch = Prefetch(1, 0, window_s=0.02, lease_ttl_s=3600)
    assert _timed(prefetch, run_s=0.001) == 20
    # 300 ms into a run: the average would be 19.7 ms with it, so one task holds the window.
    assert prefetch.resize(running_s=0.3) == 1
    assert prefetch.resize(running_s=0.0005) == 20
    assert Prefetch(2, 0, window_s=0.02, lease_ttl_s=3600).resize(running_s=0.1) == 2


class RecordsReleases(RecordsAcquires):
    """The real backend, keeping how many tasks each release handed back."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.released: list[int] = []

    def release(self, results):
        self.released.append(len(results))
        return super().release(results)


def test_a_buffer_leased_for_fast_tasks_hands_slow_ones_back_so_a_new_task_waits_behind_few(redis_url):
    backend = RecordsReleases("default", {"REDIS_URL": redis_url})
    backend.client.delete("test:spells")
    backend.enqueue_many(tasks.spell, [([f"fast{i}", 0.001], {}) for i in range(60)])
    backend.enqueue_many(tasks.spell, [([f"slow{i}", 0.15], {}) for i in range(12)])
    process = WorkerProcess(backend, WorkerConfig(queues=("default",), threads=1), "h:1:a")
    process.start()
    try:
        wait_until(lambda: backend.client.hexists("test:spells", "slow0"), "the first slow task ran")
        enqueued_at = time.time()
        tasks.spell.using(priority=10).enqueue("urgent")
        wait_until(lambda: backend.client.hexists("test:spells", "urgent"), "the urgent task ran", 10)
        wait_until(lambda: backend.client.hlen("test:spells") == 73, "every task ran", 10)
    finally:
        process.stop()
        assert process.finished.wait(30)
    spells = {k.decode(): float(v.split()[0]) for k, v in backend.client.hgetall("test:spells").items()}
    ahead = [
        key for key, started in spells.items() if key.startswith("slow") and enqueued_at < started < spells["urgent"]
    ]
    # Leased 20 at a time for 1 ms tasks, the buffer held slow ones; handed back once the first
    # ran long, the one then buffered starts before the task enqueued meanwhile, and on a loaded
    # machine a refill leased just before that enqueue reached the server (seen once in a full
    # run: released [3, 1]). Without the hand-back all 11 other slow ones would be ahead.
    assert len(ahead) <= 2, (ahead, backend.counts, backend.released)
    assert backend.released, "no buffered task was handed back"  # every task ran: no release at the stop
    assert process.done == 73
