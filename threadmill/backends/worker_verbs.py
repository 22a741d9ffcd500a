"""What a worker process asks of its backend: acquire, acknowledge, release, reports, heartbeats and wakes.

`WorkerVerbs` is the part of `RedisTaskBackend` the worker's hot path calls, kept apart from
enqueueing (`enqueue.py`) and the tooling API's reads and actions (`tooling/`). Each verb is
one script call (or one per partition it touches), fenced by the lease token where it writes.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from django.tasks import TaskResultStatus

from ..attempts import attempt_record
from ..base import UNREADABLE_PAYLOAD_ERRORS, Segment, ThreadmillTaskResult, return_value_of
from ..exceptions import TaskCancelled, TaskTimeout
from ..identity import this_process_name
from ..limits import UNLIMITED, Acquired
from ..outcome import ended_by
from . import codec
from .channel import TelemetrySubscription, publish
from .errors import translate_errors
from .partitions import by_partition
from .scripts import ENDED_BY_ABORT, ENDED_BY_TIME_LIMIT
from .tooling.host import ToolingHost

logger = logging.getLogger("threadmill.backend")

#: Seconds a token that wakes one worker process is kept, should the process be gone.
WORKER_WAKE_TTL_S = 60
#: Most running entries of one queue `release_unanswered` looks through.
RELEASE_SCAN_LIMIT = 100_000
#: What acknowledge.lua answers for a task stored whose release of children ran out of the call's budget.
CUT_SHORT = 2


#: The letter acknowledge.lua counts a run by, by what ended it (`outcome.ended_by`).
_ENDED_BY: dict[type[BaseException] | None, str] = {TaskTimeout: ENDED_BY_TIME_LIMIT, TaskCancelled: ENDED_BY_ABORT}
#: Marks `acknowledge` called without a return value: the result's own is stored.
_ON_RESULT: Any = object()


def _abort_request(stored: bytes) -> dict[str, Any]:
    """Read a stored abort request; one this code cannot read still asks to abort, by someone unnamed."""
    try:
        request = json.loads(stored)
        return {"by": str(request["by"]), "at": float(request["at"])}
    except (ValueError, TypeError, KeyError):
        return {"by": "someone", "at": time.time()}


class WorkerVerbs(ToolingHost):
    """The backend's calls a worker process makes for the tasks it leases."""

    # Set by the backend, or given by PartitionRouting and the tooling mixed in beside this.
    _rotation: int
    _limit_texts: dict[str, str]
    empty_hints: Any
    wait_on_partitions: Any
    quarantine_unreadable: Any
    finish_settling: Any

    def acquire(
        self,
        *queue_names: str,
        count: int = 1,
        worker: str = "",
        timeout: timedelta | None = None,
        token_base: str = "",
    ) -> Acquired:
        """Lease up to `count` ready tasks round-robin across `queue_names` in one atomic call.

        With `timeout` None this tries once; with a timedelta it polls with exponential
        backoff until a task arrives or the time is up. An empty list means none arrived.
        Payloads this code cannot read are quarantined and not returned. Each lease's
        token starts with `token_base` (random unless given), so the leases of a call whose
        reply was lost can be found again with `release_unanswered`.
        """
        queues = list(queue_names) or sorted(self.queues)
        worker = worker or this_process_name()
        deadline = None if timeout is None else time.monotonic() + timeout.total_seconds()
        pause = self.config.poll_interval
        while True:
            results = self._acquire_once(queues, count, worker, token_base or os.urandom(6).hex())
            if results or deadline is None:
                return results
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return results
            time.sleep(min(pause, remaining))
            pause = min(pause * 2, self.config.poll_max_interval)

    def _acquire_once(self, queues: list[str], count: int, worker: str, token_base: str) -> Acquired:
        shift = self._rotation % len(queues)
        self._rotation += 1
        rotated = queues[shift:] + queues[:shift]
        limits = [self._limit_texts.get(q, UNLIMITED) for q in rotated]
        partitions = len(self.covered_partitions())
        results = Acquired()
        if partitions == 1:
            reply = self.scripts.acquire(rotated, count, worker, self.config.lease_ttl, token_base, limits)
            results.hold(reply[-1])
        else:
            for partition in self.empty_hints.order(partitions):
                reply = self.scripts_for(partition).acquire(
                    rotated, count, worker, self.config.lease_ttl, token_base, limits, partitions
                )
                results.hold(reply[-1])
                leased = (len(reply) - 3) // 6
                self.empty_hints.came_back(partition, full=leased >= count)
                if leased:
                    break
        now = int(reply[0]) + int(reply[1]) / 1e6
        lease_start = datetime.fromtimestamp(now, UTC)
        deadline = datetime.fromtimestamp(now + self.config.lease_ttl, UTC)
        for i in range(2, len(reply) - 1, 6):
            task_id, data, started_at, token = reply[i].decode(), reply[i + 1], reply[i + 2], reply[i + 3].decode()
            losses = reply[i + 5]
            try:
                results.append(
                    codec.decode(
                        data,
                        Segment.RUNNING,
                        started_at=started_at,
                        lease_worker=worker,
                        lease_started_at=lease_start,
                        lease_token=token,
                        lease_deadline=deadline,
                        worker_losses=None if losses is None else int(losses),
                    )
                )
            except UNREADABLE_PAYLOAD_ERRORS as e:
                self.quarantine_unreadable(
                    task_id, rotated[int(reply[i + 4]) - 1], Segment.RUNNING, e, token, "acquire"
                )
        return results

    def acknowledge(self, result: ThreadmillTaskResult, return_value: Any = _ON_RESULT) -> bool:
        """Store a finished result and release its lease; False when the fence refused it.

        Without `return_value`, the value the result carries is stored (Django's
        `TaskResult.return_value` of a successful result).
        """
        if return_value is _ON_RESULT:
            return_value = return_value_of(result)
        return self.acknowledge_many([(result, return_value)])[0]

    def acknowledge_many(
        self, outcomes: Sequence[tuple[ThreadmillTaskResult, Any]], *, settle_in_background: bool = False
    ) -> list[bool]:
        """Acknowledge several finished results in one script call, each fenced by its lease token.

        A workflow task's release of children that ran out of the call's budget is continued at once
        (`finish_settling`), in this call or, with `settle_in_background`, on a thread of its own, so a
        worker's fetcher goes on leasing and acknowledging while the rest of a large fan-out is released.
        """
        entries = []
        for result, return_value in outcomes:
            segment = Segment.SUCCESSFUL if result.status == TaskResultStatus.SUCCESSFUL else Segment.FAILED
            document = codec.encode_result(result, return_value)
            end = "-" if segment is Segment.SUCCESSFUL else _ENDED_BY.get(ended_by(result), "-")
            record = attempt_record(result)
            unique = getattr(result.task, "unique", False)
            entries.append(
                (result.id, result.task.queue_name, result.lease_token, document, segment, end, record, unique)
            )
        minute = int(time.time() // 60)
        cut_short: tuple[int, ...] = (0,)
        if len(self.covered_partitions()) == 1:
            accepted = self.scripts.acknowledge(entries, self.config.result_ttl, minute)
        else:
            by_id: dict[str, Any] = {}
            cut_short_in: list[int] = []
            for partition, group in by_partition(entries, lambda entry: entry[0]).items():
                replies = self.scripts_for(partition).acknowledge(group, self.config.result_ttl, minute)
                by_id.update(zip((entry[0] for entry in group), replies, strict=True))
                if CUT_SHORT in replies:
                    cut_short_in.append(partition)
            accepted = [by_id[entry[0]] for entry in entries]
            cut_short = tuple(cut_short_in)
        if CUT_SHORT in accepted:
            # A release of children ran out of the call's budget: continue it now, not at the next sweep.
            if settle_in_background:
                threading.Thread(
                    target=self._finish_settling_or_log, args=(cut_short,), name="threadmill-settle", daemon=True
                ).start()
            else:
                self.finish_settling(cut_short)
        for (result, _), ok in zip(outcomes, accepted, strict=True):
            if not ok:
                logger.warning(
                    "Acknowledgement of task %s refused: it no longer holds lease %s (taken back by the broker, "
                    "or already acknowledged by a call whose reply was lost).",
                    result.id,
                    result.lease_token,
                )
        return [bool(ok) for ok in accepted]

    def _finish_settling_or_log(self, partitions: tuple[int, ...]) -> None:
        try:
            self.finish_settling(partitions)
        except Exception as e:  # noqa: BLE001 - a thread's last word; the sweeper continues the release
            logger.warning("Continuing a workflow's release of children failed (%s); the sweeper finishes it.", e)

    def release(self, results: Sequence[ThreadmillTaskResult]) -> int:
        """Hand leased tasks that never started back to ready, where they were, with no attempt recorded.

        Fenced per task by its lease token: a task whose lease was taken over is left alone.
        Returns how many went back.
        """
        if not results:
            return 0
        leases = [(r.id, r.task.queue_name, r.lease_token) for r in results]
        return sum(
            self.task_scripts(group[0][0]).release(group)
            for group in by_partition(leases, lambda lease: lease[0]).values()
        )

    def record_progress(self, result: ThreadmillTaskResult, stage: str) -> bool:
        """Record on the server that a suspect's run has "started" or "finished" under its lease.

        One round trip, made only for a suspect (`worker_losses` set), so a loss of this worker
        is blamed exactly. False when the fence refused it: the lease was taken back.
        """
        return self.task_scripts(result.id).record_progress(result.id, result.lease_token, stage) == 1

    def extend_lease(self, result: ThreadmillTaskResult, cover_s: float) -> bool:
        """Make a running task's lease last at least `cover_s` seconds from now; False when it was taken back.

        One round trip, made only before a run whose time limit and grace outlast its lease.
        """
        scripts = self.task_scripts(result.id)
        deadline = scripts.extend_lease(result.id, result.task.queue_name, result.lease_token, cover_s)
        if deadline is None:
            return False
        object.__setattr__(result, "lease_deadline", codec.moment(deadline))
        return True

    def record_task_stats(self, counts: dict[str, dict[str, dict[str, int]]]) -> int:
        """Add a worker's per-task-path counts ({queue: {path: {name: n}}}, `taskstats`) in one call on partition 0."""
        return self.scripts.record_task_stats(counts, int(time.time() // 60)) if counts else 0

    def report(self, entries: Sequence[tuple[str, str, str, str, bool]]) -> list:
        """Store what running tasks reported (see `threadmill.progress`), one script call a partition.

        Each entry is (task id, lease token, progress, metadata, merged), fenced by its token;
        returns a reply per entry in order: 1 stored, 0 refused, or the stored metadata to merge first.
        """
        replies: list[Any] = [0] * len(entries)
        for group in by_partition(enumerate(entries), lambda item: item[1][0]).values():
            answered = self.task_scripts(group[0][1][0]).report([entry for _, entry in group])
            for (i, _), reply in zip(group, answered, strict=True):
                replies[i] = reply
        return replies

    def aborts_requested(self, results: Sequence[ThreadmillTaskResult]) -> dict[str, dict[str, Any]]:
        """Return the abort requests stored for these leases (see `cancel`): lease token -> {"by", "at"}.

        Read only, one script call a partition; a lease taken back since reads as no request.
        """
        requests: dict[str, dict[str, Any]] = {}
        leases = [(r.id, r.lease_token) for r in results]
        for group in by_partition(leases, lambda lease: lease[0]).values():
            stored_requests = self.task_scripts(group[0][0]).aborts_requested(group)
            for (_, token), stored in zip(group, stored_requests, strict=True):
                if stored:
                    requests[token] = _abort_request(stored)
        return requests

    def release_unanswered(self, queue_names: Sequence[str], token_bases: Sequence[str]) -> int:
        """Hand back to ready the leases that acquire calls with these token bases took; return how many.

        For calls whose reply never arrived (a timeout, a dropped connection): the server may
        have run them, leasing tasks to a worker that never saw them.
        """
        if not token_bases:
            return 0
        return sum(
            self.scripts_for(partition).release_unanswered(list(queue_names), list(token_bases), RELEASE_SCAN_LIMIT)
            for partition in self.covered_partitions()
        )

    def wait_for_tasks(self, queue_names: Sequence[str], worker: str, timeout_s: float) -> bool:
        """Block until a task may be ready on one of the queues, `worker` is woken, or `timeout_s` passes.

        Returns True when woken. Waking leases nothing: the caller acquires as usual.
        """
        return self.wait_on_partitions(queue_names, worker, timeout_s)

    def pass_wake_on(self, queue_names: Sequence[str]) -> None:
        """Wake an idle worker in each partition whose ready tasks have no wake token (one this process took, unused)."""
        for partition in self.covered_partitions():
            self.scripts_for(partition).pass_wake(queue_names)

    @translate_errors
    def wake_worker(self, worker: str) -> None:
        """Wake `worker` if it waits for tasks (so it notices a stop at once)."""
        self.scripts.wake_worker(worker, WORKER_WAKE_TTL_S)

    def heartbeat(self, worker: str, document: dict[str, Any] | None, *, publish: bool = True) -> float:
        """Record that `worker` is alive with its `document` (also published as telemetry); return the server time.

        `document` None says goodbye: the worker handed everything back and leaves the workers set.
        The document outlives the heartbeat by `lease_ttl`, so the broker can still read a dead worker's.
        """
        text = "" if document is None else json.dumps(document)
        ttl = self.config.lease_ttl + self.config.worker_timeout
        return float(self.scripts.heartbeat(worker, text, ttl, publish))

    @translate_errors
    def publish_telemetry(self, text: str) -> None:
        """Publish one telemetry message on the alias's channel (sharded on a cluster)."""
        publish(self.client, self.keys.telemetry(), text, sharded=self.cluster)

    def subscribe_telemetry(self, channels: Sequence[str]) -> TelemetrySubscription:
        """Subscribe to telemetry channels on this backend's server (sharded on a cluster)."""
        return TelemetrySubscription(self.client, channels, sharded=self.cluster)
