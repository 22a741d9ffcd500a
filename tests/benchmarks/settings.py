"""Settings for threadmill in the latency benchmarks: the test settings with the backend at its defaults.

The test suite's settings shorten `poll_max_interval`; a benchmark of idle latency must
measure what a user gets out of the box, so this backend takes no OPTIONS at all, unless
THREADMILL_TEST_PARTITIONS asks for partitions (the idle start of a partitioned alias).
"""

import os

from tests.settings import *

TASKS = {
    "default": {
        "BACKEND": "threadmill.backends.redis.RedisTaskBackend",
        "REDIS_URL": REDIS_URL,
        "QUEUES": ["default"],
    }
}
if os.environ.get("THREADMILL_TEST_PARTITIONS"):
    TASKS["default"]["OPTIONS"] = {"partitions": int(os.environ["THREADMILL_TEST_PARTITIONS"])}
