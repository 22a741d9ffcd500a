"""Where the workflow benchmark's joins record when they started, for every system alike.

The join's first statement takes `time.time()` and pushes it on a list in the benchmark's probe
database (`peers.PROBE_DB`), so the driver blocks on it instead of polling; the steps' own start
and end times travel as their stored return values, which every system stores anyway.
"""

from __future__ import annotations

#: List each join pushes its start time on (epoch seconds, repr of a float).
JOINS_KEY = "bench:workflows:joins"

_client = None


def _stamp_client():
    global _client
    if _client is None:
        import redis

        from .peers import PROBE_DB, redis_url

        _client = redis.Redis.from_url(redis_url(PROBE_DB))
    return _client


def record_join(started: float) -> None:
    """Record that a join started at `started` (epoch seconds) and wake the driver."""
    _stamp_client().rpush(JOINS_KEY, repr(started))
