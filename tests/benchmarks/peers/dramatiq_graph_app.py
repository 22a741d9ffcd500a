"""dramatiq's group with a completion callback for the workflow benchmark: Results and GroupCallbacks middleware."""

import os
import time

import dramatiq
from dramatiq import group
from dramatiq.brokers.redis import RedisBroker
from dramatiq.middleware import GroupCallbacks
from dramatiq.rate_limits.backends import RedisBackend as RedisRateLimiterBackend
from dramatiq.results import Results
from dramatiq.results.backends import RedisBackend

from ..graph_stamps import record_join
from . import DRAMATIQ_BROKER_DB, DRAMATIQ_RESULTS_DB

_base = os.environ["BENCH_REDIS_URL"].rsplit("/", 1)[0]
broker = RedisBroker(url=f"{_base}/{DRAMATIQ_BROKER_DB}")
broker.add_middleware(Results(backend=RedisBackend(url=f"{_base}/{DRAMATIQ_RESULTS_DB}", namespace="bench-results")))
# The group's completion barrier lives beside the broker's keys (flushed between runs like them).
broker.add_middleware(GroupCallbacks(RedisRateLimiterBackend(url=f"{_base}/{DRAMATIQ_BROKER_DB}")))
dramatiq.set_broker(broker)


@dramatiq.actor(queue_name="default", store_results=True, max_retries=0)
def span(index):
    return [time.time(), time.time()]


@dramatiq.actor(queue_name="default", max_retries=0)
def join():
    record_join(time.time())


def enqueue_fan_in(width: int) -> None:
    """Send a group of `width` steps with the join as its completion callback."""
    steps = group(span.message(i) for i in range(width))
    steps.add_completion_callback(join.message())
    steps.run()
