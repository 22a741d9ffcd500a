"""Enqueue echo tasks for one queue under test: `python -m tests.benchmarks.enqueue SYSTEM DEPTH`.

Runs in its own process so each system gets its own settings module and broker client,
exactly as the worker it is drained by will see them.
"""

from __future__ import annotations

import sys


def enqueue(system: str, depth: int) -> None:
    if system in ("threadmill", "django-tasks-db", "django-tasks-rq"):
        import django

        django.setup()
    if system == "threadmill":
        from tests.tasks import echo

        for i in range(depth):
            echo.enqueue(i)
    elif system == "dramatiq":
        from .peers import dramatiq_app

        dramatiq_app.enqueue(depth)
    elif system == "celery":
        from .peers import celery_app

        celery_app.enqueue(depth)
    else:
        from .peers import echo_tasks

        echo_tasks.enqueue(depth)


if __name__ == "__main__":
    enqueue(sys.argv[1], int(sys.argv[2]))
