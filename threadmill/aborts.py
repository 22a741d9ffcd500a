"""What a running task is told about itself: `aborting()`, True once an abort request reached it.

The worker's fetcher looks for abort requests (stored by `backend.cancel`) of the tasks its
process runs, and names the run on its consumer's executor; this reads that name, so a task
may call it in a tight loop at the cost of a few attribute reads.
"""

from __future__ import annotations

from .progress import running


def aborting() -> bool:
    """Return whether an abort request reached the running task: it should wrap up and return or raise.

    It ends FAILED with `TaskCancelled` either way, and `TaskCancelled` is raised in it once the
    worker's `abort_grace` has passed. False outside a task run by a Threadmill worker.
    """
    executor = getattr(running, "executor", None)
    if executor is None:
        return False
    current = executor.current
    return current is not None and executor.abort_token == current.lease_token
