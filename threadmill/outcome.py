"""Pure state decisions about a leased task: how it finishes and whether it runs again.

Each function takes `now` (and randomness, through the retry policy) as arguments and
mutates only the task result it is given, in place, as Django's own backends do.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from traceback import format_exception
from typing import TYPE_CHECKING

from django.tasks import TaskContext, TaskResult, TaskResultStatus
from django.tasks.base import TaskError

from .exceptions import AcknowledgementTimeout, AttemptAbandoned, TaskCancelled, TaskTimeout, WorkerLost
from .retry import next_retry_delay

if TYPE_CHECKING:
    from .base import ThreadmillTaskResult

#: Times in a row a task may lose its worker before the broker fails it instead: a task that
#: keeps taking its worker down (a segfault, the OOM killer) must not do so forever.
WORKER_LOSS_LIMIT = 3


def class_path(cls: type) -> str:
    """Return the dotted path of a class."""
    return f"{cls.__module__}.{cls.__qualname__}"


def error_of(exception: BaseException) -> TaskError:
    """Return the TaskError recording `exception` and its traceback."""
    return TaskError(exception_class_path=class_path(type(exception)), traceback="".join(format_exception(exception)))


def mark_successful(result: TaskResult, now: datetime) -> None:
    """Record that the task returned."""
    object.__setattr__(result, "status", TaskResultStatus.SUCCESSFUL)
    object.__setattr__(result, "finished_at", now)


def mark_failed(result: TaskResult, error: TaskError, now: datetime) -> None:
    """Record that the task failed with `error`."""
    result.errors.append(error)
    object.__setattr__(result, "status", TaskResultStatus.FAILED)
    object.__setattr__(result, "finished_at", now)


def retry_delay(result: TaskResult) -> timedelta | None:
    """Return how long a failed task waits before running again, or None for no retry."""
    return next_retry_delay(getattr(result.task, "retry", None), TaskContext(task_result=result))


def lease_expired_error(message: str) -> TaskError:
    """Return the TaskError the reaper records for a lease that expired."""
    path = class_path(AcknowledgementTimeout)
    return TaskError(exception_class_path=path, traceback=f"{path}: {message}\n")


def abandoned_error(message: str) -> TaskError:
    """Return the TaskError recorded for an attempt that was given up (its worker died, stopped, or it was requeued)."""
    path = class_path(AttemptAbandoned)
    return TaskError(exception_class_path=path, traceback=f"{path}: {message}\n")


def cancelled_error(message: str) -> TaskError:
    """Return the TaskError recorded for a task cancelled before it ran, or aborted: `message` says by whom and when."""
    path = class_path(TaskCancelled)
    return TaskError(exception_class_path=path, traceback=f"{path}: {message}\n")


def record_abandoned(result: TaskResult, message: str) -> None:
    """Record on a running task's result (its lease applied) that this attempt was abandoned and why."""
    result.errors.append(abandoned_error(message))


def worker_lost_error(message: str) -> TaskError:
    """Return the TaskError recorded for an attempt whose worker died while it ran."""
    path = class_path(WorkerLost)
    return TaskError(exception_class_path=path, traceback=f"{path}: {message}\n")


def keeps_losing_its_worker(
    result: TaskResult, latest: TaskError, losses: int | None = None, limit: int = WORKER_LOSS_LIMIT
) -> bool:
    """Return whether the task lost its worker `limit` times in a row, this loss (`latest`) included.

    `losses` is the server's count of lost leases in a row in which the task may have run, this
    one included; it decides when the lost lease recorded the run. Without it (the task was no
    suspect, or its worker is of an older release), `latest` and the attempts before it must
    all be WorkerLost.
    """
    if losses is not None:
        return losses >= limit
    path = class_path(WorkerLost)
    recent = [*result.errors[-(limit - 1) :], latest] if limit > 1 else [latest]
    return len(recent) == limit and all(error.exception_class_path == path for error in recent)


def ended_by(result: TaskResult) -> type[BaseException] | None:
    """Return TaskTimeout or TaskCancelled when a time limit or an abort ended the failed run of `result`, else None."""
    if result.status != TaskResultStatus.FAILED or not result.errors:
        return None
    path = result.errors[-1].exception_class_path
    return next((cls for cls in (TaskTimeout, TaskCancelled) if class_path(cls) == path), None)


def runs_alone(result: ThreadmillTaskResult) -> bool:
    """Return whether a leased task must run alone in its process: one more lost worker would fail it.

    Then that loss is its own: nothing else runs beside it for the blame to fall on.
    """
    return result.worker_losses is not None and result.worker_losses >= WORKER_LOSS_LIMIT - 1
