"""Workflows for the console and the command line: the list newest first, one workflow's graph by layers,
its state node by node, a task's relatives, and the cancel and retry of a whole one.

Everything is read from the workflow records (`threadmill.backends.workflows`), each in the partition
its workflow's id names, a list merging the partitions' indexes newest first: a list row reads
its record's counts, never its graph; a workflow's page parses the graph and reads the states
of at most `GRAPH_PAGE` of its tasks, so a 10,000-task workflow costs what a 200-task one does.
The record counts WAITING, SUCCESSFUL and FAILED; the rest are READY or RUNNING (acquire does
not count, for the cost of a plain task), which the states of the drawn tasks split.
`workflow_detail` (the command line's) reads every task instead. A node's state there is its
task's segment (WAITING, READY, DEFERRED, RUNNING, SUCCESSFUL, FAILED, or UNREADABLE), finer
than Django's status, which reads a waiting task as READY. The cancel and the retry are the
backend's (`cancel_workflow`, `retry_workflow`): bounded script calls, each leaving the
workflow consistent, so a call cut short is finished by calling again.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from django.tasks.exceptions import TaskResultDoesNotExist

from ..workflows import full_graph, parents_first
from .queues import get_backend

#: The states a workflow list filters by: finished is successful or failed.
WORKFLOW_STATES = ("running", "finished", "successful", "failed")
#: Most workflows a filtered list reads, newest first; past it, its count is a lower bound.
WORKFLOW_SCAN_LIMIT = 10_000
#: Workflow records one round trip of a filtered list reads.
SCAN_BATCH = 500
#: Most tasks a workflow's page draws, and so reads the states of; a bigger graph is paged.
GRAPH_PAGE = 200
#: Most parents, and most children, a task's page lists with their states.
RELATIVES_SHOWN = 50
#: A task's state by its segment; a task no longer stored (its result expired) is EXPIRED.
STATE_OF_SEGMENT = {
    "waiting": "WAITING", "ready": "READY", "deferred": "DEFERRED", "running": "RUNNING",
    "successful": "SUCCESSFUL", "failed": "FAILED", "unreadable": "UNREADABLE",
}  # fmt: skip


def _moment(value: bytes | None) -> datetime | None:
    return None if value is None else datetime.fromtimestamp(float(value), UTC)


@dataclass(frozen=True, slots=True)
class WorkflowSummary:
    """One workflow as its record counts it: name, times, tasks in all and per counted state."""

    id: str
    name: str
    created_at: datetime | None
    finished_at: datetime | None
    total: int
    waiting: int
    successful: int
    failed: int

    @classmethod
    def of(cls, workflow_id: str, fields: dict) -> WorkflowSummary:
        """Return the summary of a record's fields (bytes or None each)."""
        count = {k: int(fields.get(k) or 0) for k in ("total", "waiting", "successful", "failed")}
        name = (fields.get("name") or b"").decode()
        return cls(workflow_id, name, _moment(fields.get("created_at")), _moment(fields.get("finished_at")), **count)

    @property
    def expired(self) -> bool:
        """Whether the record is gone (it expires with its tasks' results) though the index still names it."""
        return self.created_at is None

    @property
    def active(self) -> int:
        """Tasks READY or RUNNING: neither waiting nor final."""
        return max(0, self.total - self.waiting - self.successful - self.failed)

    @property
    def state(self) -> str:
        """Return "successful" or "failed" once every task is final, "running" before, "expired" for a record gone."""
        if self.expired:
            return "expired"
        if self.successful + self.failed < self.total:
            return "running"
        return "failed" if self.failed else "successful"

    def is_in(self, state: str) -> bool:
        """Return whether this workflow is in a list filter's state (one of `WORKFLOW_STATES`)."""
        return self.state == state or (state == "finished" and self.state in ("successful", "failed"))


@dataclass(frozen=True, slots=True)
class WorkflowList:
    """One page of workflows, newest first, and how many match (a lower bound unless `complete`)."""

    rows: list[WorkflowSummary]
    total: int
    complete: bool


def workflows(alias: str, *, state: str = "", first: int = 0, count: int = 50) -> WorkflowList:
    """Return `count` workflows from rank `first`, newest first, those in `state` only when it is given.

    Unfiltered: two round trips. Filtered: one for the newest `WORKFLOW_SCAN_LIMIT` ids, then one per
    `SCAN_BATCH` records. With several partitions the partitions' indexes are merged by enqueue time.
    Raises ValueError naming the states for an unknown one.
    """
    if state and state not in WORKFLOW_STATES:
        raise ValueError(f"A workflow's state is one of {', '.join(WORKFLOW_STATES)}, not {state[:20]!r}.")
    backend = get_backend(alias)
    if not state:
        total, found = backend.workflow_ids(first, count)
        return WorkflowList(_summaries(backend, [workflow_id for workflow_id, _ in found]), total, True)
    total, found = backend.workflow_ids(0, WORKFLOW_SCAN_LIMIT)
    ids = [workflow_id for workflow_id, _ in found]
    matching: list[WorkflowSummary] = []
    for start in range(0, len(ids), SCAN_BATCH):
        matching += [s for s in _summaries(backend, ids[start : start + SCAN_BATCH]) if s.is_in(state)]
    return WorkflowList(matching[first : first + count], len(matching), total <= WORKFLOW_SCAN_LIMIT)


def workflow_summary(alias: str, workflow_id: str) -> WorkflowSummary:
    """Return one workflow's counts as its record keeps them; one HMGET (`expired` for a record gone)."""
    return _summaries(get_backend(alias), [workflow_id])[0]


def _summaries(backend, workflow_ids: list[str]) -> list[WorkflowSummary]:
    found = backend.workflow_summaries(workflow_ids) if workflow_ids else []
    return [WorkflowSummary.of(workflow_id, fields) for workflow_id, fields in zip(workflow_ids, found, strict=True)]


@dataclass(frozen=True, slots=True)
class WorkflowTask:
    """One task of a workflow as its page draws it: node name, task id, depth, parents' names and state."""

    name: str
    id: str
    depth: int
    parents: tuple[str, ...]
    state: str


@dataclass(frozen=True, slots=True)
class WorkflowGraph:
    """One page of a workflow's graph: its summary, the drawn tasks by layer, and every layer's size."""

    summary: WorkflowSummary
    layers: list[tuple[int, list[WorkflowTask]]]
    layer_sizes: list[tuple[int, int]]
    page: int
    pages: int
    shown_from: int
    shown_to: int
    states: dict[str, int]


def graph_nodes(record: dict[str, bytes]) -> list[tuple[str, str, tuple[str, ...], int]]:
    """Return (name, task id, parents' names, depth) of each node of a stored record's graph, in enqueue order.

    The parents a task gained at run time (`add(before=)`) are among its parents. A node's depth
    is its longest path from a root, found walking the nodes parents first (`parents_first`).
    """
    entries = full_graph(json.loads(record["graph"]), record)
    depth: dict[str, int] = {}
    for name, _, parents in parents_first(entries):
        depth[name] = 1 + max(map(depth.__getitem__, parents)) if parents else 0  # map: 3x a generator at 10,000
    return [(name, task_id, parents, depth[name]) for name, task_id, parents in entries]


def workflow(alias: str, workflow_id: str, *, page: int = 1) -> WorkflowGraph:
    """Return one page (`GRAPH_PAGE` tasks, by depth) of a workflow's graph with those tasks' states; two round trips.

    A page past the last is the last. Raises TaskResultDoesNotExist for a workflow not stored.
    """
    backend = get_backend(alias)
    record = backend.workflow_record(workflow_id)
    if "graph" not in record:
        raise TaskResultDoesNotExist(f"No workflow with id {workflow_id!r} is stored.")
    nodes = sorted(graph_nodes(record), key=lambda node: node[3])  # stable: enqueue order within a layer
    pages = max(1, -(-len(nodes) // GRAPH_PAGE))
    page = min(max(1, page), pages)
    shown = nodes[(page - 1) * GRAPH_PAGE : page * GRAPH_PAGE]
    segments = backend.workflow_task_segments([task_id for _, task_id, _, _ in shown])
    layers: dict[int, list[WorkflowTask]] = {}
    states: dict[str, int] = {}
    for (name, task_id, parents, depth), segment in zip(shown, segments, strict=True):
        state = STATE_OF_SEGMENT.get(segment or "", "EXPIRED")
        states[state] = states.get(state, 0) + 1
        layers.setdefault(depth, []).append(WorkflowTask(name, task_id, depth, parents, state))
    sizes: dict[int, int] = {}
    for node in nodes:
        sizes[node[3]] = sizes.get(node[3], 0) + 1
    start = (page - 1) * GRAPH_PAGE
    summary = WorkflowSummary.of(workflow_id, record)
    return WorkflowGraph(
        summary, sorted(layers.items()), sorted(sizes.items()), page, pages, start + 1, start + len(shown), states
    )


@dataclass(frozen=True, slots=True)
class TaskRelatives:
    """A workflow task's place in it: the workflow, its node name, and its parents and children with their states."""

    workflow_id: str
    workflow_name: str
    node: str
    parents: list[WorkflowTask]
    children: list[WorkflowTask]
    more_parents: int
    more_children: int
    #: Whether the workflow's record is gone (it expires with its results): then no relative is known.
    expired: bool = False


def task_workflow(alias: str, task_id: str) -> TaskRelatives | None:
    """Return a task's workflow and relatives (at most `RELATIVES_SHOWN` of each), None for a task of no workflow."""
    backend = get_backend(alias)
    found = backend.task_workflow(task_id)
    if found is None:
        return None
    workflow_id, node = found
    record = backend.workflow_record(workflow_id)
    nodes = graph_nodes(record) if "graph" in record else []
    by_name = {n[0]: n for n in nodes}
    parents = [by_name[p] for p in by_name[node][2]] if node in by_name else []
    children = [n for n in nodes if node in n[2]]
    shown = parents[:RELATIVES_SHOWN] + children[:RELATIVES_SHOWN]
    states = backend.workflow_task_segments([n[1] for n in shown]) if shown else []
    drawn = [
        WorkflowTask(name, tid, depth, ps, STATE_OF_SEGMENT.get(segment or "", "EXPIRED"))
        for (name, tid, ps, depth), segment in zip(shown, states, strict=True)
    ]
    cut = min(len(parents), RELATIVES_SHOWN)
    more = (max(0, len(parents) - RELATIVES_SHOWN), max(0, len(children) - RELATIVES_SHOWN))
    name = (record.get("name") or b"").decode()
    return TaskRelatives(workflow_id, name, node, drawn[:cut], drawn[cut:], *more, expired="graph" not in record)


def find_workflow(aliases: Sequence[str], workflow_id: str) -> str | None:
    """Return the first of `aliases` whose backend stores the workflow `workflow_id`, or None."""
    for alias in aliases:
        if get_backend(alias).workflow_summaries([workflow_id])[0]["created_at"] is not None:
            return alias
    return None


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
