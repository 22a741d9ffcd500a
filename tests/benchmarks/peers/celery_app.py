"""celery on a Redis broker with the Redis result backend storing every return value, the latency probe and the nap."""

import os
import time

from celery import Celery

from .. import naps
from ..probe import record_start
from . import CELERY_BROKER_DB, CELERY_RESULTS_DB

_base = os.environ["BENCH_REDIS_URL"].rsplit("/", 1)[0]
app = Celery("bench", broker=f"{_base}/{CELERY_BROKER_DB}", backend=f"{_base}/{CELERY_RESULTS_DB}")
app.conf.update(
    task_default_queue="default",
    task_acks_late=False,
    result_extended=False,
    worker_hijack_root_logger=False,
    broker_connection_retry_on_startup=True,
)


@app.task(name="echo")
def echo(value=None):
    return value


def enqueue(depth: int) -> None:
    """Send `depth` echo tasks."""
    for i in range(depth):
        echo.delay(i)


@app.task(name="probe", ignore_result=True)
def probe(token):
    started = time.time()
    record_start(token, started)


@app.task(name="nap", ignore_result=True)
def nap(token, seconds):
    naps.nap(token, seconds)
