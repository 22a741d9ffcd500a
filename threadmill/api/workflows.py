"""Workflows for the console and the command line: one workflow's state node by node, and the cancel and
retry of a whole one.

A node's state is its task's segment (WAITING, READY, DEFERRED, RUNNING, SUCCESSFUL, FAILED, or
UNREADABLE), finer than Django's status, which reads a waiting task as READY. The cancel and the
retry are the backend's (`cancel_workflow`, `retry_workflow`): bounded script calls, each leaving
the workflow consistent, so a call cut short is finished by calling again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .queues import get_backend


@dataclass(frozen=True, slots=True)
class WorkflowNodeState:
    """One node of a workflow: its name, task id, queue, state, parent nodes and the class path of its last error."""

    name: str
    task_id: str
    queue_name: str
    state: str
    parents: tuple[str, ...]
    error: str

    def as_json(self) -> dict[str, Any]:
        """Return this node as the JSON object `threadmill workflow show --json` prints."""
        return {
            "name": self.name,
            "task_id": self.task_id,
            "queue": self.queue_name,
            "state": self.state,
            "parents": list(self.parents),
            "error": self.error or None,
        }


@dataclass(frozen=True, slots=True)
class WorkflowDetail:
    """A workflow as last read: its id, name, status, counts per state and its nodes in enqueue order."""

    id: str
    name: str
    backend: str
    status: str
    counts: dict[str, int]
    nodes: tuple[WorkflowNodeState, ...]

    def as_json(self) -> dict[str, Any]:
        """Return this workflow as the JSON document `threadmill workflow show --json` prints (stable keys)."""
        return {
            "id": self.id,
            "name": self.name,
            "backend": self.backend,
            "status": self.status,
            "counts": dict(self.counts),
            "nodes": [node.as_json() for node in self.nodes],
        }


def workflow_detail(alias: str, workflow_id: str) -> WorkflowDetail:
    """Return a workflow's state node by node; raise TaskResultDoesNotExist for an unknown id."""
    result, parents = get_backend(alias).workflow_with_parents(workflow_id)
    nodes = tuple(
        WorkflowNodeState(
            name,
            task.id,
            task.task.queue_name,
            _state(task),
            tuple(parents.get(name, ())),
            task.errors[-1].exception_class_path if task.errors else "",
        )
        for name, task in result.tasks.items()
    )
    return WorkflowDetail(result.id, result.name, alias, result.status.name, dict(result.counts), nodes)


def _state(task: Any) -> str:
    """Return a node's state: its task's segment, or its status where no segment was read."""
    return task.segment.value.upper() if getattr(task, "segment", None) else task.status.name


def cancel_workflow(alias: str, workflow_id: str, *, by: str) -> int:
    """Cancel every task of a workflow that has not run and ask each running one to abort; return how many."""
    return get_backend(alias).cancel_workflow(workflow_id, by=by)


def retry_workflow(alias: str, workflow_id: str) -> int:
    """Run a workflow's failed tasks again, and those failed because of them; return how many were made ready or waiting."""
    return get_backend(alias).retry_workflow(workflow_id)
