"""Task functions the tests enqueue; module-level as django.tasks requires."""

from django.tasks import task

from threadmill.retry import ExponentialBackoff


@task
def echo(value=None):
    return value


@task
def add(a, b):
    return a + b


@task(queue_name="emails")
def send_email(address):
    return f"sent to {address}"


@task(priority=10)
def urgent(value=None):
    return value


@task
def explode(message="boom"):
    raise RuntimeError(message)


@task(retry=ExponentialBackoff(base_delay=0.05, max_delay=0.2, max_retries=2, jitter=0))
def flaky(message="boom"):
    raise ValueError(message)


def never_retry(context):
    return None


@task(retry=never_retry)
def with_callback_policy():
    return "ok"


@task(takes_context=True)
def attempt_number(context):
    return context.attempt


@task
async def async_echo(value=None):
    return value


# -- worker tests ---------------------------------------------------------------------

_runs_client = None


def _runs():
    global _runs_client
    if _runs_client is None:
        import os

        import redis

        _runs_client = redis.Redis.from_url(os.environ["THREADMILL_TEST_REDIS_URL"])
    return _runs_client


@task
def sleep_for(seconds=0.0):
    import time

    time.sleep(seconds)
    return seconds


@task(
    retry=ExponentialBackoff(
        base_delay=0.05, max_retries=3, expected_exceptions=("threadmill.exceptions.AcknowledgementTimeout",), jitter=0
    )
)
def counted(key, seconds=0.0):
    """Count each run of `key` in the test server's `test:runs` hash, then sleep."""
    import time

    _runs().hincrby("test:runs", key, 1)
    time.sleep(seconds)
    return key


@task
async def event_loop_id():
    import asyncio

    await asyncio.sleep(0)
    return id(asyncio.get_running_loop())


@task(takes_context=True)
async def async_attempt(context, value=None):
    return [context.attempt, value]


@task
def stop_consumer():
    raise SystemExit(3)


@task
def stamp(key):
    """Record when the task started (epoch seconds) in the test server's `test:stamps` hash."""
    import time

    started = time.time()
    _runs().hset("test:stamps", key, repr(started))
    return key
