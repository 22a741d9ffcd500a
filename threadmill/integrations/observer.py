"""What an integration that watches task runs is (`AttemptObserver`), and how an attempt ended in its words."""

from __future__ import annotations

from typing import Any, Protocol

from ..base import ThreadmillTaskResult


class AttemptObserver(Protocol):
    """Watches each attempt of a task on a worker; both calls come from the consumer thread running it."""

    def started(self, result: ThreadmillTaskResult) -> Any:
        """Begin watching the attempt of `result` that starts now; return what `ended` needs."""

    def ended(self, handle: Any, result: ThreadmillTaskResult, error: BaseException | None, retrying: bool) -> None:
        """Finish watching: `result` carries its status, `error` what the task raised, `retrying` whether it runs again."""


def outcome_of(result: ThreadmillTaskResult, retrying: bool) -> str:
    """Return how an attempt ended, in the words of the per-task metrics: successful, retried or failed."""
    if retrying:
        return "retried"
    return "successful" if result.status == "SUCCESSFUL" else "failed"
