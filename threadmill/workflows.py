"""Workflows: graphs of ordinary tasks, where a task waits until its parents are final.

A `Workflow` is built in memory (`add`, each node naming its parents with `after=`) and stored
by `enqueue` in one script call, all or nothing. A task with parents waits in its queue's
*waiting* segment (READY to Django) until the script that records its last parent's final
outcome releases it; a failed parent fails a child whose policy is "cancel" with `UpstreamFailed`,
and runs one whose policy is "run". docs/explanation/workflows.md gives the keys and the reasons.

Invariants checked here, before anything is stored: at least one task and at most `MAX_TASKS`,
at most `MAX_EDGES` dependencies, every parent a node of this workflow added earlier (so the
graph has no cycle), every task one of this workflow's backend. This module is on the ground
floor: it reaches the server only through the backend object (`enqueue_workflow`, `get_workflow`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from django.tasks import DEFAULT_TASK_BACKEND_ALIAS, TaskResult, TaskResultStatus, task_backends

from .exceptions import WorkflowError

#: Most tasks one workflow holds: its enqueue is one script call, and a cascade settles at most this many.
MAX_TASKS = 10_000
#: Most dependencies (parent -> child edges) one workflow holds; a fan-in of MAX_TASKS - 1 fits.
MAX_EDGES = 100_000
#: The failure policies a dependency can have.
POLICIES = ("cancel", "run")
#: The keys of `WorkflowResult.counts`, Django's four statuses and WAITING.
COUNT_KEYS = ("WAITING", "READY", "RUNNING", "SUCCESSFUL", "FAILED")
#: The start of a record's field naming (comma-separated ids) the parents a task gained at run time
#: (`add(before=)`); the task's id follows.
ADDED_PARENTS = "added_parents:"


@dataclass(frozen=True, slots=True, eq=False)
class WorkflowNode:
    """One task of a workflow: its node `name`, the `id` its task will have, its call and its parents."""

    workflow: Workflow
    name: str
    id: str
    task: Any
    args: tuple
    kwargs: dict
    parents: tuple[WorkflowNode, ...]
    on_parent_failure: str


class Workflow:
    """A graph of tasks of one backend, enqueued together; a task runs once its parents are final."""

    def __init__(self, name: str = "", backend: str = DEFAULT_TASK_BACKEND_ALIAS) -> None:
        self.name = name
        self.backend = backend
        self.nodes: list[WorkflowNode] = []
        self._names: set[str] = set()
        self._uses: Counter[str] = Counter()

    def add(
        self,
        task: Any,
        args: Sequence[Any] = (),
        kwargs: dict[str, Any] | None = None,
        *,
        after: Iterable[WorkflowNode] = (),
        name: str | None = None,
        on_parent_failure: str = "cancel",
    ) -> WorkflowNode:
        """Add a call of `task` that runs once every node of `after` is final; return its node.

        Raises WorkflowError for a parent that is not a node of this workflow, a taken name,
        an unknown policy or a workflow already at `MAX_TASKS`.
        """
        parents = tuple(after)
        for parent in parents:
            if not isinstance(parent, WorkflowNode) or parent.workflow is not self:
                raise WorkflowError(f"after= names {parent!r}, which is not a node of this workflow.")
        if on_parent_failure not in POLICIES:
            raise WorkflowError(f"on_parent_failure must be one of {POLICIES}, not {on_parent_failure!r}.")
        if len(self.nodes) >= MAX_TASKS:
            raise WorkflowError(f"A workflow holds at most {MAX_TASKS} tasks.")
        node = WorkflowNode(
            self,
            self._name_for(task, name),
            # Every node's id names the partition of the first's, where the whole workflow is stored.
            self._backend().new_task_id(self.nodes[0].id if self.nodes else None),
            task,
            tuple(args),
            dict(kwargs or {}),
            tuple(dict.fromkeys(parents)),
            on_parent_failure,
        )
        self.nodes.append(node)
        return node

    def _name_for(self, task: Any, name: str | None) -> str:
        if name is None:
            base = getattr(getattr(task, "func", None), "__name__", "task")
            self._uses[base] += 1
            name = base if self._uses[base] == 1 else f"{base}_{self._uses[base]}"
        if not isinstance(name, str) or not name or name in self._names:
            raise WorkflowError(f"A node name must be a non-empty text not used in this workflow, not {name!r}.")
        self._names.add(name)
        return name

    def _backend(self) -> Any:
        backend = task_backends[self.backend]
        if not hasattr(backend, "enqueue_workflow"):
            raise WorkflowError(f"Backend {self.backend!r} does not run workflows (it is not a Threadmill backend).")
        return backend

    def check(self) -> None:
        """Raise WorkflowError naming the first reason this workflow cannot be enqueued as it is."""
        if not self.nodes:
            raise WorkflowError("A workflow needs at least one task; this one has none.")
        edges = sum(len(node.parents) for node in self.nodes)
        if edges > MAX_EDGES:
            raise WorkflowError(f"A workflow holds at most {MAX_EDGES} dependencies; this one has {edges}.")
        for node in self.nodes:
            if getattr(node.task, "backend", None) != self.backend:
                raise WorkflowError(
                    f"Node {node.name!r} is a task of backend {node.task.backend!r}, not of this "
                    f"workflow's backend {self.backend!r}."
                )

    def enqueue(self) -> WorkflowResult:
        """Store every task of this workflow in one call, all or nothing, and return its result.

        Raises WorkflowError (nothing stored) for a bad graph, and Django's InvalidTask for a bad task.
        """
        self.check()
        return self._backend().enqueue_workflow(self)

    async def aenqueue(self) -> WorkflowResult:
        """`enqueue` from async code (in a thread)."""
        from asgiref.sync import sync_to_async

        return await sync_to_async(self.enqueue)()


@dataclass(slots=True)
class WorkflowResult:
    """A workflow's state as last read: its `status`, `counts` per state and each node's task result."""

    id: str
    name: str
    backend: str
    status: TaskResultStatus
    counts: dict[str, int]
    tasks: dict[str, TaskResult] = field(default_factory=dict)
    #: Each node's parent nodes, those a running task added (`add(before=)`) included.
    parents: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def refresh(self) -> None:
        """Read this workflow again from its backend."""
        self._take(self._read())

    async def arefresh(self) -> None:
        """`refresh` from async code (in a thread)."""
        from asgiref.sync import sync_to_async

        self._take(await sync_to_async(self._read)())

    def _read(self) -> WorkflowResult:
        backend: Any = task_backends[self.backend]
        return backend.get_workflow(self.id)

    def _take(self, other: WorkflowResult) -> None:
        self.name, self.status, self.counts, self.tasks = other.name, other.status, other.counts, other.tasks
        self.parents = other.parents


def full_graph(graph: Sequence[Sequence[Any]], record: Mapping[Any, bytes]) -> list[tuple[str, str, tuple[str, ...]]]:
    """Return a stored graph's (node, task id, parent nodes), each with the parents it gained at run time.

    `graph` is the record's decoded `graph`; `record` its fields (names as text or bytes), where
    `ADDED_PARENTS` fields hold the runtime edges. A task added at run time comes after the nodes
    that wait for it, so in this list a parent may follow its child.
    """
    added: dict[str, list[str]] = {}
    for key, value in record.items():
        name = key.decode() if isinstance(key, bytes) else key
        if name.startswith(ADDED_PARENTS):
            added[name.removeprefix(ADDED_PARENTS)] = value.decode().split(",")
    if not added:
        return [(node, task_id, tuple(parents)) for node, task_id, parents in graph]
    name_of = {task_id: node for node, task_id, _ in graph}
    return [
        (node, task_id, (*parents, *(name_of[i] for i in added.get(task_id, ()) if i in name_of)))
        for node, task_id, parents in graph
    ]


def status_of(counts: dict[str, int]) -> TaskResultStatus:
    """Return a workflow's status from its counts: READY until a task started, then RUNNING until every task is final."""
    total = sum(counts.values())
    if counts["SUCCESSFUL"] == total:
        return TaskResultStatus.SUCCESSFUL
    if counts["SUCCESSFUL"] + counts["FAILED"] == total:
        return TaskResultStatus.FAILED
    if counts["RUNNING"] or counts["SUCCESSFUL"] or counts["FAILED"]:
        return TaskResultStatus.RUNNING
    return TaskResultStatus.READY


def parents_first(entries: Sequence[tuple[str, str, tuple[str, ...]]]) -> list[tuple[str, str, tuple[str, ...]]]:
    """Return (node, task id, parent nodes) entries ordered so that every node comes after its parents.

    The enqueued graph is in that order already and keeps it; a task added at run time comes after
    the nodes that wait for it (`full_graph`), so each pass places what it can, one pass more per
    level of runtime edges.
    """
    placed: set[str] = set()
    ordered: list[tuple[str, str, tuple[str, ...]]] = []
    left = list(entries)
    while left:
        later = []
        for entry in left:
            if placed.issuperset(entry[2]):
                placed.add(entry[0])
                ordered.append(entry)
            else:
                later.append(entry)
        if len(later) == len(left):
            return ordered + later  # a cycle, which no script writes
        left = later
    return ordered
