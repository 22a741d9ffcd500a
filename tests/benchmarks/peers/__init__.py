"""Peer task queues the drain benchmark measures beside Threadmill, each with an echo task.

Connection settings come from the environment (`BENCH_REDIS_URL`, `BENCH_SQLITE_PATH`),
which the drain harness sets for the enqueue and worker processes it starts.
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
