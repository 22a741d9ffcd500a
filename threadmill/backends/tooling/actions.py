"""The backend's half of `threadmill.api.actions`: requeue, delete, purge and cancel tasks, and what an action touches.

Every move is one Lua script call (a bounded batch or window each), so a crash never loses
a task between two writes. Without `force` a running task moves only when its lease is
overdue or its worker silent, checked in the script that moves it; its abandoned attempt is
recorded in its document. A cancel finishes a waiting, ready or deferred task as failed, fenced by the
segment it was read in; one leased in between gets an abort request in the same script.
"""

from __future__ import annotations

import enum
import json
import logging
import time
from collections.abc import Callable, Iterable, Sequence

from django.tasks.exceptions import TaskResultDoesNotExist

from ...base import DELETABLE_SEGMENTS, UNREADABLE_PAYLOAD_ERRORS, WAITING_NOT_DELETABLE, Segment
from ...exceptions import UnreadableTaskError
from ...outcome import record_abandoned
from .. import codec
from ..cancelling import CANCEL_ROUNDS, cancelled_document, default_canceller
from ..errors import translate_errors
from ..keys import TASK_FIELDS
from ..partitions import by_partition
from .host import ToolingHost
from .queues import NEWEST_FIRST

logger = logging.getLogger("threadmill.backend")

#: Times a requeue of running tasks reads them again when the fence refused them (leased again since).
REQUEUE_ROUNDS = 3
#: Times `delete(task_ids)` reads again where a task is, when it moved while being deleted.
DELETE_ROUNDS = 3


class CancelOutcome(enum.Enum):
    """What a cancel did to one task."""

    CANCELLED = "cancelled"
    ABORT_REQUESTED = "abort requested"
    ALREADY_FINISHED = "already finished"
    UNKNOWN = "unknown"
    UNREADABLE = "unreadable"
    #: It moved between ready and deferred each time it was read (`CANCEL_ROUNDS`); nothing changed.
    KEPT_MOVING = "kept moving"

    @property
    def took(self) -> bool:
        """Whether the task was cancelled or asked to abort."""
        return self in (CancelOutcome.CANCELLED, CancelOutcome.ABORT_REQUESTED)


class ActionTooling(ToolingHost):
    """Requeueing in bulk, deleting and purging the tasks of a queue's segments."""

    # From WorkerTooling (mixed in beside this class).
    settled_heartbeat_ages: Callable[[], dict[str, float]]

    @translate_errors
    def in_segment(self, queue_name: str, segment: Segment | str, task_ids: Sequence[str]) -> list[str]:
        """Return those of the given task ids that are in one segment of a queue now."""
        segment = Segment.parse(segment)
        present: set[str] = set()
        for partition, ids in by_partition(task_ids, str).items():
            scores = self.client.zmscore(self.keys_for(partition).segment(queue_name, segment), ids)
            present.update(task_id for task_id, score in zip(ids, scores, strict=True) if score is not None)
        return [task_id for task_id in task_ids if task_id in present]

    def live_leases(self, queue_name: str, task_ids: Iterable[str]) -> list[str]:
        """Return those of the given tasks running under a live lease: the ones requeue_many skips without force."""
        live: list[str] = []
        heartbeats = None
        options = self.config
        for partition, ids in by_partition(task_ids, str).items():
            if partition and heartbeats is None:
                heartbeats = self.settled_heartbeat_ages()
            given = heartbeats if partition else None
            live += self.scripts_for(partition).live_leases(
                queue_name, ids, options.worker_timeout, given, options.heartbeat_settle
            )
        return live

    def requeue_many(
        self, queue_name: str, *, segment: Segment | str, task_ids: Iterable[str], force: bool = False
    ) -> list[str]:
        """Requeue the given tasks of one segment to ready in one script; return the ids that moved.

        A running task's abandoned attempt is recorded (its worker id kept, an
        `AttemptAbandoned` error added). Without `force` a running task moves only when its
        lease is overdue or its worker's heartbeat is older than `worker_timeout` (a worker with
        no heartbeat: the lease is older than that), checked in the same script as the move;
        `live_leases` tells which would be skipped.
        """
        segment = Segment.parse(segment)
        ids = list(task_ids)
        return self._requeue_batch(queue_name, segment, ids, (), force, "requeue_many") if ids else []

    def requeue_matching(
        self, queue_name: str, *, segment: Segment | str, needles: Sequence[str] = (), force: bool = False
    ) -> list[str]:
        """Requeue every task of a segment whose document contains every needle, one window per script call.

        Returns the ids that moved. The walk keeps a (score, id) cursor, so tasks leaving or
        joining the segment meanwhile never make it skip one that stays. Each task moves
        atomically; a crash between windows leaves the rest where they were. Running tasks
        follow `requeue_many`'s rules, `force` included.
        """
        segment = Segment.parse(segment)
        window, newest_first = self.config.batch_size, segment in NEWEST_FIRST
        moved: list[str] = []
        for scripts in self._partition_scripts():
            cursor = (b"", b"")
            while entries := scripts.scan(queue_name, segment, cursor, window, newest_first):
                ids = [task_id.decode() for task_id, _ in entries]
                moved += self._requeue_batch(queue_name, segment, ids, needles, force, "requeue_matching")
                if len(entries) < window:
                    break
                cursor = (entries[-1][1], entries[-1][0])
        return moved

    def _requeue_batch(
        self, queue_name: str, segment: Segment, ids: list[str], needles: Sequence[str], force: bool, by: str
    ) -> list[str]:
        moved: list[str] = []
        for partition, group in by_partition(ids, str).items():
            moved += self._requeue_partition(partition, queue_name, segment, group, needles, force, by)
        return moved

    def _requeue_partition(
        self, partition: int, queue_name: str, segment: Segment, ids: list[str], needles, force: bool, by: str
    ) -> list[str]:
        timeout, settle = self.config.worker_timeout, self.config.heartbeat_settle
        scripts = self.scripts_for(partition)
        if segment is not Segment.RUNNING:
            entries = [(task_id, "", "") for task_id in ids]
            return scripts.requeue_many(queue_name, segment, entries, needles, force, timeout)[0]
        heartbeats = self.settled_heartbeat_ages() if partition and not force else None
        by = f"{by} (forced)" if force else f"{by} (its lease overdue or its worker silent)"
        moved: list[str] = []
        # The fence refuses a task leased again since it was read; read it again, a few times.
        for _ in range(REQUEUE_ROUNDS):
            entries = self._abandoned_entries(queue_name, ids, needles, by)
            if not entries:
                break
            done, ids = scripts.requeue_many(queue_name, segment, entries, needles, force, timeout, heartbeats, settle)
            moved += done
            if not ids:
                break
        return moved

    def _abandoned_entries(
        self, queue_name: str, task_ids: Sequence[str], needles: Sequence[str], by: str
    ) -> list[tuple[str, str, str]]:
        """Read running tasks and return (id, lease token, document with the abandoned attempt) for each."""
        pipe = self.client.pipeline(transaction=False)
        for task_id in task_ids:
            pipe.hmget(self.task_keys(task_id).task(task_id), TASK_FIELDS)
        encoded = [needle.encode() for needle in needles]
        entries = []
        for task_id, fields in zip(task_ids, translate_errors(pipe.execute)(), strict=True):
            if fields[2] == b"running" and all(needle in fields[0] for needle in encoded):
                entries.append(
                    (task_id, codec.text(fields[6]), self.abandoned_document(task_id, queue_name, fields, by))
                )
        return entries

    def abandoned_document(self, task_id: str, queue_name: str, fields: Sequence[bytes | None], by: str) -> str:
        """Return a running task's document with its attempt recorded as abandoned by `by`; "" if unreadable.

        `fields` are the task hash's TASK_FIELDS. An unreadable payload is kept as it is
        (the caller sends "") and the abandoned attempt is only logged.
        """
        data, _, _, started_at, worker, lease_started, token = fields[:7]
        worker_name = codec.text(worker)
        try:
            result = codec.decode(
                data or b"",
                Segment.RUNNING,
                started_at=started_at,
                lease_worker=worker_name,
                lease_started_at=codec.moment(lease_started),
                lease_token=codec.text(token),
            )
        except UNREADABLE_PAYLOAD_ERRORS as e:
            logger.warning(
                "Task %s on queue %s was requeued while worker %s ran it, by %s; its payload is unreadable "
                "(%s: %s), so the abandoned attempt is not recorded in it.",
                task_id, queue_name, worker_name, by, type(e).__name__, e,
            )  # fmt: skip
            return ""
        leased_at = "an unknown time" if result.lease_started_at is None else result.lease_started_at.isoformat()
        record_abandoned(
            result,
            f"The attempt of worker {worker_name}, leased at {leased_at}, was abandoned: "
            f"the task was requeued while it ran, by {by}.",
        )
        return codec.encode_result(result)

    def delete_many(self, queue_name: str, *, segment: Segment | str, task_ids: Iterable[str]) -> list[str]:
        """Delete those of the given tasks still in one segment of a queue, in one script; return their ids.

        A task that moved elsewhere since the caller saw it is left alone. Raises ValueError for the
        waiting segment (`WAITING_NOT_DELETABLE`).
        """
        segment = _deletable(segment)
        deleted: list[str] = []
        for partition, ids in by_partition(task_ids, str).items():
            deleted += self._delete(partition, queue_name, segment, ids)
        return deleted

    def delete(self, task_ids: Iterable[str]) -> int:
        """Remove the given tasks wherever they are, with their data and results; return how many existed.

        A workflow task is settled as a cancelled one is, in the same script: unless it had succeeded,
        its workflow counts it FAILED and its children fail (`UpstreamFailed`) or run by their policy.
        """
        pending, deleted = list(task_ids), 0
        # Each task is deleted only from the segment it was just read in; one that moved in
        # between is read again (a task can move only so often: a few rounds settle it).
        for _ in range(DELETE_ROUNDS):
            if not pending:
                break
            places: dict[tuple[str, Segment], list[str]] = {}
            for task_id, (queue_name, segment) in zip(pending, self._places(pending), strict=True):
                if queue_name is not None:
                    places.setdefault((queue_name.decode(), Segment(segment.decode())), []).append(task_id)
            gone: set[str] = set()
            for (queue_name, segment), ids in places.items():
                for partition, group in by_partition(ids, str).items():
                    gone.update(self._delete(partition, queue_name, segment, group))
            deleted += len(gone)
            pending = [task_id for ids in places.values() for task_id in ids if task_id not in gone]
        return deleted

    def _delete(self, partition: int, queue_name: str, segment: Segment, task_ids: list[str]) -> list[str]:
        deleted, cut_short = self.scripts_for(partition).delete(queue_name, segment, task_ids, self.config.result_ttl)
        if cut_short:
            self.finish_settling([partition])  # a deleted workflow task's children, past one call's budget
        return deleted

    @translate_errors
    def _places(self, task_ids: Sequence[str]) -> list[list]:
        pipe = self.client.pipeline(transaction=False)
        for task_id in task_ids:
            pipe.hmget(self.task_keys(task_id).task(task_id), ("queue", "segment"))
        return pipe.execute()

    def purge(self, queue_name: str, *, segment: Segment | str) -> int:
        """Delete a segment and the task data it owns, in batches; return how many were removed.

        Raises ValueError for the waiting segment (`WAITING_NOT_DELETABLE`).
        """
        segment = _deletable(segment)
        removed = 0
        for scripts in self._partition_scripts():
            while batch := scripts.purge(queue_name, segment, self.config.batch_size, self.config.result_ttl):
                removed += batch
        return removed

    def cancel(self, task_id: str, *, by: str = "") -> bool:
        """Cancel a task: finished FAILED with TaskCancelled if it had not started, else asked to abort.

        Returns True when it was cancelled or an abort was requested, False when it had already
        finished. Raises TaskResultDoesNotExist for an unknown id and UnreadableTaskError for a
        task whose payload this code cannot read (it is quarantined, not cancellable).
        """
        outcome = self.cancel_outcome(task_id, by=by)
        if outcome is CancelOutcome.UNKNOWN:
            raise TaskResultDoesNotExist(f"No task with id {task_id!r} is stored.")
        if outcome is CancelOutcome.UNREADABLE:
            raise UnreadableTaskError(f"Task {task_id} is unreadable; it cannot be cancelled.")
        if outcome is CancelOutcome.KEPT_MOVING:
            logger.warning("Task %s moved each of the %d times it was read to be cancelled.", task_id, CANCEL_ROUNDS)
        return outcome.took

    def cancel_many(self, task_ids: Iterable[str], *, by: str = "") -> list[str]:
        """Cancel each task as `cancel` does; return the ids cancelled or asked to abort (unknown ids are skipped)."""
        return [task_id for task_id in task_ids if self.cancel_outcome(task_id, by=by).took]

    def cancel_outcome(self, task_id: str, *, by: str = "", queue_name: str | None = None) -> CancelOutcome:
        """Cancel one task as `cancel` does and say what happened to it, without raising for an unknown id.

        With `queue_name`, a task of another queue counts as unknown and is left alone (a task's
        queue never changes, so this read cannot go stale).
        """
        by = by or default_canceller()
        now = time.time()
        request = json.dumps({"by": by, "at": now})
        scripts, keys = self.task_scripts(task_id), self.task_keys(task_id)
        reply = -1
        for _ in range(CANCEL_ROUNDS):
            fields = translate_errors(self.client.hmget)(keys.task(task_id), ("data", "queue", "segment"))
            if fields[1] is None or fields[2] is None or queue_name not in (None, fields[1].decode()):
                return CancelOutcome.UNKNOWN
            queue_name, segment = fields[1].decode(), fields[2].decode()
            document: str | None = ""
            if segment in ("waiting", "ready", "deferred"):
                document = cancelled_document(task_id, fields[0], Segment(segment), by, now)
                if document is None:
                    return CancelOutcome.UNREADABLE
            minute = int(now // 60)
            reply = scripts.cancel(task_id, queue_name, segment, document, self.config.result_ttl, request, minute)
            if reply != -1:
                break
        return _CANCEL_REPLIES.get(reply, CancelOutcome.KEPT_MOVING)


def _deletable(segment: Segment | str) -> Segment:
    """Return the segment named, raising ValueError for one whose tasks a delete or a purge must not remove."""
    segment = Segment.parse(segment)
    if segment not in DELETABLE_SEGMENTS:
        raise ValueError(WAITING_NOT_DELETABLE)
    return segment


_CANCEL_REPLIES = {
    1: CancelOutcome.CANCELLED,
    2: CancelOutcome.ABORT_REQUESTED,
    0: CancelOutcome.ALREADY_FINISHED,
    -2: CancelOutcome.UNKNOWN,
    -3: CancelOutcome.UNREADABLE,
}
