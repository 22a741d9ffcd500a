"""Peer task queues the benchmarks measure beside Threadmill, each with an echo task and a probe task.

Connection settings come from the environment (`BENCH_REDIS_URL`, `BENCH_SQLITE_PATH`),
which the harness sets for the enqueue, probe and worker processes it starts.
"""

#: Redis database numbers on the benchmark's Valkey; threadmill keeps database 0.
DRAMATIQ_BROKER_DB = 1
#: dramatiq's stored results, alone in their database so DBSIZE counts finished tasks.
DRAMATIQ_RESULTS_DB = 2
CELERY_BROKER_DB = 3
#: celery's stored results, alone in their database so DBSIZE counts finished tasks.
CELERY_RESULTS_DB = 4
#: rq's queue, jobs and finished registry (django-tasks-rq).
RQ_DB = 5
#: huey's queue, schedule and results.
HUEY_DB = 6
#: rq's own worker (`rq worker`), as the latency benchmarks run it without Django.
RQ_WORKER_DB = 7
#: Where the probe tasks record when they started (tests/benchmarks/probe.py).
PROBE_DB = 8
#: Where the fairness benchmark's tasks record when they ran (tests/benchmarks/naps.py).
FAIRNESS_DB = 9


def redis_url(db: int) -> str:
    """Return the benchmark's Valkey URL on database `db`."""
    import os

    return f"{os.environ['BENCH_REDIS_URL'].rsplit('/', 1)[0]}/{db}"
