"""rq at its defaults (`rq worker`, a forked work horse per task), with the latency probe task."""

import time

from redis import Redis
from rq import Queue

from ..probe import record_start
from . import RQ_WORKER_DB, redis_url


def queue() -> Queue:
    """Return the `default` queue on the benchmark's Valkey."""
    return Queue("default", connection=Redis.from_url(redis_url(RQ_WORKER_DB)))


def probe(token):
    started = time.time()
    record_start(token, started)


def echo(value=None):
    return value
