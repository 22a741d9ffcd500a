"""The backend half of workflows (`threadmill.workflows`): the enqueue, the read, the cancel and the retry
(their scripts' wrappers are in `workflow_scripts`).

A workflow lives in the keys of the one partition its id and its tasks' ids name (one hash tag, so one slot of
a cluster; partition 0 with one partition): its record, its tasks' hashes, their pending and children sets,
the queues' waiting segments and that partition's `workflows` index. The release is in acknowledge.lua
(`lua/lib/workflow.lua`); docs/explanation/workflows.md has the design. A cancel or a retry of a whole
workflow is a series of bounded script calls (`STEPS_PER_CALL`), each of which leaves the workflow consistent,
so a crash between two of them is repaired by calling again.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from django.tasks import TaskResult, TaskResultStatus
from django.tasks.exceptions import TaskResultDoesNotExist
from django.utils.json import normalize_json

from ..base import UNREADABLE_PAYLOAD_ERRORS, Segment, ThreadmillTaskResult
from ..exceptions import WorkflowError
from ..limits import limit_suffix
from . import codec
from .cancelling import CANCEL_ROUNDS, cancelled_document, default_canceller
from .enqueue_retry import retrying
from .errors import translate_errors
from .keys import TASK_FIELDS, ready_score
from .partitions import names_partition, partition_of

if TYPE_CHECKING:
    from ..running_workflow import AddedNode, ParentResults, StoredWorkflow
    from ..workflows import Workflow, WorkflowNode, WorkflowResult

#: Most task hashes one pipeline of `get_workflow` reads.
READ_BATCH = 1000
#: Most steps (a task, or a parent of a task the retry reads) one cancel_workflow or retry_workflow call
#: takes: a cancel call's median was 0.4-0.55 of a 1,000-child cascade's acknowledgement (42-46 ms on a
#: quiet VM) run beside it, a retry call's 0.15-0.25 (docs/explanation/workflows.md). A task with more
#: parents is one call of its own.
STEPS_PER_CALL = 500
#: The segments of a task `cancel_workflow` cancels (or, running, asks to abort).
CANCELLABLE = ("waiting", "ready", "deferred", "running")
#: Most continue_settling calls one `finish_settling` makes: 10 settle the largest workflow's fan-out.
MAX_SETTLE_CALLS = 100


class WorkflowBackend:
    """What `RedisTaskBackend` does for workflows: new ids, the enqueue and the read."""

    alias: str
    client: Any
    scripts: Any
    keys: Any
    config: Any
    enqueuer: Any
    next_enqueue_partition: Any  # these five from PartitionRouting, mixed in beside it
    covered_partitions: Any
    scripts_for: Any
    task_keys: Any
    task_scripts: Any

    if TYPE_CHECKING:

        def validate_task(self, task: Any) -> None: ...

        def stored_result(
            self, result_id: str, fields: list, old_layout_result: bytes | None
        ) -> ThreadmillTaskResult: ...

    def finish_settling(self, partitions: Sequence[int] = (0,)) -> int:
        """Continue every release of children a call cut short in `partitions`, in bounded calls; return how many."""
        total = 0  # the acknowledgement cut short asks for its task's partition, the sweeper for each
        for partition in partitions:
            scripts = self.scripts_for(partition)
            for _ in range(MAX_SETTLE_CALLS):
                settled, left = scripts.continue_settling(self.config.result_ttl)
                total += settled
                if not left:
                    break
        return total

    def awaits_release(self, queue_names: Sequence[str]) -> bool:
        """Whether a task of `queue_names` waits on a parent in them that is ready or running (`--exit-empty` stays)."""
        # A workflow's tasks share one partition, so each partition is asked about its own (one call each).
        return any(self.scripts_for(p).awaits_release(queue_names) for p in self.covered_partitions())

    def new_task_id(self, like: str | None = None) -> str:
        """Return a new task id in the partition of id `like`; without it, in the next in turn (a new workflow's)."""
        if like is None:
            return codec.new_task_id(self.next_enqueue_partition())
        return codec.new_task_id(partition_of(like) if names_partition(like) else None)

    def enqueue_workflow(self, workflow: Workflow) -> WorkflowResult:
        """Store `workflow` (checked already) in one script call, all or nothing, retried as `enqueue`; return its result."""
        first = workflow.nodes[0].id
        for node in workflow.nodes:
            self._check_node(node)
            if partition_of(node.id) != partition_of(first):
                raise WorkflowError(f"Node {node.name!r} has a task id of another partition than this workflow's.")
        now = time.time()
        index = {node.id: i for i, node in enumerate(workflow.nodes, 1)}
        entries = [self._entry(node, now, index) for node in workflow.nodes]
        graph = json.dumps([[n.name, n.id, [p.name for p in n.parents]] for n in workflow.nodes])
        partition = partition_of(first) if names_partition(first) else None
        workflow_id = codec.new_task_id(partition)
        stored = self.enqueuer.send_workflow(workflow_id, workflow.name, graph, entries, partition)
        if stored == -1:
            raise WorkflowError("A task id of this workflow is taken by a stored task; nothing was stored.")
        # The read back rides out the same blip: the caller must not hear "unreachable" for a stored workflow.
        return retrying(self.config.enqueue_retry, entries, lambda: self.get_workflow(workflow_id))[0]

    def _check_node(self, node: WorkflowNode) -> None:
        self._check_task(node.task, node.name, bool(node.parents))

    def _check_task(self, task: Any, node: str, has_parents: bool) -> None:
        self.validate_task(task)
        if getattr(task, "unique", None):
            raise WorkflowError(f"Node {node!r}: a workflow task cannot have unique= in this release.")
        if has_parents and task.run_after is not None:
            raise WorkflowError(f"Node {node!r}: a task with parents cannot have run_after in this release.")

    def _entry(self, node: WorkflowNode, now: float, index: dict[str, int]) -> tuple:
        task = node.task
        args, kwargs = normalize_json(list(node.args)), normalize_json(node.kwargs)
        payload = codec.encode_new(task, node.id, args, kwargs, now)
        score_when_ready = ready_score(task.priority, now)
        if node.parents:
            segment, score = Segment.WAITING, score_when_ready
        elif task.run_after is not None:
            segment, score = Segment.DEFERRED, repr(task.run_after.timestamp())
        else:
            segment, score = Segment.READY, score_when_ready
        parents = [index[p.id] for p in node.parents]
        return (
            node.id,
            payload,
            task.queue_name,
            segment,
            score_when_ready,
            score,
            node.name,
            parents,
            node.on_parent_failure + limit_suffix(task),
        )

    @translate_errors
    def get_workflow(self, workflow_id: str) -> WorkflowResult:
        """Return a workflow's state: its record's counts, its edges and every task read, a round trip per `READ_BATCH` tasks."""
        from ..workflows import COUNT_KEYS, WorkflowResult, full_graph, status_of

        keys = self.task_keys(workflow_id)
        record = self.client.hgetall(keys.workflow(workflow_id))
        if not record:
            raise TaskResultDoesNotExist(f"No workflow with id {workflow_id!r} is stored.")
        nodes = json.loads(record[b"graph"])
        tasks: dict[str, Any] = {}
        for start in range(0, len(nodes), READ_BATCH):
            pipe = self.client.pipeline(transaction=False)
            for _, task_id, _ in nodes[start : start + READ_BATCH]:
                pipe.hmget(keys.task(task_id), TASK_FIELDS)
            for (name, task_id, _), fields in zip(nodes[start : start + READ_BATCH], pipe.execute(), strict=True):
                if fields[0] is not None and fields[2] != b"unreadable":  # else deleted or quarantined: FAILED
                    tasks[name] = self.stored_result(task_id, fields, None)
        counts = dict.fromkeys(COUNT_KEYS, 0)
        for key in ("WAITING", "SUCCESSFUL", "FAILED"):
            counts[key] = int(record.get(key.lower().encode(), 0))
        counts["RUNNING"] = sum(1 for t in tasks.values() if t.status == TaskResultStatus.RUNNING)
        counts["READY"] = len(nodes) - sum(counts.values())
        name = record.get(b"name", b"").decode()
        parents = {node: of for node, _, of in full_graph(nodes, record)}
        return WorkflowResult(workflow_id, name, self.alias, status_of(counts), counts, tasks, parents)

    @translate_errors
    def running_workflow(self, task_id: str) -> StoredWorkflow | None:
        """Return the workflow of task `task_id` as stored, None when it is no workflow's task (two round trips).

        Raises WorkflowError when the task names a workflow that is no longer stored.
        """
        from ..running_workflow import UNNAMED_ADDED, StoredWorkflow

        keys = self.task_keys(task_id)
        workflow_id, node = self.client.hmget(keys.task(task_id), ["workflow", "node"])
        if workflow_id is None:
            return None
        wid = workflow_id.decode()
        fields = ["name", "graph", f"added_parents:{task_id}", f"{UNNAMED_ADDED}{task_id}", "edges"]
        name, graph, added, unnamed, stored_edges = self.client.hmget(keys.workflow(wid), fields)
        if graph is None:
            raise WorkflowError(f"Workflow {wid} of task {task_id} is no longer stored.")
        entries = json.loads(graph)
        ids = {entry[0]: entry[1] for entry in entries}
        me = node.decode()
        parents = {parent: ids[parent] for entry in entries if entry[0] == me for parent in entry[2]}
        if added:
            by_id = {task_id: node_name for node_name, task_id in ids.items()}
            parents.update((by_id[added_id], added_id) for added_id in added.decode().split(","))
        # A record an older release stored has no `edges`: count them from its graph.
        edges = int(stored_edges) if stored_edges is not None else sum(len(entry[2]) for entry in entries)
        earlier = codec.text(unnamed).split(",") if unnamed else []
        return StoredWorkflow(wid, codec.text(name), me, ids, parents, edges, earlier)

    @translate_errors
    def workflow_results(self, nodes: dict[str, str]) -> ParentResults:
        """Return the stored result of each (node name -> task id) of `nodes`, in one round trip; gone, unreadable left out."""
        from ..running_workflow import ParentResults

        pipe = self.client.pipeline(transaction=False)
        for task_id in nodes.values():
            pipe.hmget(self.task_keys(task_id).task(task_id), TASK_FIELDS)
        replies = pipe.execute() if nodes else []
        found = {name: (task_id, fields) for (name, task_id), fields in zip(nodes.items(), replies, strict=True)}
        return ParentResults(
            {n: r for n, r in found.items() if r[1][0] and r[1][2] != b"unreadable"}, self._parent_result
        )

    def _parent_result(self, read: tuple[str, list]) -> TaskResult:
        return self.stored_result(read[0], read[1], None)

    @translate_errors
    def added_by(self, task_id: str) -> str | None:
        """Return the id of the task that added task `task_id` at run time, None for one enqueued with its workflow."""
        return codec.text(self.client.hget(self.task_keys(task_id).task(task_id), "added_by")) or None

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
        unnamed: bool = False,
    ) -> tuple[int, int]:
        """Store `node`, a call of `task` after running task `caller` (id, lease token), before each (name, id) of `before`.

        Returns add_to_workflow.lua's (code, index). Raises WorkflowError or InvalidTask for a task
        this workflow cannot hold, before anything is sent.
        """
        from ..running_workflow import UNNAMED_ADDED

        if getattr(task, "backend", None) != self.alias:
            raise WorkflowError(f"Node {node.name!r} is not a task of this workflow's backend {self.alias!r}.")
        self._check_task(task, node.name, True)
        now = time.time()
        payload = codec.encode_new(task, node.id, normalize_json(list(args)), normalize_json(kwargs), now)
        tally = f"{UNNAMED_ADDED}{caller[0]}" if unnamed else ""
        policy_text = policy + limit_suffix(task)
        entry = (node.id, payload, task.queue_name, ready_score(task.priority, now), node.name, policy_text, tally)
        graph_entry = json.dumps([node.name, node.id, [stored.node]])
        before_ids = [task_id for _, task_id in before]
        scripts = self.task_scripts(stored.id)
        return scripts.add_to_workflow(stored.id, caller, entry, graph_entry, before_ids, stored.edges)

    def cancel_workflow(self, workflow_id: str, *, by: str = "") -> int:
        """Cancel every task of a workflow that has not run (TaskCancelled) and ask each running one to abort.

        Bounded script calls, children first, each settling what it cancels; calling again after a
        crash finishes the job. Returns how many tasks were cancelled or asked to abort (a running
        task asked before counts again). Raises TaskResultDoesNotExist for an unknown id.
        """
        from ..workflows import parents_first

        task_ids = [task_id for _, task_id, _ in reversed(parents_first(self._graph(workflow_id)))]
        scripts = self.task_scripts(workflow_id)
        now = time.time()
        by = by or default_canceller()
        request, minute = json.dumps({"by": by, "at": now}), int(now // 60)
        took = 0
        for _ in range(CANCEL_ROUNDS):
            entries = self._cancellable(task_ids, by, now)
            task_ids = []
            for start in range(0, len(entries), STEPS_PER_CALL):
                chunk = entries[start : start + STEPS_PER_CALL]
                codes = scripts.cancel_workflow(chunk, self.config.result_ttl, request, minute)
                took += sum(1 for code in codes if code in (1, 2))
                task_ids += [entry[0] for entry, code in zip(chunk, codes, strict=True) if code == -1]
            if not task_ids:
                break
        return took

    def _cancellable(self, task_ids: Sequence[str], by: str, now: float) -> list[tuple[str, str, str, str]]:
        """Return a (task id, queue, segment, document) entry for each task not final, its cancelled document built."""
        entries = []
        rows = self._fields(task_ids, ("data", "queue", "segment"))
        for task_id, (data, queue, segment) in zip(task_ids, rows, strict=True):
            if data is None or queue is None or segment is None or segment.decode() not in CANCELLABLE:
                continue
            document: str | None = ""
            if segment != b"running":
                document = cancelled_document(task_id, data, Segment(segment.decode()), by, now)
            if document is not None:
                entries.append((task_id, queue.decode(), segment.decode(), document))
        return entries

    def retry_workflow(self, workflow_id: str) -> int:
        """Make every failed task of a workflow run again: ready if its parents succeeded, else waiting for them.

        A task failed because its parent failed waits for the parent's new run; the record's counts
        follow. Bounded script calls in graph order (parents first); calling again after a crash
        finishes the job. Returns how many tasks were made ready or waiting again. Raises
        TaskResultDoesNotExist for an unknown id.
        """
        from ..workflows import parents_first

        nodes = parents_first(self._graph(workflow_id))
        id_of = {name: task_id for name, task_id, _ in nodes}
        task_ids = [task_id for _, task_id, _ in nodes]
        now, entries = time.time(), []
        rows = self._fields(task_ids, ("data", "queue", "segment"))
        for (_, task_id, parents), (data, queue, segment) in zip(nodes, rows, strict=True):
            if segment == b"failed" and data is not None and queue is not None:
                try:
                    priority = codec.decode(data, Segment.FAILED).task.priority
                except UNREADABLE_PAYLOAD_ERRORS:
                    continue
                entries.append((task_id, queue.decode(), ready_score(priority, now), [id_of[p] for p in parents]))
        moved, scripts = 0, self.task_scripts(workflow_id)
        for chunk in _by_steps(entries):
            moved += sum(scripts.retry_workflow(workflow_id, chunk))
        return moved

    @translate_errors
    def _graph(self, workflow_id: str) -> list:
        """Return a workflow's (node, task id, parent nodes), runtime edges included; raise TaskResultDoesNotExist if unknown."""
        from ..workflows import full_graph

        record = self.client.hgetall(self.task_keys(workflow_id).workflow(workflow_id))
        if b"graph" not in record:
            raise TaskResultDoesNotExist(f"No workflow with id {workflow_id!r} is stored.")
        return full_graph(json.loads(record[b"graph"]), record)

    @translate_errors
    def _fields(self, task_ids: Sequence[str], fields: Sequence[str]) -> list[list]:
        """Return the given fields of each task hash, in one round trip per `READ_BATCH` tasks."""
        rows: list[list] = []
        for start in range(0, len(task_ids), READ_BATCH):
            pipe = self.client.pipeline(transaction=False)
            for task_id in task_ids[start : start + READ_BATCH]:
                pipe.hmget(self.task_keys(task_id).task(task_id), fields)
            rows += pipe.execute()
        return rows


def _by_steps(entries: list[tuple[str, str, str, list[str]]]) -> list[list[tuple[str, str, str, list[str]]]]:
    """Cut retry entries into chunks of at most `STEPS_PER_CALL` steps, a task and each of its parents one step."""
    chunks: list[list] = [[]]
    steps = 0
    for entry in entries:
        if chunks[-1] and steps + 1 + len(entry[3]) > STEPS_PER_CALL:
            chunks.append([])
            steps = 0
        chunks[-1].append(entry)
        steps += 1 + len(entry[3])
    return [chunk for chunk in chunks if chunk]
