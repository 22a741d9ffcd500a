"""The soak's tasks: each start and each finished run is recorded on the counter server.

Every task takes a `key` the producer chose, unique per enqueue call, so a task whose
enqueue call failed can still be found (and its runs told apart) by that key. A finished
run, returned or raised, is one JSON line on the counter's `soak:runs` list: the key, the
attempt, the worker process (pid and pool incarnation, from `SOAK_POOL`), when it started
and when it finished, and whether it returned. A run that never finished (its process was
killed) left only its start, in `soak:started`.
"""

from __future__ import annotations

import json
import os
import threading
import time

from django.tasks import task

from tests.tasks import _counter
from threadmill.retry import ExponentialBackoff

#: The exceptions a fault makes a task's attempt end with; every soak task retries them.
FAULT_EXCEPTIONS = ("threadmill.exceptions.AcknowledgementTimeout", "threadmill.exceptions.AttemptAbandoned")


class SoakFailure(Exception):
    """Raised by a soak task that is meant to fail this attempt."""


#: The class path a task's own failure is recorded under.
SOAK_FAILURE = f"{SoakFailure.__module__}.{SoakFailure.__qualname__}"


def _run(context, key: str, sleep_ms: int, fail: bool) -> str:
    counter = _counter()
    started = time.time()
    counter.hincrby("soak:started", key, 1)
    threading.Event().wait(sleep_ms / 1000)
    record = {
        "key": key,
        "id": context.task_result.id,
        "attempt": context.attempt,
        "pid": os.getpid(),
        "pool": os.environ.get("SOAK_POOL", ""),
        "started": started,
        "finished": time.time(),
        "ok": not fail,
    }
    counter.rpush("soak:runs", json.dumps(record))
    if fail:
        raise SoakFailure(f"Task {key} fails attempt {context.attempt} on purpose.")
    return key


@task(
    takes_context=True,
    retry=ExponentialBackoff(base_delay=0.05, max_delay=0.5, max_retries=10, expected_exceptions=FAULT_EXCEPTIONS),
)
def steady(context, key: str, sleep_ms: int = 0) -> str:
    """Sleep `sleep_ms` and succeed; only a fault's lost attempt is retried."""
    return _run(context, key, sleep_ms, fail=False)


@task(
    takes_context=True,
    retry=ExponentialBackoff(base_delay=0.05, max_delay=0.5, max_retries=10, expected_exceptions=FAULT_EXCEPTIONS),
    concurrency=4,
    rate="40/s",
)
def limited(context, key: str, sleep_ms: int = 0) -> str:
    """`steady` under per-task limits: at most 4 at once and 40 a second across both pools."""
    return _run(context, key, sleep_ms, fail=False)


@task(
    takes_context=True,
    retry=ExponentialBackoff(
        base_delay=0.1, max_delay=1.0, max_retries=10, expected_exceptions=(SOAK_FAILURE, *FAULT_EXCEPTIONS)
    ),
)
def flaky(context, key: str, sleep_ms: int = 0, failing_attempts: int = 1) -> str:
    """Fail the first `failing_attempts` attempts, then succeed: the retry policy must carry it through."""
    return _run(context, key, sleep_ms, fail=context.attempt <= failing_attempts)


#: Retries of an always-failing task; it then ends FAILED (until an operator requeues it).
DOOMED_RETRIES = 2


@task(
    takes_context=True,
    retry=ExponentialBackoff(
        base_delay=0.1, max_delay=0.5, max_retries=DOOMED_RETRIES, expected_exceptions=(SOAK_FAILURE,)
    ),
)
def doomed(context, key: str, sleep_ms: int = 0) -> str:
    """Fail every attempt: it must end FAILED, never SUCCESSFUL."""
    return _run(context, key, sleep_ms, fail=True)
