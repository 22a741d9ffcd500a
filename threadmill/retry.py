"""Retry policies: decide whether a failed task runs again, and after what delay.

A policy is any callable `(TaskContext) -> timedelta | None`. `ExponentialBackoff` is
the built-in one; it is serialisable, so the payload records it and the reaper applies
the same policy to a task whose lease expired.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from django.tasks import TaskContext
from django.utils.module_loading import import_string

logger = logging.getLogger(__name__)

RetryPolicy = Callable[[TaskContext], "timedelta | None"]


def _seconds(value: timedelta | float) -> float:
    return value.total_seconds() if isinstance(value, timedelta) else float(value)


def _class_path(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def backoff_delay(attempt: int, *, base_s: float, factor: float, max_s: float, jitter: float, rand: float) -> float:
    """Return the delay in seconds before retry number `attempt` (1-based), jittered by `rand` in [0, 1)."""
    delay = min(max_s, base_s * factor ** (attempt - 1))
    return delay * (1 - jitter + 2 * jitter * rand)


@dataclass(frozen=True, slots=True)
class ExponentialBackoff:
    """Retry an expected exception up to `max_retries` times, waiting longer each time.

    The n-th retry waits `base_delay * factor ** (n - 1)`, capped at `max_delay` and
    spread by +/- `jitter` (a fraction) so retries of a burst do not land together.
    """

    base_delay: timedelta | float = 1.0
    max_delay: timedelta | float = 3600.0
    factor: float = 2.0
    max_retries: int = 3
    expected_exceptions: tuple[type[BaseException] | str, ...] = (Exception,)
    jitter: float = 0.1
    _expected_paths: tuple[str, ...] = field(init=False, repr=False, compare=False, default=())

    def __post_init__(self) -> None:
        paths = tuple(e if isinstance(e, str) else _class_path(e) for e in self.expected_exceptions)
        object.__setattr__(self, "_expected_paths", paths)
        if self.max_retries < 0 or self.factor < 1 or not 0 <= self.jitter < 1:
            raise ValueError("ExponentialBackoff needs max_retries >= 0, factor >= 1 and 0 <= jitter < 1.")

    def __call__(self, context: TaskContext, rand: float | None = None) -> timedelta | None:
        result = context.task_result
        if context.attempt > self.max_retries or not result.errors:
            return None
        if not self._is_expected(result.errors[-1].exception_class_path):
            return None
        seconds = backoff_delay(
            context.attempt,
            base_s=_seconds(self.base_delay),
            factor=self.factor,
            max_s=_seconds(self.max_delay),
            jitter=self.jitter,
            rand=random.random() if rand is None else rand,
        )
        return timedelta(seconds=seconds)

    def _is_expected(self, exception_path: str) -> bool:
        try:
            raised = import_string(exception_path)
        except ImportError:
            return exception_path in self._expected_paths
        expected = tuple(import_string(path) for path in self._expected_paths)
        return isinstance(raised, type) and issubclass(raised, expected)

    def to_spec(self) -> dict[str, Any]:
        """Return the JSON form the payload stores."""
        return {
            "class": _class_path(type(self)),
            "base_delay": _seconds(self.base_delay),
            "max_delay": _seconds(self.max_delay),
            "factor": self.factor,
            "max_retries": self.max_retries,
            "expected_exceptions": list(self._expected_paths),
            "jitter": self.jitter,
        }


def retry_spec(policy: RetryPolicy | None) -> str | dict[str, Any] | None:
    """Return the JSON form of `policy`: a spec dict for a policy object, a dotted path for a function."""
    if policy is None:
        return None
    if hasattr(policy, "to_spec"):
        return policy.to_spec()
    return f"{policy.__module__}.{policy.__qualname__}"


def policy_from_spec(spec: str | dict[str, Any] | None) -> RetryPolicy | None:
    """Rebuild a policy from its JSON form; ImportError when its code is gone."""
    if spec is None:
        return None
    if isinstance(spec, str):
        return import_string(spec)
    params = dict(spec)
    cls = import_string(params.pop("class"))
    params["expected_exceptions"] = tuple(params["expected_exceptions"])
    for path in params["expected_exceptions"]:
        import_string(path)
    return cls(**params)


def next_retry_delay(policy: RetryPolicy | None, context: TaskContext) -> timedelta | None:
    """Ask `policy` for the delay before the next attempt; a policy that raises means no retry."""
    if policy is None:
        return None
    try:
        delay = policy(context)
    except Exception:
        logger.exception("Retry policy of task %s raised; the task will not be retried.", context.task_result.id)
        return None
    if delay is not None and not isinstance(delay, timedelta):
        logger.error("Retry policy of task %s returned %r, not a timedelta; no retry.", context.task_result.id, delay)
        return None
    return delay
