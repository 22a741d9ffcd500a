"""The tasks the testing how-to's examples test (docs/how-to/testing.md)."""

from django.tasks import task

from threadmill.retry import ExponentialBackoff


@task(queue_name="emails")
def send_welcome(address):
    return f"welcome sent to {address}"


@task(retry=ExponentialBackoff(base_delay=0.05, max_retries=2, jitter=0))
def charge_card(amount):
    if amount <= 0:
        raise ValueError(f"cannot charge {amount}")
    return amount


def sign_up(address):
    """The code under test: it enqueues and returns at once."""
    return send_welcome.enqueue(address)
