"""The workflow scripts' wrappers (a base class of `scripts.RedisScripts`), one named method a script.

docs/explanation/workflows.md has the design; each script's header names its KEYS and ARGV.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from ..base import Segment
from ..exceptions import DurableEnqueueError
from .errors import translate_errors
from .keys import THROUGHPUT_COUNTER_TTL_S
from .script_source import LuaScript, ScriptHost

_enqueue_workflow = LuaScript.named("enqueue_workflow")
_sweep_waiting = LuaScript.named("sweep_waiting")
_recount_workflows = LuaScript.named("recount_workflows")
_add_to_workflow = LuaScript.named("add_to_workflow")
_cancel_workflow = LuaScript.named("cancel_workflow")
_retry_workflow = LuaScript.named("retry_workflow")
_continue_settling = LuaScript.named("continue_settling")
_awaits_release = LuaScript.named("awaits_release")


class WorkflowScripts(ScriptHost):
    """The workflow scripts' wrappers (a base class of `scripts.RedisScripts`)."""

    @translate_errors
    def enqueue_workflow(
        self, workflow_id: str, name: str, graph: str, entries: Sequence[tuple], durable_within_s: float | None = None
    ) -> int:
        """Store (id, payload, queue, segment, ready score, score, node, parent indices, policy) entries as one workflow.

        Parent indices count from 1 in `entries`; a policy is followed by `limits.limit_suffix` for a task with a
        per-task limit. Returns the number stored, 0 when the workflow was stored already, -1 when a task id is
        taken (nothing stored then). With `durable_within_s`, return only once it is in the append-only file, as
        `enqueue_many`.
        """
        k = self.keys
        queues = list(dict.fromkeys(entry[2] for entry in entries))
        index = {queue: j for j, queue in enumerate(queues, 1)}
        keys = [k.queues(), k.workflow(workflow_id), k.workflows()]
        for queue in queues:
            keys += [k.wake(queue), k.totals(queue)]
        args: list[Any] = [workflow_id, name, graph, len(queues), *queues]
        for task_id, payload, queue, segment, score_when_ready, score, node, parents, policy in entries:
            keys += [
                k.task(task_id),
                k.segment(queue, segment),
                k.workflow_pending(task_id),
                k.workflow_children(task_id),
            ]
            parent_text = ",".join(str(p) for p in parents)
            args += [task_id, payload, index[queue], segment.value, score_when_ready, score, node]
            args.append(f"{parent_text}|{policy}")
        keys += [k.task_limits(), k.limited_queues()]
        if durable_within_s is None:
            return self._run(_enqueue_workflow, keys, args)
        stored, synced = self._run_durably(_enqueue_workflow, keys, args, durable_within_s)
        if int(synced[0]) < 1:
            raise DurableEnqueueError(
                f"Workflow {workflow_id} ({len(entries)} tasks) was enqueued, but the server did not confirm it "
                f"in its append-only file within {durable_within_s:g} s (fsync_enqueue): it may be lost if the "
                "server crashes now."
            )
        return stored

    @translate_errors
    def add_to_workflow(
        self, wid: str, caller: tuple[str, str], entry: tuple, graph_entry: str, before: Sequence[str], edges: int
    ) -> tuple[int, int]:
        """Add an (id, payload, queue, ready score, node, policy, tally) task after running task `caller`; (code, index).

        `policy` is the failure policy, followed by `limits.limit_suffix` for a task with a per-task limit. `caller` is (id, lease token), holding that lease; `edges`, the read graph's dependency count (old records).

        Each id of `before` waits for it too; tally: the record field listing unnamed adds, "" if named.
        """
        from ..workflows import MAX_EDGES, MAX_TASKS

        k = self.keys
        task_id, payload, queue, ready_score, node, policy, tally = entry
        keys = [k.workflow(wid), k.queues(), k.totals(queue), k.task(task_id)]
        keys += [k.segment(queue, Segment.WAITING), k.workflow_pending(task_id), k.workflow_children(task_id)]
        caller_id, lease_token = caller
        keys += [k.task(caller_id), k.workflow_children(caller_id)]
        for before_id in before:
            keys += [k.task(before_id), k.workflow_pending(before_id)]
        keys += [k.task_limits(), k.limited_queues()]
        taken = "[" + json.dumps(node) + ', "'
        args = [wid, caller_id, task_id, payload, queue, ready_score, node, policy, taken, graph_entry]
        args += [MAX_TASKS, lease_token, MAX_EDGES, edges, tally]
        code, index = self._run(_add_to_workflow, keys, [*args, *before])
        return int(code), int(index)

    @translate_errors
    def sweep_waiting(
        self, queue_name: str, cursor: tuple[int, str, str], count: int, steps: int, result_ttl: float
    ) -> tuple[int, tuple[int, str, str], bool]:
        """Settle the final, unsettled parents of up to `count` waiting tasks from `cursor` (rank, task id or "",
        SSCAN cursor in its pending set) in at most `steps` steps; return (settled, next cursor, at the end)."""
        k, (rank, task_id, scan) = self.keys, cursor
        keys, args = [k.segment(queue_name, Segment.WAITING), k.task_prefix()], [rank, count, int(result_ttl), steps]
        settled, rank, task_id, scan, end = self._run(_sweep_waiting, keys, [*args, task_id, scan])
        return int(settled), (int(rank), task_id.decode(), scan.decode()), bool(end)

    @translate_errors
    def recount_workflows(
        self, cursor: tuple[int, int], budget: tuple[int, int], result_ttl: float, given: tuple[str, int, Sequence[str]]
    ) -> tuple[int, tuple[int, int], bool, str]:
        """Count the uncounted final tasks of open records from `cursor` (rank, place in its graph) within `budget`
        (records, task hashes); return (counted, next cursor, at the end, the workflow the cursor is inside or "").
        `given`: (that workflow or "", where its last id ends, its ids after the cursor) the caller read from its graph."""
        k, (wid, end, ids) = self.keys, given
        args = [*cursor, *budget, int(result_ttl), wid, end, *ids]
        counted, rank, index, at_end, inside = self._run(_recount_workflows, [k.workflows(), k.task_prefix()], args)
        return int(counted), (int(rank), int(index)), bool(at_end), inside.decode()

    @translate_errors
    def cancel_workflow(
        self, entries: Sequence[tuple[str, str, str, str]], result_ttl: float, request: str, minute: int
    ) -> list[int]:
        """Cancel (task id, queue, segment read, document) entries of one workflow; return cancel.lua's code each."""
        k = self.keys
        queues = list(dict.fromkeys(entry[1] for entry in entries))
        index = {queue: j for j, queue in enumerate(queues, 1)}
        keys: list[str] = []
        for queue in queues:
            keys += [k.totals(queue), k.throughput(queue, "egress", minute), k.throughput(queue, "failed", minute)]
            keys.append(k.segment(queue, Segment.FAILED))
        args: list[Any] = [int(result_ttl), request, THROUGHPUT_COUNTER_TTL_S, len(queues)]
        for task_id, queue, segment, document in entries:
            read = segment if segment in ("waiting", "ready", "deferred") else "ready"
            keys += [k.task(task_id), k.segment(queue, read)]
            args += [task_id, segment, document, index[queue]]
        return [int(code) for code in self._run(_cancel_workflow, keys, args)]

    @translate_errors
    def retry_workflow(
        self, workflow_id: str, entries: Sequence[tuple[str, str, str, Sequence[str]]]
    ) -> tuple[int, int]:
        """Make (task id, queue, ready score, parent ids) entries of a workflow run again; return (ready, waiting)."""
        k = self.keys
        queues = list(dict.fromkeys(entry[1] for entry in entries))
        index = {queue: j for j, queue in enumerate(queues, 1)}
        keys = [k.workflow(workflow_id)]
        for queue in queues:
            keys += [k.segment(queue, s) for s in (Segment.FAILED, Segment.READY, Segment.WAITING)] + [k.wake(queue)]
        args: list[Any] = [len(queues)]
        for task_id, queue, score, parents in entries:
            keys += [k.task(task_id), k.workflow_pending(task_id)]
            for parent in parents:
                keys += [k.task(parent), k.workflow_children(parent)]
            args += [task_id, index[queue], score, ",".join(parents)]
        ready, waiting = self._run(_retry_workflow, keys, args)
        return int(ready), int(waiting)

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
