"""The backend half of workflows (`threadmill.workflows`): their enqueue script's wrapper, the enqueue and the read.

A workflow lives in partition 0's keys (one hash tag, so one slot of a cluster): its record,
its tasks' hashes, their pending and children sets and the queues' waiting segments. The
release is in acknowledge.lua (`lua/lib/workflow.lua`); docs/explanation/workflows.md has the design.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from django.tasks import TaskResult, TaskResultStatus
from django.tasks.base import TaskError
from django.tasks.exceptions import TaskResultDoesNotExist
from django.utils.json import normalize_json

from ..base import Segment, ThreadmillTaskResult
from ..exceptions import WorkflowError
from ..running_workflow import ParentResults, StoredWorkflow
from ..workflows import COUNT_KEYS, MAX_TASKS, WorkflowResult, status_of
from . import codec
from .errors import translate_errors
from .keys import PRIORITY_BAND, TASK_FIELDS
from .script_source import LuaScript, ScriptHost, script_source

if TYPE_CHECKING:
    from ..running_workflow import AddedNode
    from ..workflows import Workflow, WorkflowNode

#: The class path of the error a task failed because of its parent records.
UPSTREAM_FAILED = "threadmill.exceptions.UpstreamFailed"
#: Most task hashes one pipeline of `get_workflow` reads.
READ_BATCH = 1000
_enqueue_workflow = LuaScript(script_source("enqueue_workflow"))
_sweep_waiting = LuaScript(script_source("sweep_waiting"))
_add_to_workflow = LuaScript(script_source("add_to_workflow"))


class WorkflowScripts(ScriptHost):
    """The enqueue_workflow script's wrapper (a base class of `scripts.RedisScripts`)."""

    @translate_errors
    def enqueue_workflow(self, workflow_id: str, name: str, graph: str, entries: Sequence[tuple]) -> int:
        """Store (id, payload, queue, segment, ready score, score, node, parent indices, policy) entries as one workflow.

        Parent indices count from 1 in `entries`. Returns the number stored, 0 when the workflow
        was stored already, -1 when a task id is taken (nothing stored then).
        """
        k = self.keys
        queues = list(dict.fromkeys(entry[2] for entry in entries))
        index = {queue: j for j, queue in enumerate(queues, 1)}
        keys = [k.queues(), k.workflow(workflow_id), k.workflows()]
        for queue in queues:
            keys += [k.wake(queue), k.totals(queue)]
        args: list[Any] = [workflow_id, name, graph, len(queues), *queues]
        for task_id, payload, queue, segment, ready_score, score, node, parents, policy in entries:
            keys += [
                k.task(task_id),
                k.segment(queue, segment),
                k.workflow_pending(task_id),
                k.workflow_children(task_id),
            ]
            parent_text = ",".join(str(p) for p in parents)
            args += [task_id, payload, index[queue], segment.value, ready_score, score, node, f"{parent_text}|{policy}"]
        return self._run(_enqueue_workflow, keys, args)

    @translate_errors
    def add_to_workflow(
        self, workflow_id: str, caller: tuple[str, str], entry: tuple, graph_entry: str, before: Sequence[str]
    ) -> tuple[int, int]:
        """Add an (id, payload, queue, ready score, node, policy) task to a workflow after running task `caller`.

        `caller` is (id, lease token): the caller must hold that lease.

        Each id of `before` waits for it too. Returns add_to_workflow.lua's (code, index): (1, 0) stored.
        """
        k = self.keys
        task_id, payload, queue, ready_score, node, policy = entry
        keys = [k.workflow(workflow_id), k.queues(), k.totals(queue), k.task(task_id)]
        keys += [k.segment(queue, Segment.WAITING), k.workflow_pending(task_id), k.workflow_children(task_id)]
        caller_id, lease_token = caller
        keys += [k.task(caller_id), k.workflow_children(caller_id)]
        for before_id in before:
            keys += [k.task(before_id), k.workflow_pending(before_id)]
        taken = "[" + json.dumps(node) + ', "'
        args = [workflow_id, caller_id, task_id, payload, queue, ready_score, node, policy, taken, graph_entry]
        args += [MAX_TASKS, lease_token]
        code, index = self._run(_add_to_workflow, keys, [*args, *before])
        return int(code), int(index)

    @translate_errors
    def sweep_waiting(self, queue_name: str, first: int, count: int, result_ttl: float) -> tuple[int, int]:
        """Settle the final, unsettled parents of `count` waiting tasks from rank `first`; return (settled, looked at)."""
        k = self.keys
        settled, looked = self._run(
            _sweep_waiting, [k.segment(queue_name, Segment.WAITING), k.task_prefix()], [first, count, int(result_ttl)]
        )
        return int(settled), int(looked)


class WorkflowBackend:
    """What `RedisTaskBackend` does for workflows: new ids, the enqueue and the read."""

    alias: str
    client: Any
    scripts: Any
    keys: Any

    if TYPE_CHECKING:

        @property
        def partition_count(self) -> int: ...

        def validate_task(self, task: Any) -> None: ...

        def stored_result(
            self, result_id: str, fields: list, old_layout_result: bytes | None
        ) -> ThreadmillTaskResult: ...

    def new_task_id(self) -> str:
        """Return a new task id for a workflow node (one partition: workflows live in partition 0)."""
        return codec.new_task_id(None)

    def enqueue_workflow(self, workflow: Workflow) -> WorkflowResult:
        """Store `workflow` (checked already) in one script call, all or nothing; return its result."""
        if self.partition_count > 1:
            raise WorkflowError("Workflows need one partition in this release; this backend has partitions > 1.")
        for node in workflow.nodes:
            self._check_node(node)
        now = time.time()
        index = {node.id: i for i, node in enumerate(workflow.nodes, 1)}
        entries = [self._entry(node, now, index) for node in workflow.nodes]
        graph = json.dumps([[n.name, n.id, [p.name for p in n.parents]] for n in workflow.nodes])
        workflow_id = codec.new_task_id(None)
        stored = self.scripts.enqueue_workflow(workflow_id, workflow.name, graph, entries)
        if stored == -1:
            raise WorkflowError("A task id of this workflow is taken by a stored task; nothing was stored.")
        return self.get_workflow(workflow_id)

    def _check_node(self, node: WorkflowNode) -> None:
        self._check_task(node.task, node.name, bool(node.parents))

    def _check_task(self, task: Any, node: str, has_parents: bool) -> None:
        self.validate_task(task)
        for option in ("unique", "concurrency", "rate"):
            if getattr(task, option, None):
                raise WorkflowError(f"Node {node!r}: a workflow task cannot have {option}= in this release.")
        if has_parents and task.run_after is not None:
            raise WorkflowError(f"Node {node!r}: a task with parents cannot have run_after in this release.")

    def _entry(self, node: WorkflowNode, now: float, index: dict[str, int]) -> tuple:
        task = node.task
        args, kwargs = normalize_json(list(node.args)), normalize_json(node.kwargs)
        payload = codec.encode_new(task, node.id, args, kwargs, now)
        ready_score = _ready_score(task, now)
        if node.parents:
            segment, score = Segment.WAITING, ready_score
        elif task.run_after is not None:
            segment, score = Segment.DEFERRED, repr(task.run_after.timestamp())
        else:
            segment, score = Segment.READY, ready_score
        parents = [index[p.id] for p in node.parents]
        return (
            node.id,
            payload,
            task.queue_name,
            segment,
            ready_score,
            score,
            node.name,
            parents,
            node.on_parent_failure,
        )

    @translate_errors
    def get_workflow(self, workflow_id: str) -> WorkflowResult:
        """Return a workflow's state: its record's counts and every task read, in one round trip per `READ_BATCH` tasks."""
        record = self.client.hgetall(self.keys.workflow(workflow_id))
        if not record:
            raise TaskResultDoesNotExist(f"No workflow with id {workflow_id!r} is stored.")
        nodes = json.loads(record[b"graph"])
        tasks: dict[str, Any] = {}
        for start in range(0, len(nodes), READ_BATCH):
            pipe = self.client.pipeline(transaction=False)
            for _, task_id, _ in nodes[start : start + READ_BATCH]:
                pipe.hmget(self.keys.task(task_id), TASK_FIELDS)
            for (name, task_id, _), fields in zip(nodes[start : start + READ_BATCH], pipe.execute(), strict=True):
                tasks[name] = self.stored_result(task_id, fields, None)
        counts = dict.fromkeys(COUNT_KEYS, 0)
        for key in ("WAITING", "SUCCESSFUL", "FAILED"):
            counts[key] = int(record.get(key.lower().encode(), 0))
        counts["RUNNING"] = sum(1 for t in tasks.values() if t.status == TaskResultStatus.RUNNING)
        counts["READY"] = len(nodes) - sum(counts.values())
        name = record.get(b"name", b"").decode()
        return WorkflowResult(workflow_id, name, self.alias, status_of(counts), counts, tasks)

    @translate_errors
    def running_workflow(self, task_id: str) -> StoredWorkflow | None:
        """Return the workflow of task `task_id` as stored, None when it is no workflow's task (two round trips).

        Raises WorkflowError when the task names a workflow that is no longer stored.
        """
        workflow_id, node = self.client.hmget(self.keys.task(task_id), ["workflow", "node"])
        if workflow_id is None:
            return None
        wid = workflow_id.decode()
        name, graph, added = self.client.hmget(self.keys.workflow(wid), ["name", "graph", f"added_parents:{task_id}"])
        if graph is None:
            raise WorkflowError(f"Workflow {wid} of task {task_id} is no longer stored.")
        entries = json.loads(graph)
        ids = {entry[0]: entry[1] for entry in entries}
        me = node.decode()
        parents = {parent: ids[parent] for entry in entries if entry[0] == me for parent in entry[2]}
        if added:
            by_id = {task_id: node_name for node_name, task_id in ids.items()}
            parents.update((by_id[added_id], added_id) for added_id in added.decode().split(","))
        return StoredWorkflow(wid, codec.text(name), me, ids, parents)

    @translate_errors
    def workflow_results(self, nodes: dict[str, str]) -> ParentResults:
        """Return the stored result of each (node name -> task id) of `nodes`, read in one round trip; gone ones left out."""
        pipe = self.client.pipeline(transaction=False)
        for task_id in nodes.values():
            pipe.hmget(self.keys.task(task_id), TASK_FIELDS)
        replies = pipe.execute() if nodes else []
        found = {name: (task_id, fields) for (name, task_id), fields in zip(nodes.items(), replies, strict=True)}
        return ParentResults({name: read for name, read in found.items() if read[1][0]}, self._parent_result)

    def _parent_result(self, read: tuple[str, list]) -> TaskResult:
        return self.stored_result(read[0], read[1], None)

    @translate_errors
    def added_by(self, task_id: str) -> str | None:
        """Return the id of the task that added task `task_id` at run time, None for one enqueued with its workflow."""
        return codec.text(self.client.hget(self.keys.task(task_id), "added_by")) or None

    def add_to_workflow(
        self,
        stored: StoredWorkflow,
        caller: tuple[str, str],
        node: AddedNode,
        task: Any,
        args: Sequence[Any],
        kwargs: dict[str, Any],
        before: Sequence[tuple[str, str]],
        policy: str,
    ) -> tuple[int, int]:
        """Store `node`, a call of `task` after running task `caller` (id, lease token), before each (name, id) of `before`.

        Returns add_to_workflow.lua's (code, index). Raises WorkflowError or InvalidTask for a task
        this workflow cannot hold, before anything is sent.
        """
        if getattr(task, "backend", None) != self.alias:
            raise WorkflowError(f"Node {node.name!r} is not a task of this workflow's backend {self.alias!r}.")
        self._check_task(task, node.name, True)
        now = time.time()
        payload = codec.encode_new(task, node.id, normalize_json(list(args)), normalize_json(kwargs), now)
        entry = (node.id, payload, task.queue_name, _ready_score(task, now), node.name, policy)
        graph_entry = json.dumps([node.name, node.id, [stored.node]])
        return self.scripts.add_to_workflow(stored.id, caller, entry, graph_entry, [task_id for _, task_id in before])


def _ready_score(task: Any, now: float) -> str:
    """Return the score a task takes in its ready segment when released, as enqueue scores it."""
    return f"{(100 - task.priority) * PRIORITY_BAND + int(now * 1000)}"


def with_upstream_failure(result: ThreadmillTaskResult, stored: bytes) -> ThreadmillTaskResult:
    """Return a task failed because a parent failed (its `upstream_failed` field) with that error and its finish."""
    upstream = json.loads(stored)
    message = f"Parent task {upstream['parent']!r} ({upstream['parent_id']}) failed, so this task never ran."
    error = TaskError(exception_class_path=UPSTREAM_FAILED, traceback=f"{UPSTREAM_FAILED}: {message}")
    object.__setattr__(result, "errors", [*result.errors, error])
    object.__setattr__(result, "finished_at", datetime.fromtimestamp(float(upstream["at"]), UTC))
    return result
