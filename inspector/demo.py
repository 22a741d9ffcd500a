"""The demo workload `manage.py threadmill run` enqueues, so a newcomer sees every segment filled."""

from __future__ import annotations

import random
import time
from datetime import UTC, datetime, timedelta

from django.tasks import task

from threadmill.retry import ExponentialBackoff

#: Seconds the long-running demo task works for: long enough to show a lease being held.
LONG_RUNNING_S = 600


@task
def resize_image(image_id: int, width: int = 640) -> dict:
    """A fast task."""
    return {"image_id": image_id, "width": width, "bytes": random.randint(10_000, 90_000)}


@task(queue_name="emails")
def send_welcome_email(address: str) -> str:
    """A fast task on another queue."""
    return f"sent to {address}"


# Django's `task` passes other keywords on to the backend's task class; django-stubs' overloads have none.
@task(retry=ExponentialBackoff(base_delay=3, max_delay=30, max_retries=2, jitter=0))  # type: ignore[call-overload]
def sync_inventory(store: str) -> None:
    """A task that always fails, retried twice with backoff, then failed for good."""
    raise ConnectionError(f"The inventory service of {store} did not answer.")


@task(queue_name="reports")
def build_report(name: str, seconds: float = LONG_RUNNING_S) -> str:
    """A long-running task: holds its lease while it works."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
    return f"report {name} built"


def _vanished() -> None:
    """Stands for a task function removed in a later release of the code."""


# Enqueued under a name no module defines, so a worker cannot import it: the payload becomes
# unreadable and lands in the unreadable segment, as after a careless deploy.
_vanished.__name__ = _vanished.__qualname__ = "removed_in_a_later_release"
removed_task = task(_vanished)


def enqueue_demo_workload() -> dict[str, int]:
    """Enqueue the demo tasks; return how many of each kind."""
    for i in range(40):
        resize_image.enqueue(i, width=random.choice([320, 640, 1280]))
    for name in ("ada", "grace", "linus", "barbara", "<script>alert('not run')</script>"):
        send_welcome_email.enqueue(f"{name}@example.com")
    for store in ("north", "south", "east"):
        sync_inventory.enqueue(store)
    later = datetime.now(UTC) + timedelta(minutes=10)
    for month in ("2026-10", "2026-11"):
        build_report.using(run_after=later).enqueue(f"monthly {month}", seconds=5)
    build_report.enqueue("yearly 2026")
    removed_task.enqueue()
    return {"fast": 45, "failing": 3, "deferred": 2, "long_running": 1, "unreadable": 1}
