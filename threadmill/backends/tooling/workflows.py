"""The backend's half of `threadmill.api.workflows`: workflow records by enqueue time, one record, task states.

A workflow lives in partition 0's keys (`threadmill.backends.workflows`): its record hash
(`name`, `created_at`, `graph`, `total` and the counts its scripts keep) and the `workflows`
index, newest last. The workflow itself (its enqueue, its tasks read whole, the cancel and the
retry) is the backend's (`backends/workflows.py`); this half reads what a page or a command
line shows beside it. Every read here is one round trip, a pipeline where it reads many keys;
the callers bound how many (a page of records, a page of a graph's tasks).
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
        """Return how many workflows the index holds and (id, enqueue time) of `count` of them from rank `first`, newest first."""
        pipe = self.client.pipeline(transaction=False)
        pipe.zcard(self.keys.workflows())
        pipe.zrevrange(self.keys.workflows(), first, first + count - 1, withscores=True)
        total, found = pipe.execute()
        return int(total), [(member.decode(), float(score)) for member, score in found]

    @translate_errors
    def workflow_summaries(self, workflow_ids: Sequence[str]) -> list[dict[str, bytes | None]]:
        """Return each workflow's `SUMMARY_FIELDS` (values None where absent; all None for an expired record)."""
        pipe = self.client.pipeline(transaction=False)
        for workflow_id in workflow_ids:
            pipe.hmget(self.keys.workflow(workflow_id), SUMMARY_FIELDS)
        return [dict(zip(SUMMARY_FIELDS, values, strict=True)) for values in pipe.execute()]

    @translate_errors
    def workflow_record(self, workflow_id: str) -> dict[str, bytes]:
        """Return a workflow's whole record, its graph included ({} when none is stored)."""
        return {field.decode(): value for field, value in self.client.hgetall(self.keys.workflow(workflow_id)).items()}

    @translate_errors
    def workflow_task_segments(self, task_ids: Sequence[str]) -> list[str | None]:
        """Return each task's segment name, None for a task no longer stored (its result expired)."""
        pipe = self.client.pipeline(transaction=False)
        for task_id in task_ids:
            pipe.hget(self.keys.task(task_id), "segment")
        return [None if segment is None else segment.decode() for segment in pipe.execute()]

    @translate_errors
    def task_workflow(self, task_id: str) -> tuple[str, str] | None:
        """Return (workflow id, node name) of a workflow's task, None for a task of no workflow."""
        workflow_id, node = self.client.hmget(self.task_keys(task_id).task(task_id), ["workflow", "node"])
        return None if workflow_id is None else (workflow_id.decode(), (node or b"").decode())
