"""What every cancel shares: who cancels when no one is named, how often a moving task is read again, and the
failed document a cancelled task gets (TaskCancelled), built from what the cancel read.

Used by a task's cancel (`tooling/actions.py`) and a whole workflow's (`workflows.py`); both hand the
document to a script fenced by the segment it was read in (cancel.lua, cancel_workflow.lua).
"""

from __future__ import annotations

import getpass
import logging
import socket
from datetime import UTC, datetime

from ..base import UNREADABLE_PAYLOAD_ERRORS, Segment
from ..outcome import cancelled_error, mark_failed
from . import codec

logger = logging.getLogger("threadmill.backend")

#: Times a cancel reads a task again when it moved between the read and the script (promoted, requeued).
CANCEL_ROUNDS = 3


def default_canceller() -> str:
    """Name who cancels when no one is named: this process's user and host."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no passwd entry for this uid (a container)
        user = "an unnamed user"
    return f"{user} on {socket.gethostname()}"


def cancelled_document(task_id: str, data: bytes, segment: Segment, by: str, now: float) -> str | None:
    """Return a waiting, ready or deferred task's document finished as cancelled by `by`; None if unreadable."""
    try:
        result = codec.decode(data, segment)
    except UNREADABLE_PAYLOAD_ERRORS as e:
        logger.warning("Task %s cannot be cancelled: its payload is unreadable (%s).", task_id, e)
        return None
    at = datetime.fromtimestamp(now, UTC)
    message = f"Task {task_id} was cancelled by {by} at {at.isoformat()} before it ran."
    mark_failed(result, cancelled_error(message), at)
    return codec.encode_result(result)
