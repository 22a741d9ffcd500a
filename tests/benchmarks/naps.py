"""Sleeping tasks that record when they ran, and the fairness benchmark's filler.

Every system's `nap` task calls `nap(token, seconds)`: it sleeps for its duration, so the
CPU a queue spends does not stretch the work, then writes its start, finish and process
id (`time.time()`, this machine's clock) to a hash in a database of its own
(`peers.FAIRNESS_DB`) with one command. The fairness benchmark reads its makespan and the
priority task's start from that hash, the same way for every queue.

`python -m tests.benchmarks.naps SYSTEM [--order fast-first]` fills the queue of SYSTEM with
the fast and slow tasks, interleaved (or every fast one first), and prints `filled`; then it waits for the first task to start, and
one second after that start enqueues the priority task and prints when it did, as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable

#: Hash of task token -> JSON [started, finished, pid], epoch seconds.
RUNS_KEY = "bench:fairness:runs"
#: Fast tasks, then one slow task, repeated `ROUNDS` times.
FAST_PER_SLOW = 10
ROUNDS = 40
FAST_S = 0.001
SLOW_S = 0.250
#: How the fast and slow tasks are ordered: ten fast then one slow, repeated, or every fast one first.
ORDERS = ("interleaved", "fast-first")
#: The priority task's duration, and when it is enqueued: this long after the first task started.
URGENT_S = 0.001
URGENT_AFTER_S = 1.0
URGENT_TOKEN = "urgent"
#: Seconds the filler waits for a worker to start its first task.
FIRST_START_TIMEOUT_S = 60.0
#: Seconds between two reads of the runs hash while waiting for the first task.
POLL_S = 0.005

_client = None


def _runs_client():
    global _client
    if _client is None:
        import redis

        from .peers import FAIRNESS_DB, redis_url

        _client = redis.Redis.from_url(redis_url(FAIRNESS_DB))
    return _client


def nap(token: str, seconds: float) -> None:
    """Sleep `seconds`, then record when this task started and finished, and in which process."""
    started = time.time()
    time.sleep(seconds)
    finished = time.time()
    _runs_client().hset(RUNS_KEY, token, json.dumps([started, finished, os.getpid()]))


def workload(order: str = "interleaved") -> list[tuple[str, float]]:
    """Return the tokens and durations of the tasks enqueued before the worker starts, in order."""
    fast = [(f"fast-{i}", FAST_S) for i in range(FAST_PER_SLOW * ROUNDS)]
    slow = [(f"slow-{i}", SLOW_S) for i in range(ROUNDS)]
    if order == "fast-first":
        return fast + slow
    return [task for r in range(ROUNDS) for task in (*fast[r * FAST_PER_SLOW : (r + 1) * FAST_PER_SLOW], slow[r])]


def total_work_s() -> float:
    """Return the seconds of sleep in every task of a run, the priority task's included."""
    return sum(seconds for _, seconds in workload()) + URGENT_S


def runs(client) -> dict[str, tuple[float, float, int]]:
    """Return the recorded runs, by token."""
    return {token.decode(): tuple(json.loads(value)) for token, value in client.hgetall(RUNS_KEY).items()}


# -- the filler ---------------------------------------------------------------------------

#: Enqueues one nap: token, seconds, and whether it is the priority task.
Sender = Callable[[str, float, bool], None]


def sender(system: str) -> Sender:
    """Return a function that enqueues the nap task of `system`, the priority task by its closest mechanism."""
    if system == "threadmill":
        import django

        django.setup()
        from .tasks import nap as task

        urgent = task.using(priority=100)
        return lambda token, seconds, high: (urgent if high else task).enqueue(token, seconds)
    if system == "celery":
        from .peers.celery_app import nap as task

        # Redis lists per priority step; kombu pops step 0 first, so the rest wait at 9.
        return lambda token, seconds, high: task.apply_async((token, seconds), priority=0 if high else 9)
    if system == "dramatiq":
        from .peers.dramatiq_app import nap as task
        from .peers.dramatiq_app import urgent_nap

        return lambda token, seconds, high: (urgent_nap if high else task).send(token, seconds)
    raise ValueError(f"Unknown system {system!r}.")


def fill_and_send_urgent(system: str, order: str) -> dict[str, float]:
    """Enqueue the workload, wait for its first start, then enqueue the priority task on time."""
    send = sender(system)
    client = _runs_client()
    client.delete(RUNS_KEY)
    for token, seconds in workload(order):
        send(token, seconds, False)
    print("filled", flush=True)
    deadline = time.monotonic() + FIRST_START_TIMEOUT_S
    while not (seen := runs(client)):
        if time.monotonic() > deadline:
            raise TimeoutError(f"No task started within {FIRST_START_TIMEOUT_S:g} s of the filling.")
        time.sleep(POLL_S)
    first_start = min(started for started, _, _ in seen.values())
    time.sleep(max(0.0, first_start + URGENT_AFTER_S - time.time()))
    enqueued_at = time.time()
    send(URGENT_TOKEN, URGENT_S, True)
    return {"first_start": first_start, "urgent_enqueued_at": enqueued_at}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.benchmarks.naps", description=__doc__)
    parser.add_argument("system", choices=["threadmill", "celery", "dramatiq"])
    parser.add_argument("--order", choices=ORDERS, default=ORDERS[0])
    args = parser.parse_args()
    print(json.dumps(fill_and_send_urgent(args.system, args.order)), flush=True)


if __name__ == "__main__":
    main()
