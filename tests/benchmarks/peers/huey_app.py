"""huey on its Redis storage at its defaults (a blocking BRPOP), with the latency probe task."""

import time

from huey import RedisHuey

from ..probe import record_start
from . import HUEY_DB, redis_url

huey = RedisHuey("bench", url=redis_url(HUEY_DB))


@huey.task()
def probe(token):
    started = time.time()
    record_start(token, started)


@huey.task()
def echo(value=None):
    return value
