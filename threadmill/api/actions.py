"""Console actions on tasks: count what an action would touch, then requeue, delete, purge or cancel it.

Each action that touches several tasks is one Lua script (or one script per bounded window),
so a crash cannot lose a task between two writes. Requeueing from the running segment is
guarded: without `force`, a task whose lease is current and whose worker is not known dead
is skipped, inside the backend's script, because requeueing it would run it twice at once.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..backends.tooling.actions import CancelOutcome
from ..base import Segment, UnreadableTask
from .queues import NO_FILTER, Filter, get_backend, page, task

#: Most tasks of a running view whose leases are read to tell which a requeue would skip.
LIVE_LEASE_CHECK_LIMIT = 1000
#: Most tasks one "cancel all in this view" cancels; each is a read and a script call, so a view is cut here.
CANCEL_VIEW_LIMIT = 1000
#: The segments whose tasks a cancel applies to: a waiting, ready or deferred task never runs (a waiting
#: one settles its children by their policy), a running one is asked to abort.
CANCELLABLE_SEGMENTS = (Segment.WAITING, Segment.READY, Segment.DEFERRED, Segment.RUNNING)


@dataclass(frozen=True, slots=True)
class Requeued:
    """What a requeue did: the ids it moved, and the running ids it skipped because their workers are alive.

    "Requeue all orphaned" also lists the running tasks it `held_back`: their worker's heartbeat
    is old, but the server restarted `restarted_s_ago` seconds ago and live workers are still
    reporting, so none of them counts as gone for `retry_in_s` more seconds.
    """

    moved: list[str]
    skipped: list[str] = field(default_factory=list)
    held_back: list[str] = field(default_factory=list)
    restarted_s_ago: float | None = None
    retry_in_s: float = 0.0

    @property
    def notice(self) -> str:
        """Say why the tasks held back stayed, as a sentence; "" when none was."""
        if not self.held_back:
            return ""
        count = len(self.held_back)
        tasks = "1 running task whose worker's heartbeat is old" if count == 1 else (
            f"{count} running tasks whose workers' heartbeats are old"
        )  # fmt: skip
        return (
            f"The server restarted {self.restarted_s_ago:.0f} s ago and workers are still reporting, so {tasks} "
            f"stayed: try again in {math.ceil(self.retry_in_s)} s."
        )


def count_selected(alias: str, queue_name: str, segment: Segment, task_ids: Sequence[str]) -> int:
    """Return how many of the selected tasks are in the segment now."""
    return len(get_backend(alias).in_segment(queue_name, segment, task_ids))


def count_view(alias: str, queue_name: str, segment: Segment, where: Filter = NO_FILTER) -> int:
    """Return how many tasks a (possibly filtered) segment view holds now."""
    return page(alias, queue_name, segment, 0, 1, where).total


def live_in_selection(alias: str, queue_name: str, segment: Segment, task_ids: Sequence[str]) -> list[str]:
    """Return the selected tasks a requeue without force skips: running, lease current, worker not known dead."""
    if segment is not Segment.RUNNING or not task_ids:
        return []
    return get_backend(alias).live_leases(queue_name, list(task_ids))


def live_in_view(alias: str, queue_name: str, segment: Segment, where: Filter = NO_FILTER) -> list[str]:
    """Return the tasks of a view a requeue without force skips, among its first `LIVE_LEASE_CHECK_LIMIT`."""
    if segment is not Segment.RUNNING:
        return []
    ids = [item.id for item in page(alias, queue_name, segment, 0, LIVE_LEASE_CHECK_LIMIT, where).items]
    return live_in_selection(alias, queue_name, segment, ids)


def requeue(alias: str, task_id: str, *, force: bool = False, seen: Segment | None = None) -> Requeued:
    """Requeue one task by id from the segment it is in, keeping its stored payload (it may be unreadable).

    A running task whose worker is alive and whose lease is current is skipped unless
    `force`; a ready task, or one that moved meanwhile, is left alone, and so is one no longer
    in `seen`, the segment the caller last saw it in (a deferred task that ran since is not run
    again). Raises TaskResultDoesNotExist when there is no such task.
    """
    found = task(alias, task_id)
    queue_name = found.queue_name if isinstance(found, UnreadableTask) else found.task.queue_name
    if found.segment is None or found.segment is Segment.READY or (seen is not None and found.segment is not seen):
        return Requeued([])
    return requeue_selected(alias, queue_name, found.segment, [task_id], force=force)


def requeue_selected(
    alias: str, queue_name: str, segment: Segment, task_ids: Sequence[str], *, force: bool = False
) -> Requeued:
    """Requeue the selected tasks of a segment in one script; running ones on live workers only with `force`.

    Ids of tasks outside this queue's segment are dropped first: the script checks a task's
    segment but not its queue, and a task's queue never changes, so this read cannot go stale.
    """
    backend = get_backend(alias)
    task_ids = backend.in_segment(queue_name, segment, task_ids)
    moved = backend.requeue_many(queue_name, segment=segment, task_ids=task_ids, force=force)
    if force:
        return Requeued(moved)
    left = set(moved)
    return Requeued(moved, live_in_selection(alias, queue_name, segment, [i for i in task_ids if i not in left]))


def requeue_view(
    alias: str, queue_name: str, segment: Segment, where: Filter = NO_FILTER, *, force: bool = False
) -> Requeued:
    """Requeue every task of a (possibly filtered) segment view, one script per window; running ones as above."""
    moved = get_backend(alias).requeue_matching(queue_name, segment=segment, needles=where.needles, force=force)
    return Requeued(moved, [] if force else live_in_view(alias, queue_name, segment, where))


def delete(alias: str, queue_name: str, segment: Segment, task_ids: Sequence[str]) -> list[str]:
    """Delete those selected tasks still in the segment, with their data and results, in one script."""
    return get_backend(alias).delete_many(queue_name, segment=segment, task_ids=task_ids)


def purge(alias: str, queue_name: str, segment: Segment) -> int:
    """Delete a whole segment and the task data it owns; return how many tasks were removed."""
    return get_backend(alias).purge(queue_name, segment=segment)


def cancel(alias: str, task_ids: Sequence[str], *, by: str, queue_name: str | None = None) -> dict[str, CancelOutcome]:
    """Cancel tasks by id (waiting, ready or deferred ones never run, running ones are asked to abort); say what each got.

    With `queue_name`, the ids of another queue's tasks are left alone and reported unknown.
    """
    backend = get_backend(alias)
    return {
        task_id: backend.cancel_outcome(task_id, by=by, queue_name=queue_name) for task_id in dict.fromkeys(task_ids)
    }


@dataclass(frozen=True, slots=True)
class Cancelled:
    """What a bulk cancel did: the ids cancelled, asked to abort, already finished, and left for another reason."""

    cancelled: list[str]
    abort_requested: list[str]
    already_finished: list[str]
    left: list[str]
    #: Tasks of the view past `CANCEL_VIEW_LIMIT`, not touched.
    beyond_limit: int = 0

    @classmethod
    def of(cls, outcomes: dict[str, CancelOutcome], beyond_limit: int = 0) -> Cancelled:
        """Sort each task's outcome into the four lists."""
        lists: dict[str, list[str]] = {"cancelled": [], "abort_requested": [], "already_finished": [], "left": []}
        for task_id, outcome in outcomes.items():
            lists[_CANCELLED_LIST.get(outcome, "left")].append(task_id)
        return cls(**lists, beyond_limit=beyond_limit)

    @property
    def took(self) -> list[str]:
        """The ids cancelled or asked to abort."""
        return self.cancelled + self.abort_requested


_CANCELLED_LIST = {
    CancelOutcome.CANCELLED: "cancelled",
    CancelOutcome.ABORT_REQUESTED: "abort_requested",
    CancelOutcome.ALREADY_FINISHED: "already_finished",
}


def cancel_selected(alias: str, queue_name: str, task_ids: Sequence[str], *, by: str) -> Cancelled:
    """Cancel the selected tasks of a queue, wherever they are now; ids of another queue's tasks are left alone."""
    return Cancelled.of(cancel(alias, task_ids, by=by, queue_name=queue_name))


def cancel_view(alias: str, queue_name: str, segment: Segment, where: Filter = NO_FILTER, *, by: str) -> Cancelled:
    """Cancel the tasks of a (possibly filtered) segment view, the first `CANCEL_VIEW_LIMIT` of them."""
    found = page(alias, queue_name, segment, 0, CANCEL_VIEW_LIMIT, where)
    ids = [item.id for item in found.items]
    outcomes = cancel(alias, ids, by=by, queue_name=queue_name)
    return Cancelled.of(outcomes, beyond_limit=max(0, found.total - len(ids)))
