"""The echo task for the Django task backends measured as peers (django-tasks-db, django-tasks-rq)."""

from django.tasks import task


@task
def echo(value=None):
    return value


def enqueue(depth: int) -> None:
    """Enqueue `depth` echo tasks on the default backend."""
    for i in range(depth):
        echo.enqueue(i)
