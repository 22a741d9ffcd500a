"""What a running workflow task knows of its workflow: `current_workflow()`, its parents' results, `add` at run time.

Nothing is read until a task calls `current_workflow()`: a task that never calls it costs the
worker nothing (the consumer already keeps the running task's result, whose id and backend
alias are all this needs). The first call reads the task's `workflow` and `node` fields (one
HMGET), then the workflow's record, and is cached for the rest of the run on the consumer
thread. `.parents` reads every parent's stored result in one pipeline, on first use: results
are read by reference, never copied into a child's arguments, so a fan-in of 10,000 builds no
10,000-element task document.

`add` stores one task in one script call (add_to_workflow.lua), all or nothing. The new task's
parent is the caller; each node named in `before` (waiting, a child of the caller) waits for
the new task too. Exact because the caller is running while it adds: the outcome that releases
its children cannot have been recorded yet. This module is on the ground floor: it reaches the
server only through the backend object (`running_workflow`, `workflow_results`, `add_to_workflow`).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from django.tasks import TaskResult, task_backends

from .exceptions import WorkflowError
from .progress import running
from .workflows import MAX_EDGES, MAX_TASKS, POLICIES

#: Most default names `add` tries when tasks adding at once take the one it chose.
NAME_TRIES = 100
#: The start of a record's field listing (comma-separated, in order) the ids of the tasks a task added
#: without a name; the adding task's id follows. A retried task's n-th unnamed add returns the n-th.
UNNAMED_ADDED = "unnamed_added:"


@dataclass(frozen=True, slots=True)
class AddedNode:
    """A task added at run time: its node `name` and the `id` of its task."""

    name: str
    id: str


class ParentResults(Mapping[str, TaskResult]):
    """Parents' task results by node name, read already in one round trip; each decoded when first looked up.

    Decoding was about 60% of a 10,000-parent read (0.6-0.8 s of 1.1-1.5 s): a join that looks
    at a few parents, or only counts them, does not pay for the rest.
    """

    def __init__(self, stored: dict[str, Any], decode: Callable[[Any], TaskResult]) -> None:
        self._stored = stored
        self._decode = decode
        self._decoded: dict[str, TaskResult] = {}

    def __getitem__(self, node: str) -> TaskResult:
        result = self._decoded.get(node)
        if result is None:
            result = self._decoded[node] = self._decode(self._stored[node])
        return result

    def __iter__(self) -> Iterator[str]:
        return iter(self._stored)

    def __len__(self) -> int:
        return len(self._stored)


@dataclass(slots=True)
class StoredWorkflow:
    """What the running task's first `current_workflow()` read: its workflow, its node and the graph's ids."""

    id: str
    name: str
    node: str
    #: Every node of the graph as read: node name -> task id.
    ids: dict[str, str]
    #: This node's parents, declared at enqueue and added at run time: node name -> task id.
    parents: dict[str, str]
    #: The dependencies of the graph as read (its `before` edges added at run time not among them).
    edges: int = 0
    #: The ids of the tasks earlier attempts of this task added without a name, in the order added.
    unnamed: list[str] = field(default_factory=list)


class RunningWorkflow:
    """The workflow of the task running on this thread: its `id`, `name`, this task's `node` and `parents`."""

    def __init__(self, backend: Any, running: Any, stored: StoredWorkflow) -> None:
        """Wrap `stored`, the workflow of `running`, the leased task result of the task that runs now."""
        self._backend = backend
        self._task_id = running.id
        self._lease_token = running.lease_token
        self._stored = stored
        self._parents: Mapping[str, TaskResult] | None = None
        #: The nodes this run added: a name among them is taken, one an earlier attempt added is returned.
        self._added: set[str] = set()
        #: The unnamed adds of this run so far: the next one is an earlier attempt's at this place, if any.
        self._unnamed = 0
        #: The node names of the earlier attempts' unnamed adds by task id, read on this run's first one.
        self._earlier_names: dict[str, str] | None = None

    def __repr__(self) -> str:
        return f"<RunningWorkflow {self.id} {self.name!r}, node {self.node!r}>"

    @property
    def id(self) -> str:
        return self._stored.id

    @property
    def name(self) -> str:
        return self._stored.name

    @property
    def node(self) -> str:
        return self._stored.node

    @property
    def parents(self) -> Mapping[str, TaskResult]:
        """Each parent's task result by node name, final; read in one round trip on first use (`ParentResults`).

        A parent whose result expired (`result_ttl`) or that was quarantined (unreadable) is left out.
        """
        if self._parents is None:
            self._parents = self._backend.workflow_results(self._stored.parents)
        return self._parents

    async def aparents(self) -> Mapping[str, TaskResult]:
        """`parents` from async code (the read in a thread, so the task's event loop runs on)."""
        from asgiref.sync import sync_to_async

        return await sync_to_async(lambda: self.parents, thread_sensitive=False)()

    def add(
        self,
        task: Any,
        args: Sequence[Any] = (),
        kwargs: dict[str, Any] | None = None,
        *,
        before: str | Iterable[Any] = (),
        name: str | None = None,
        on_parent_failure: str = "cancel",
    ) -> AddedNode:
        """Add a call of `task` that runs after this task, and that each node of `before` waits for; return its node.

        `before` holds node names, or nodes `add` or `Workflow.add` returned (one name alone
        is one node). A `name` an earlier attempt of this task added returns that node and
        stores nothing, and so does the n-th unnamed add of a run when an earlier attempt made an
        n-th (whatever its task), so a retried task adds each of its additions once. One script
        call, all or nothing. Raises WorkflowError, storing nothing, for a `before`
        node that does not exist, has started or is not a child of this task, a taken name, an
        unknown policy, a workflow at `MAX_TASKS` or one the new edges would take past `MAX_EDGES`,
        or a task this workflow cannot hold.
        """
        if on_parent_failure not in POLICIES:
            raise WorkflowError(f"on_parent_failure must be one of {POLICIES}, not {on_parent_failure!r}.")
        if name is not None and (not isinstance(name, str) or not name):
            raise WorkflowError(f"A node name must be a non-empty text, not {name!r}.")
        if name is not None and (earlier := self._added_earlier(name)) is not None:
            return earlier
        if name is None and (earlier := self._unnamed_earlier()) is not None:
            return earlier
        targets = list(dict.fromkeys(self._before(node) for node in ([before] if isinstance(before, str) else before)))
        names = [name] if name is not None else self._default_names(task)
        for node_name in names:
            node = AddedNode(node_name, self._backend.new_task_id(self._stored.id))
            caller = (self._task_id, self._lease_token)
            code, at = self._backend.add_to_workflow(
                self._stored, caller, node, task, args, kwargs or {}, targets, on_parent_failure, name is None
            )
            if code == 1:
                self._stored.ids[node.name] = node.id
                self._added.add(node.name)
                if name is None:
                    self._unnamed += 1
                return node
            # A default name another task took since this one read the graph: try the next number.
            if code != -3 or name is not None:
                raise WorkflowError(refusal(code, targets[at - 1][0] if at else "", node.name))
        raise WorkflowError(f"No free default node name for {names[0]!r} after {NAME_TRIES} tries.")

    async def aadd(self, task: Any, args: Sequence[Any] = (), kwargs: dict[str, Any] | None = None, **options: Any):
        """`add` from async code (the call in a thread, so the task's event loop runs on)."""
        from asgiref.sync import sync_to_async

        return await sync_to_async(self.add, thread_sensitive=False)(task, args, kwargs, **options)

    def _added_earlier(self, name: str) -> AddedNode | None:
        """Return node `name` when an earlier attempt of this task added it (a retry adds it once), else None."""
        task_id = self._stored.ids.get(name)
        if task_id is None or name in self._added or self._backend.added_by(task_id) != self._task_id:
            return None
        self._added.add(name)
        return AddedNode(name, task_id)

    def _unnamed_earlier(self) -> AddedNode | None:
        """Return the node an earlier attempt's unnamed add at this run's next place stored, else None."""
        if self._unnamed >= len(self._stored.unnamed):
            return None
        if self._earlier_names is None:  # once a run: a retried fan-out of n finds each of its n in O(1)
            earlier = set(self._stored.unnamed)
            self._earlier_names = {i: node for node, i in self._stored.ids.items() if i in earlier}
        task_id = self._stored.unnamed[self._unnamed]
        name = self._earlier_names.get(task_id)
        if name is None:
            return None
        self._unnamed += 1
        self._added.add(name)
        return AddedNode(name, task_id)

    def _before(self, node: Any) -> tuple[str, str]:
        """Return the (name, id) of a node named in `before`: a name, or a node `add` or `Workflow.add` returned."""
        node_name = node if isinstance(node, str) else getattr(node, "name", None)
        task_id = self._stored.ids.get(node_name) if isinstance(node_name, str) else None
        if not isinstance(node_name, str) or task_id is None or task_id != getattr(node, "id", task_id):
            raise WorkflowError(f"before= names {node!r}, which is not a node of workflow {self.id}.")
        return node_name, task_id

    def _default_names(self, task: Any) -> list[str]:
        base = getattr(getattr(task, "func", None), "__name__", "task")
        candidates = (base if n == 1 else f"{base}_{n}" for n in itertools.count(1))
        return list(itertools.islice((n for n in candidates if n not in self._stored.ids), NAME_TRIES))


def refusal(code: int, before: str, name: str) -> str:
    """Return the message for add_to_workflow.lua's refusal `code` (`before`: the node it names, if any)."""
    messages = {
        0: "The workflow is no longer stored (it finished and expired).",
        -1: f"A workflow holds at most {MAX_TASKS} tasks; this one is full.",
        -2: "Only a running task of this workflow can add to it, and this task is no longer running (under this lease).",
        -3: f"The node name {name!r} is taken in this workflow.",
        -4: "The new task's id is taken by a stored task.",
        -5: f"before= names {before!r}, which is not a task of this workflow.",
        -6: f"before= names {before!r}, which has started or is final: only a waiting task can wait for more.",
        -7: f"before= names {before!r}, which is not a child of this task: it may not wait for this task's additions.",
        -8: f"A workflow holds at most {MAX_EDGES} dependencies; node {name!r} and its before= edges would pass it.",
    }
    return messages.get(code, f"add_to_workflow refused the task (code {code}).") + " Nothing was stored."


@dataclass(slots=True)
class _Cached:
    result: Any = None
    workflow: RunningWorkflow | None = field(default=None)


def current_workflow() -> RunningWorkflow | None:
    """Return the workflow of the task running on this thread, None outside a workflow task run by a worker.

    The first call in a run reads two small records (two round trips); later calls return the same object.
    """
    bound = getattr(running, "task", None)
    if bound is None:
        return None
    cached: _Cached | None = getattr(running, "workflow", None)
    if cached is None or cached.result is not bound[1]:
        cached = running.workflow = _Cached(bound[1], _read(bound[1]))
    return cached.workflow


async def acurrent_workflow() -> RunningWorkflow | None:
    """`current_workflow` from an `async def` task: its first reads in a thread, so the task's event loop runs on."""
    from asgiref.sync import sync_to_async

    bound = getattr(running, "task", None)
    if bound is None:
        return None
    cached: _Cached | None = getattr(running, "workflow", None)
    if cached is None or cached.result is not bound[1]:
        workflow = await sync_to_async(_read, thread_sensitive=False)(bound[1])
        cached = running.workflow = _Cached(bound[1], workflow)
    return cached.workflow


def _read(result: Any) -> RunningWorkflow | None:
    backend = task_backends[result.backend]
    stored = backend.running_workflow(result.id) if hasattr(backend, "running_workflow") else None
    return None if stored is None else RunningWorkflow(backend, result, stored)
