"""Settings for threadmill in the latency benchmarks: the test settings with the backend at its defaults.

The test suite's settings shorten `poll_max_interval`; a benchmark of idle latency must
measure what a user gets out of the box, so this backend takes no OPTIONS at all.
"""

from tests.settings import *

TASKS = {
    "default": {
        "BACKEND": "threadmill.backends.redis.RedisTaskBackend",
        "REDIS_URL": REDIS_URL,
        "QUEUES": ["default"],
    }
}
