"""Latency probe: enqueue single tasks one at a time and time when each one started.

Every probe task calls `record_start` with the `time.time()` it took as its first
statement; the driver, run by tests/benchmarks/latency.py in its own process per queue
(`python -m tests.benchmarks.probe SYSTEM idle|deferred SAMPLES SEED`), takes `time.time()`
just before the enqueue call and prints each task's delay as JSON. Both clocks are this
machine's. The probe's own commands go to their own database (`peers.PROBE_DB`).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from collections.abc import Callable
from datetime import UTC, datetime

#: Hash of probe token -> epoch seconds at which its task started.
STARTS_KEY = "bench:probe:started"
#: List the probe tasks push their token on, so the driver blocks instead of polling.
DONE_KEY = "bench:probe:done"
#: Tasks sent and awaited before measuring: a worker's start-up and first task are not idle latency.
WARM_UP_TASKS = 2
#: Seconds a worker may take to start and run its first task.
WARM_UP_TIMEOUT_S = 120.0
#: Seconds a measured task may take to start after it is due.
TIMEOUT_S = 30.0
#: Idle gap before each single task in the idle probe, seconds.
IDLE_GAP_S = (0.3, 2.0)
#: How far ahead of its enqueue a deferred task is due, seconds.
DEFERRED_LEAD_S = (1.0, 3.0)

_client = None


def _probe_client():
    global _client
    if _client is None:
        import redis

        from .peers import PROBE_DB, redis_url

        _client = redis.Redis.from_url(redis_url(PROBE_DB))
    return _client


def record_start(token: str, started: float) -> None:
    """Record that the probe task `token` started at `started` (epoch seconds) and wake the driver."""
    pipe = _probe_client().pipeline(transaction=False)
    pipe.hset(STARTS_KEY, token, repr(started)).rpush(DONE_KEY, token).execute()


# -- the driver ---------------------------------------------------------------------------

Sender = Callable[[str, datetime | None], None]


def sender(system: str) -> Sender:
    """Return a function that enqueues the probe task of `system`, due now or at a time."""
    if system == "threadmill":
        import django

        django.setup()
        from .tasks import probe

        return lambda token, due: (probe.using(run_after=due) if due else probe).enqueue(token)
    if system == "celery":
        from .peers.celery_app import probe

        return lambda token, due: probe.apply_async((token,), eta=due)
    if system == "dramatiq":
        from .peers.dramatiq_app import probe

        def send(token: str, due: datetime | None) -> None:
            if due is None:
                probe.send(token)
            else:
                probe.send_with_options(args=(token,), delay=max(0, round((due.timestamp() - time.time()) * 1000)))

        return send
    if system == "huey":
        from .peers.huey_app import probe

        return lambda token, due: probe(token) if due is None else probe.schedule(args=(token,), eta=due)
    if system == "rq":
        from .peers.rq_app import probe, queue

        rq_queue = queue()
        return lambda token, due: (
            rq_queue.enqueue(probe, token) if due is None else rq_queue.enqueue_at(due, probe, token)
        )
    raise ValueError(f"Unknown system {system!r}.")


def wait_for(token: str, timeout: float) -> float:
    """Block until the task `token` has started and return when it did (epoch seconds)."""
    client = _probe_client()
    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        popped = client.blpop([DONE_KEY], timeout=max(left, 0.01))
        if popped and popped[1].decode() == token:
            return float(client.hget(STARTS_KEY, token))
    raise TimeoutError(f"The probe task {token} did not start within {timeout:.0f} s.")


def drive(system: str, mode: str, samples: int, seed: int) -> dict:
    """Send `samples` probe tasks one at a time and return how late each one started."""
    send = sender(system)
    _probe_client().delete(STARTS_KEY, DONE_KEY)
    for index in range(WARM_UP_TASKS):
        send(f"warm-up-{index}", None)
        wait_for(f"warm-up-{index}", WARM_UP_TIMEOUT_S)
    rng = random.Random(seed)
    measured = []
    for index in range(samples):
        gap = rng.uniform(*IDLE_GAP_S) if mode == "idle" else 0.0
        lead = rng.uniform(*DEFERRED_LEAD_S) if mode == "deferred" else 0.0
        time.sleep(gap)
        token = f"{mode}-{index}"
        before = time.time()
        send(token, datetime.fromtimestamp(before + lead, UTC) if lead else None)
        sent = time.time()
        started = wait_for(token, lead + TIMEOUT_S)
        measured.append(
            {"gap_s": round(gap, 4), "lead_s": round(lead, 4), "enqueue_ms": round((sent - before) * 1e3, 4),
             "late_ms": round((started - before - lead) * 1e3, 4)}
        )  # fmt: skip
    return {"system": system, "mode": mode, "seed": seed, "samples": measured}


def percentile(values: list[float], fraction: float) -> float:
    """Return the `fraction` quantile of `values` (linear interpolation, as numpy's default)."""
    ordered = sorted(values)
    position = (len(ordered) - 1) * fraction
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def summary(values: list[float]) -> dict[str, float]:
    """Return p50, p90, max and mean of delays in milliseconds."""
    return {
        "p50_ms": round(percentile(values, 0.5), 3),
        "p90_ms": round(percentile(values, 0.9), 3),
        "max_ms": round(max(values), 3),
        "mean_ms": round(statistics.fmean(values), 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.benchmarks.probe", description=__doc__)
    parser.add_argument("system", choices=["threadmill", "celery", "dramatiq", "huey", "rq"])
    parser.add_argument("mode", choices=["idle", "deferred"])
    parser.add_argument("samples", type=int)
    parser.add_argument("seed", type=int)
    args = parser.parse_args()
    print(json.dumps(drive(args.system, args.mode, args.samples, args.seed)))


if __name__ == "__main__":
    main()
