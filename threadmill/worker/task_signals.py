"""Django's `task_started` and `task_finished`, sent unless the send could only drop a log line.

Django connects one receiver to each: it logs the task's start, or its finish, on the
`django.tasks` logger at INFO (ERROR for a failure), a level the worker turns off below
verbosity 2 (`logs.configure`). While that receiver is the signal's only one and its logger
drops the level, sending would look the receivers up and call it for nothing; at thousands of
echo tasks a second the two sends were a tenth of the worker's CPU (py-spy, 1 December 2026).
Any other receiver, connected at any time, or the level turned on, and the signal is sent as
before: the check reads the signal's receivers at every task.
"""

from __future__ import annotations

import weakref
from typing import Any

from django.dispatch import Signal
from django.tasks import signals as django_task_signals

from ..base import ThreadmillTaskResult

#: The logger Django's own task receivers write to.
_DJANGO_TASKS_LOGGER = django_task_signals.logger


class TaskSignal:
    """One of Django's task signals, and the receiver Django connects to it to log each task."""

    def __init__(self, signal: Signal, log_receiver: Any) -> None:
        self.signal = signal
        self.log_receiver = log_receiver
        #: The receiver entry last seen alone on the signal, and whether it is `log_receiver`.
        self._seen: Any = None
        self._seen_is_log = False

    def send(self, sender: type, result: ThreadmillTaskResult, level: int) -> None:
        """Send the signal about `result`, unless only the log receiver would get it and `level` is off."""
        if not _DJANGO_TASKS_LOGGER.isEnabledFor(level) and self._only_the_log_receiver():
            return
        self.signal.send(sender, task_result=result)

    def _only_the_log_receiver(self) -> bool:
        receivers = self.signal.receivers
        if len(receivers) != 1:
            return False
        head = receivers[:1]  # a copy: a disconnect between the two reads leaves it empty, not an IndexError
        if not head:
            return False
        entry = head[0]
        if entry is not self._seen:
            receiver = entry[1]
            if isinstance(receiver, weakref.ReferenceType):
                receiver = receiver()
            self._seen, self._seen_is_log = entry, receiver is self.log_receiver and not entry[3]
        return self._seen_is_log


started = TaskSignal(django_task_signals.task_started, django_task_signals.log_task_started)
finished = TaskSignal(django_task_signals.task_finished, django_task_signals.log_task_finished)
