"""Enqueue cost of `wait_replicas`: tasks/s from one thread on a Valkey Cluster with one replica per primary.

Run: `python -m tests.benchmarks.replicas [--tasks N] [--repeats R]`. One cluster (three
primaries, three replicas, no persistence) serves every measurement; each enqueues the `echo`
task through `RedisTaskBackend` with `CLUSTER` on, and the median of the repeats is printed.
"""

from __future__ import annotations

import statistics
import time

from tests.cluster import ValkeyCluster

from .backend import setup_django
from .report import enqueue_cost_args

#: wait_replicas values measured, in the order printed.
CASES = [0, 1]


def enqueue_rate(url: str, wait_replicas: int, tasks: int) -> float:
    """Return tasks enqueued per second on the cluster at `url` with this `wait_replicas`."""
    from tests.tasks import echo
    from threadmill.backends.redis import RedisTaskBackend

    backend = RedisTaskBackend(
        "default", {"REDIS_URL": url, "CLUSTER": True, "OPTIONS": {"wait_replicas": wait_replicas}}
    )
    backend.enqueue(echo, ["warm-up"], {})
    start = time.perf_counter()
    for i in range(tasks):
        backend.enqueue(echo, [i], {})
    return tasks / (time.perf_counter() - start)


def run(tasks: int, repeats: int) -> None:
    cluster = ValkeyCluster(replicas_per_primary=1).start()
    try:
        print(f"enqueue from one thread on a replicated cluster, {tasks} tasks, median of {repeats}")
        print("| wait_replicas | tasks/s |")
        print("|---|---|")
        for wait_replicas in CASES:
            rates = []
            for _ in range(repeats):
                rates.append(enqueue_rate(cluster.url, wait_replicas, tasks))
                cluster.flush()
            print(f"| {wait_replicas} | {statistics.median(rates):,.0f} |")
    finally:
        cluster.stop()


def main() -> None:
    args = enqueue_cost_args("python -m tests.benchmarks.replicas", __doc__)
    setup_django("redis://127.0.0.1:1/0")
    run(args.tasks, args.repeats)


if __name__ == "__main__":
    main()
