"""The backend's half of `threadmill.api.workflows`: workflow records by enqueue time, one record, task states.

A workflow lives in one partition's keys, the one its id names (`threadmill.backends.workflows`):
its record hash (`name`, `created_at`, `graph`, `total` and the counts its scripts keep) and that
partition's `workflows` index, newest last. A list merges the covered partitions' indexes. The
workflow itself (its enqueue, its tasks read whole, the cancel and the retry) is the backend's
(`backends/workflows.py`); this half reads what a page or a command line shows beside it. Every read
here is one round trip, a pipeline where it reads many keys; the callers bound how many (a page of
records, a page of a graph's tasks).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..errors import translate_errors
from .host import ToolingHost

if TYPE_CHECKING:
    from ...workflows import WorkflowResult

#: The record fields a list row reads, in this order (never `graph`: it holds every node).
SUMMARY_FIELDS = ("name", "created_at", "finished_at", "total", "waiting", "successful", "failed")


class WorkflowTooling(ToolingHost):
    """Reading workflow records, one record with its graph, and the states of some of a workflow's tasks."""

    if TYPE_CHECKING:

        def get_workflow(self, workflow_id: str) -> WorkflowResult: ...

    def workflow_with_parents(self, workflow_id: str) -> tuple[WorkflowResult, dict[str, list[str]]]:
        """Return a workflow's state and each node's parent nodes; raise TaskResultDoesNotExist for an unknown id."""
        result = self.get_workflow(workflow_id)
        return result, {name: list(of) for name, of in result.parents.items()}

    @translate_errors
    def workflow_ids(self, first: int, count: int) -> tuple[int, list[tuple[str, float]]]:
        """Return how many workflows the indexes hold and (id, enqueue time) of `count` of them from rank `first`, newest first.

        One round trip. With several partitions it reads each partition's newest `first + count`
        and merges them (the console pages a list by offset, and a list's deep pages are rare).
        """
        partitions = self.covered_partitions()
        start = first if len(partitions) == 1 else 0
        pipe = self.client.pipeline(transaction=False)
        for partition in partitions:
            index = self.keys_for(partition).workflows()
            pipe.zcard(index)
            pipe.zrevrange(index, start, first + count - 1, withscores=True)
        replies = pipe.execute()
        total = sum(int(n) for n in replies[0::2])
        found = [(member.decode(), float(score)) for rows in replies[1::2] for member, score in rows]
        if len(partitions) > 1:
            # ZREVRANGE's own order: newest first, a tie by id, greatest first.
            found = sorted(found, key=lambda row: (row[1], row[0]), reverse=True)[first : first + count]
        return total, found

    @translate_errors
    def workflow_summaries(self, workflow_ids: Sequence[str]) -> list[dict[str, bytes | None]]:
        """Return each workflow's `SUMMARY_FIELDS` (values None where absent; all None for an expired record)."""
        pipe = self.client.pipeline(transaction=False)
        for workflow_id in workflow_ids:
            pipe.hmget(self.task_keys(workflow_id).workflow(workflow_id), SUMMARY_FIELDS)
        return [dict(zip(SUMMARY_FIELDS, values, strict=True)) for values in pipe.execute()]

    @translate_errors
    def workflow_record(self, workflow_id: str) -> dict[str, bytes]:
        """Return a workflow's whole record, its graph included ({} when none is stored)."""
        record = self.client.hgetall(self.task_keys(workflow_id).workflow(workflow_id))
        return {field.decode(): value for field, value in record.items()}

    @translate_errors
    def workflow_task_segments(self, task_ids: Sequence[str]) -> list[str | None]:
        """Return each task's segment name, None for a task no longer stored (its result expired)."""
        pipe = self.client.pipeline(transaction=False)
        for task_id in task_ids:
            pipe.hget(self.task_keys(task_id).task(task_id), "segment")
        return [None if segment is None else segment.decode() for segment in pipe.execute()]

    @translate_errors
    def task_workflow(self, task_id: str) -> tuple[str, str] | None:
        """Return (workflow id, node name) of a workflow's task, None for a task of no workflow."""
        workflow_id, node = self.client.hmget(self.task_keys(task_id).task(task_id), ["workflow", "node"])
        return None if workflow_id is None else (workflow_id.decode(), (node or b"").decode())
