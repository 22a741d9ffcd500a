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
