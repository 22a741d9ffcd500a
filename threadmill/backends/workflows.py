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

from django.tasks import TaskResultStatus
from django.tasks.base import TaskError
from django.tasks.exceptions import TaskResultDoesNotExist
from django.utils.json import normalize_json

from ..base import Segment, ThreadmillTaskResult
from ..exceptions import WorkflowError
from ..workflows import COUNT_KEYS, WorkflowResult, status_of
from . import codec
from .errors import translate_errors
from .keys import PRIORITY_BAND, TASK_FIELDS
from .script_source import LuaScript, ScriptHost, script_source

if TYPE_CHECKING:
    from ..workflows import Workflow, WorkflowNode

#: The class path of the error a task failed because of its parent records.
UPSTREAM_FAILED = "threadmill.exceptions.UpstreamFailed"
#: Most task hashes one pipeline of `get_workflow` reads.
READ_BATCH = 1000
_enqueue_workflow = LuaScript(script_source("enqueue_workflow"))
_sweep_waiting = LuaScript(script_source("sweep_waiting"))
_continue_settling = LuaScript(script_source("continue_settling"))
_awaits_release = LuaScript(script_source("awaits_release"))
#: Most continue_settling calls one `finish_settling` makes: 10 settle the largest workflow's fan-out.
MAX_SETTLE_CALLS = 100


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
    def sweep_waiting(self, queue_name: str, first: int, count: int, result_ttl: float) -> tuple[int, int]:
        """Settle the final, unsettled parents of `count` waiting tasks from rank `first`; return (settled, looked at)."""
        k = self.keys
        settled, looked = self._run(
            _sweep_waiting, [k.segment(queue_name, Segment.WAITING), k.task_prefix()], [first, count, int(result_ttl)]
        )
        return int(settled), int(looked)

    @translate_errors
    def continue_settling(self, result_ttl: float) -> tuple[int, int]:
        """Settle the tasks a call cut short at its budget, one budget's worth; return (settled, ids left)."""
        k = self.keys
        settled, left = self._run(_continue_settling, [k.workflow_settling(), k.task_prefix()], [int(result_ttl)])
        return int(settled), int(left)

    @translate_errors
    def awaits_release(self, queue_names: Sequence[str]) -> bool:
        """Whether a waiting task of `queue_names` may still be released: one waits, and one is ready or running
        or a release is being continued."""
        k = self.keys
        keys = [k.workflow_settling()]
        for name in queue_names:
            keys += [k.segment(name, Segment.WAITING), k.segment(name, Segment.READY), k.segment(name, Segment.RUNNING)]
        return bool(self._run(_awaits_release, keys, []))


class WorkflowBackend:
    """What `RedisTaskBackend` does for workflows: new ids, the enqueue and the read."""

    alias: str
    client: Any
    scripts: Any
    keys: Any
    config: Any

    if TYPE_CHECKING:

        @property
        def partition_count(self) -> int: ...

        def validate_task(self, task: Any) -> None: ...

        def stored_result(
            self, result_id: str, fields: list, old_layout_result: bytes | None
        ) -> ThreadmillTaskResult: ...

    def finish_settling(self) -> int:
        """Continue every release of children a call cut short, in bounded calls, until none is left; return how many.

        The acknowledgement that ran out of budget calls it at once; the sweeper calls it too, for a
        worker that stopped between the two.
        """
        total = 0
        for _ in range(MAX_SETTLE_CALLS):
            settled, left = self.scripts.continue_settling(self.config.result_ttl)
            total += settled
            if not left:
                break
        return total

    def awaits_release(self, queue_names: Sequence[str]) -> bool:
        """Whether a task of `queue_names` waits on a parent in them that is ready or running (`--exit-empty` stays)."""
        if self.partition_count > 1:
            return False  # no workflow is stored with partitions > 1
        return self.scripts.awaits_release(queue_names)

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
        self.validate_task(node.task)
        for option in ("unique", "concurrency", "rate"):
            if getattr(node.task, option, None):
                raise WorkflowError(f"Node {node.name!r}: a workflow task cannot have {option}= in this release.")
        if node.parents and node.task.run_after is not None:
            raise WorkflowError(f"Node {node.name!r}: a task with parents cannot have run_after in this release.")

    def _entry(self, node: WorkflowNode, now: float, index: dict[str, int]) -> tuple:
        task = node.task
        args, kwargs = normalize_json(list(node.args)), normalize_json(node.kwargs)
        payload = codec.encode_new(task, node.id, args, kwargs, now)
        ready_score = f"{(100 - task.priority) * PRIORITY_BAND + int(now * 1000)}"
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


def with_upstream_failure(result: ThreadmillTaskResult, stored: bytes) -> ThreadmillTaskResult:
    """Return a task failed because a parent failed (its `upstream_failed` field) with that error and its finish."""
    upstream = json.loads(stored)
    message = f"Parent task {upstream['parent']!r} ({upstream['parent_id']}) failed, so this task never ran."
    error = TaskError(exception_class_path=UPSTREAM_FAILED, traceback=f"{UPSTREAM_FAILED}: {message}")
    object.__setattr__(result, "errors", [*result.errors, error])
    object.__setattr__(result, "finished_at", datetime.fromtimestamp(float(upstream["at"]), UTC))
    return result
