"""The backend's half of `threadmill.api.queues`: queue names, a page of a segment, one task.

A page and its total come from one round trip a partition, whatever the segment's depth;
with several partitions the rows are merged in queue order. A task read with a payload this
code cannot read is quarantined in the unreadable segment, unless it has finished.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime

from django.tasks.exceptions import TaskResultDoesNotExist

from ...base import UNREADABLE_PAYLOAD_ERRORS, Page, Segment, ThreadmillTaskResult, UnreadableTask
from .. import codec
from ..errors import translate_errors
from ..keys import TASK_FIELDS
from ..merge import ROW_WIDTH, Cursor, KeysetPage, merge_rows
from ..partitions import partition_of
from .host import ToolingHost

logger = logging.getLogger("threadmill.backend")

#: Segments listed newest first; the others are listed in the order they are taken.
NEWEST_FIRST = frozenset({Segment.SUCCESSFUL, Segment.FAILED, Segment.UNREADABLE})
_FINISHED = frozenset({Segment.SUCCESSFUL, Segment.FAILED})


def _with_run_after(items: list, run_at: list[datetime | None]) -> list:
    """Give each readable deferred task the time it runs (its score), which a retry's backoff sets."""
    return [
        item if isinstance(item, UnreadableTask) else replace(item, task=item.task.using(run_after=at))
        for item, at in zip(items, run_at, strict=True)
    ]


class QueueTooling(ToolingHost):
    """Listing queues and reading their segments page by page, and one task wherever it is."""

    @translate_errors
    def queue_names(self) -> list[str]:
        """Return every configured queue and every queue a task was enqueued on, sorted."""
        pipe = self.client.pipeline(transaction=False)
        for partition in self.covered_partitions():
            pipe.smembers(self.keys_for(partition).queues())
        stored = {q.decode() for members in pipe.execute() for q in members}
        return sorted(stored | set(self.queues))

    def peek(self, queue_name: str, *, segment: Segment | str, offset: int = 0, count: int = 50) -> Page:
        """Return one page of a segment in queue order, with the segment's total, in one round trip a partition.

        With several partitions the page merges them in queue order; deep offsets read every
        partition's head up to the offset, so the console pages by cursor (`peek_page`) instead.
        """
        segment = Segment.parse(segment)
        if offset < 0 or count < 1:
            raise ValueError("peek needs offset >= 0 and count >= 1.")
        newest_first = segment in NEWEST_FIRST
        if len(self.covered_partitions()) == 1:
            reply = self.scripts.peek(queue_name, segment, offset, count, newest_first)
            rows = [reply[i : i + ROW_WIDTH] for i in range(2, len(reply), ROW_WIDTH)]
            items = [self._peeked(queue_name, segment, row) for row in rows]
            return Page(items, int(reply[0]))
        replies = [s.peek(queue_name, segment, 0, offset + count, newest_first) for s in self._partition_scripts()]
        rows, _ = merge_rows([(reply, 2) for reply in replies], newest_first, offset + count)
        items = [self._peeked(queue_name, segment, row) for row in rows[offset:]]
        return Page(items, sum(int(reply[0]) for reply in replies))

    def peek_page(
        self,
        queue_name: str,
        *,
        segment: Segment | str,
        after: Cursor | None = None,
        before: Cursor | None = None,
        count: int = 50,
        newest_first: bool | None = None,
    ) -> KeysetPage:
        """Return the page of a segment after (or before) a cursor, merged over partitions in queue order.

        One script call per partition, whatever the depth: each returns its first `count`
        entries past the cursor. A cursor is the (score, id) of the last entry of the page
        before (`after`) or the first of the page after (`before`); neither starts at the head.
        """
        segment = Segment.parse(segment)
        if count < 1 or (after is not None and before is not None):
            raise ValueError("peek_page needs count >= 1 and at most one of after and before.")
        newest_first = segment in NEWEST_FIRST if newest_first is None else newest_first
        backward = before is not None
        cursor = before if backward else after
        walk = newest_first != backward
        # One more than a page from each, so "is there a next page" is known, not guessed.
        replies = [s.peek_after(queue_name, segment, cursor, count + 1, walk) for s in self._partition_scripts()]
        rows, more = merge_rows([(reply, 2) for reply in replies], walk, count)
        if backward:
            rows.reverse()
        items = [self._peeked(queue_name, segment, row) for row in rows]
        if segment is Segment.DEFERRED:
            items = _with_run_after(items, [codec.moment(row[8]) for row in rows])
        edges = [(row[8].decode(), row[0].decode()) for row in (rows[0], rows[-1])] if rows else []
        has_next = (more if not backward else True) and bool(rows)
        has_previous = (cursor is not None if not backward else more) and bool(rows)
        return KeysetPage(
            items,
            sum(int(reply[0]) for reply in replies),
            next_cursor=edges[1] if edges and has_next else None,
            previous_cursor=edges[0] if edges and has_previous else None,
        )

    def peek_matching(
        self,
        queue_name: str,
        *,
        segment: Segment | str,
        needles: Sequence[str],
        offset: int = 0,
        count: int = 50,
        scan_limit: int = 100_000,
        newest_first: bool | None = None,
    ) -> tuple[Page, bool]:
        """Return one page of the tasks whose document contains every needle, in one round trip.

        The page's total counts the matches among the first `scan_limit` entries; the
        boolean is False when the segment is longer than that, so the total is a lower bound.
        Without needles it is a plain page at any depth. `newest_first` None keeps the
        segment's natural order (finished segments newest first, others in queue order).
        """
        segment = Segment.parse(segment)
        if offset < 0 or count < 1:
            raise ValueError("peek_matching needs offset >= 0 and count >= 1.")
        newest_first = segment in NEWEST_FIRST if newest_first is None else newest_first
        if len(self.covered_partitions()) == 1:
            if needles:
                reply = self.scripts.peek_matching(
                    queue_name, segment, offset, count, newest_first, scan_limit, needles
                )
                first_row, complete = 3, bool(int(reply[1]))
            else:
                # Nothing to match: a plain page read by rank, at any depth.
                reply = self.scripts.peek(queue_name, segment, offset, count, newest_first)
                first_row, complete = 2, True
            rows, total = [reply[i : i + ROW_WIDTH] for i in range(first_row, len(reply), ROW_WIDTH)], int(reply[0])
        else:
            # Every partition's first offset + count matches, merged in queue order.
            replies = [
                s.peek_matching(queue_name, segment, 0, offset + count, newest_first, scan_limit, needles)
                if needles
                else s.peek(queue_name, segment, 0, offset + count, newest_first)
                for s in self._partition_scripts()
            ]
            first_row = 3 if needles else 2
            complete = all(bool(int(reply[1])) for reply in replies) if needles else True
            rows = merge_rows([(reply, first_row) for reply in replies], newest_first, offset + count)[0][offset:]
            total = sum(int(reply[0]) for reply in replies)
        items = [self._peeked(queue_name, segment, row) for row in rows]
        if segment is Segment.DEFERRED:
            # A deferred task's score is when it runs (a retry's backoff, not the task's own run_after).
            items = _with_run_after(items, [codec.moment(row[8]) for row in rows])
        return Page(items, total), complete

    @translate_errors
    def peek_task(self, task_id: str) -> ThreadmillTaskResult | UnreadableTask:
        """Return one task in whatever segment it is, an unreadable one as stored; TaskResultDoesNotExist if none."""
        keys = self.task_keys(task_id)
        fields = self.client.hmget(keys.task(task_id), ("queue", "segment"))
        if fields[0] is None:
            raise TaskResultDoesNotExist(f"No task with id {task_id!r} is stored.")
        queue_name, segment = fields[0].decode(), Segment(fields[1].decode())
        pipe = self.client.pipeline(transaction=False)
        pipe.hmget(keys.task(task_id), TASK_FIELDS)
        pipe.get(keys.result(task_id))
        pipe.zscore(keys.segment(queue_name, segment), task_id)
        fields, old_layout_result, score = pipe.execute()
        data, _, _, started_at, worker, lease_started, token, read_error, stored_result, progress, metadata = fields[
            :11
        ]
        attempts, unique = fields[11], fields[12]
        stored_result = stored_result or old_layout_result
        if data is None:
            raise TaskResultDoesNotExist(f"No task with id {task_id!r} is stored.")
        row = [task_id.encode(), data, stored_result, started_at, worker, lease_started, token, read_error, score]
        task = self._peeked(queue_name, segment, [*row, progress], metadata, attempts)
        if unique is not None and isinstance(task, ThreadmillTaskResult):
            return replace(task, unique_key=keys.unique(unique.decode()))
        return task

    def _peeked(
        self, queue_name: str, segment: Segment, row: list, metadata: bytes | None = None, attempts: bytes | None = None
    ) -> ThreadmillTaskResult | UnreadableTask:
        """Read one row of a peek reply (a page's rows carry no metadata; one task's read does)."""
        task_id = row[0].decode()
        data, stored_result, started_at, worker, lease_started, token, read_error, score, progress = row[1:]
        raw = stored_result or data or b""
        if segment is Segment.UNREADABLE:
            return UnreadableTask(task_id, queue_name, segment, raw, codec.text(read_error))
        try:
            return codec.decode(
                raw,
                segment,
                started_at=started_at or None,
                lease_worker=codec.text(worker),
                lease_started_at=codec.moment(lease_started),
                lease_token=codec.text(token),
                lease_deadline=codec.moment(score) if segment is Segment.RUNNING else None,
                progress=progress,
                metadata=metadata,
                attempts=attempts,
            )
        except UNREADABLE_PAYLOAD_ERRORS as e:
            if segment not in _FINISHED:
                self.quarantine_unreadable(task_id, queue_name, segment, e, codec.text(token), "peek")
            return UnreadableTask(task_id, queue_name, segment, raw, f"{type(e).__name__}: {e}")

    def quarantine_unreadable(
        self, task_id: str, queue_name: str, segment: Segment, error: Exception, token: str, path: str
    ) -> None:
        """Move a task whose payload this code cannot read to the unreadable segment, and log it once.

        Fenced by `token` and by `segment`: a task that left the segment it was read in is left to
        the path that has it now (a worker that acquired it quarantines it under its lease). A workflow
        task's quarantine is its final outcome: counted failed, its children settled by their policy.
        """
        text = f"{type(error).__name__}: {error}"
        reply = self.task_scripts(task_id).quarantine(task_id, queue_name, segment, text, token, self.config.result_ttl)
        if reply == 2:
            self.finish_settling([partition_of(task_id)])  # a workflow task's children, past one call's budget
        if reply in (1, 2):
            logger.error(
                "Task %s on queue %s is unreadable (%s path) and was quarantined: %s", task_id, queue_name, path, text
            )
