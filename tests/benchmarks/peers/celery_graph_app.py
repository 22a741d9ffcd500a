"""celery's chord for the workflow benchmark: a group of steps, then a callback, Redis broker and Redis results."""

import os
import time

from celery import Celery, chord

from ..graph_stamps import record_join
from . import CELERY_BROKER_DB, CELERY_RESULTS_DB

_base = os.environ["BENCH_REDIS_URL"].rsplit("/", 1)[0]
app = Celery("bench-graph", broker=f"{_base}/{CELERY_BROKER_DB}", backend=f"{_base}/{CELERY_RESULTS_DB}")
app.conf.update(
    task_default_queue="default",
    task_acks_late=False,
    result_extended=False,
    worker_hijack_root_logger=False,
    broker_connection_retry_on_startup=True,
)


@app.task(name="span")
def span(index):
    return [time.time(), time.time()]


@app.task(name="join")
def join(results):
    record_join(time.time())


def enqueue_fan_in(width: int) -> None:
    """Send a chord of `width` steps whose callback is the join."""
    chord(span.s(i) for i in range(width))(join.s())
