"""dramatiq on its Redis broker with the Results middleware storing every return value, the latency probe and the nap.

dramatiq's only priority is an actor's: among the tasks a worker process already holds, the
lowest number runs first. The priority nap is therefore an actor of its own.
"""

import os
import time

import dramatiq
from dramatiq.brokers.redis import RedisBroker
from dramatiq.results import Results
from dramatiq.results.backends import RedisBackend

from .. import naps
from ..probe import record_start
from . import DRAMATIQ_BROKER_DB, DRAMATIQ_RESULTS_DB

_base = os.environ["BENCH_REDIS_URL"].rsplit("/", 1)[0]
broker = RedisBroker(url=f"{_base}/{DRAMATIQ_BROKER_DB}")
broker.add_middleware(Results(backend=RedisBackend(url=f"{_base}/{DRAMATIQ_RESULTS_DB}", namespace="bench-results")))
dramatiq.set_broker(broker)


@dramatiq.actor(queue_name="default", store_results=True, max_retries=0)
def echo(value=None):
    return value


def enqueue(depth: int) -> None:
    """Send `depth` echo tasks."""
    for i in range(depth):
        echo.send(i)


@dramatiq.actor(queue_name="default", max_retries=0)
def probe(token):
    started = time.time()
    record_start(token, started)


@dramatiq.actor(queue_name="default", max_retries=0, priority=10)
def nap(token, seconds):
    naps.nap(token, seconds)


@dramatiq.actor(queue_name="default", max_retries=0, priority=0)
def urgent_nap(token, seconds):
    naps.nap(token, seconds)
