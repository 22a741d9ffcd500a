"""The stored task document: encoding a new task, reading one back as a task result.

A document is UTF-8 JSON with the task's path and options, its arguments, timestamps
(epoch seconds), errors, worker ids and, once finished, the return value. Its stored
status is validated but never trusted: the segment a task is in says where it stands.
Reading is one rule: any of `UNREADABLE_PAYLOAD_ERRORS` means this code cannot read it.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from django.tasks import Task, TaskResult, TaskResultStatus
from django.tasks.base import TaskError
from django.utils.module_loading import import_string

from ..attempts import attempts_of
from ..base import Segment, ThreadmillTaskResult
from ..progress import metadata_of, progress_of
from ..retry import policy_from_spec, retry_spec

_STATUS_OF_SEGMENT = {
    Segment.READY: TaskResultStatus.READY,
    Segment.WAITING: TaskResultStatus.READY,
    Segment.DEFERRED: TaskResultStatus.READY,
    Segment.RUNNING: TaskResultStatus.RUNNING,
    Segment.SUCCESSFUL: TaskResultStatus.SUCCESSFUL,
    Segment.FAILED: TaskResultStatus.FAILED,
}
_VALID_STATUSES = frozenset(TaskResultStatus.values)
#: The class path of the error a task failed because of its parent records.
UPSTREAM_FAILED = "threadmill.exceptions.UpstreamFailed"
#: Most task objects kept for stored task specs (one per task, options and run_after).
TASK_CACHE_SIZE = 1024
#: Most task spec JSON texts kept (one per task object encoded).
SPEC_CACHE_SIZE = 1024


class BoundedCache(dict):
    """A dict that forgets its oldest entry once it holds `maxsize`; reads stay a plain `dict.get`."""

    __slots__ = ("maxsize",)

    def __init__(self, maxsize: int) -> None:
        super().__init__()
        self.maxsize = maxsize

    def put(self, key: Any, value: Any) -> Any:
        """Store `value` under `key`, first evicting the oldest entry when full; return `value`."""
        if len(self) >= self.maxsize and key not in self:
            # Another thread may evict at the same time: losing that race only means one fewer entry.
            try:
                del self[next(iter(self))]
            except (KeyError, StopIteration, RuntimeError):
                pass
        self[key] = value
        return value


_tasks: BoundedCache = BoundedCache(TASK_CACHE_SIZE)
_spec_texts: BoundedCache = BoundedCache(SPEC_CACHE_SIZE)
_dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, default=str).encode
_loads = json.loads
_fromtimestamp = datetime.fromtimestamp


def timestamp(value: datetime | None) -> float | None:
    """Return an aware datetime as epoch seconds, None as None."""
    return None if value is None else value.timestamp()


def text(value: bytes | None) -> str:
    """Return a Redis reply as text, None as the empty string."""
    return "" if value is None else value.decode()


#: The last text and the last number `moment` read, each with what it read it as: consecutive
#: reads often share them (an acquire's first leases their start, text from the reply; an
#: `enqueue_many` batch its enqueue time, a number in the document). A datetime is immutable.
_last_text: tuple[Any, datetime | None] = (None, None)
_last_number: tuple[Any, datetime | None] = (None, None)


def moment(value: float | str | bytes | None) -> datetime | None:
    """Return epoch seconds (a number, or the text Redis replies with) as an aware UTC datetime."""
    global _last_text, _last_number
    if value is None or value == b"" or value == "":
        return None
    is_text = isinstance(value, bytes | str)
    last = _last_text if is_text else _last_number
    if value == last[0]:  # the same text, or an equal number: the same time
        return last[1]
    read = _fromtimestamp(float(value), UTC)
    if is_text:
        _last_text = (value, read)
    else:
        _last_number = (value, read)
    return read


_last_uuid_ms = 0
_uuid_seq = 0


def new_task_id(partition: int | None = None) -> str:
    """Return a UUIDv7 whose text sorts in creation order within this process.

    With a `partition` (0-255) it is a UUIDv8 of the same layout whose last byte is the
    partition, so the task's keys can be found from its id alone (see `partitions.partition_of`).
    """
    global _last_uuid_ms, _uuid_seq
    ms = time.time_ns() // 1_000_000
    if ms <= _last_uuid_ms:
        _uuid_seq += 1
        if _uuid_seq > 0xFFF:
            _last_uuid_ms += 1
            _uuid_seq = 0
        ms = _last_uuid_ms
    else:
        _last_uuid_ms, _uuid_seq = ms, int.from_bytes(os.urandom(2)) & 0x3FF
    value = (ms << 80) | (0x7 << 76) | (_uuid_seq << 64) | (0b10 << 62)
    value |= int.from_bytes(os.urandom(8)) & ((1 << 62) - 1)
    if partition is not None:
        value = (value & ~(0xF << 76) & ~0xFF) | (0x8 << 76) | partition
    text = f"{value:032x}"
    return f"{text[:8]}-{text[8:12]}-{text[12:16]}-{text[16:20]}-{text[20:]}"


def task_spec(task: Task) -> dict[str, Any]:
    """Return the JSON form of a task's identity and options.

    A time limit is stored as "timeout" (seconds) only when the task has one, so the spec of a
    task without one is what the previous release wrote; that release ignores the key.
    """
    spec = {
        "path": task.module_path,
        "priority": task.priority,
        "queue": task.queue_name,
        "backend": task.backend,
        "context": task.takes_context,
        "run_after": timestamp(task.run_after),
        "retry": retry_spec(getattr(task, "retry", None)),
    }
    limit = getattr(task, "timeout", None)
    if limit is not None:
        spec["timeout"] = limit.total_seconds()
    return spec


def encode_new(
    task: Task, task_id: str, args: Any, kwargs: Any, enqueued_at: float, trace: dict[str, str] | None = None
) -> str:
    """Return the document of a freshly enqueued task, with the W3C trace context of its enqueue if any.

    The trace context is stored as "trace" only when there is one, so without tracing the
    document is what the previous release wrote; that release reads documents by key and ignores it.
    """
    doc = {
        "id": task_id,
        "task": task_spec(task),
        "status": "READY",
        "args": args,
        "kwargs": kwargs,
        "enqueued_at": enqueued_at,
        "started_at": None,
        "last_attempted_at": None,
        "finished_at": None,
        "errors": [],
        "worker_ids": [],
    }
    if trace:
        doc["trace"] = trace
    return _dumps(doc)


def _spec_json(task: Task) -> str:
    cached = _spec_texts.get(id(task))
    if cached is None or cached[0] is not task:
        cached = _spec_texts.put(id(task), (task, _dumps(task_spec(task))))
    return cached[1]


def encode_result(result: TaskResult, return_value: Any = None) -> str:
    """Return the document of `result` as it stands now, with its return value."""
    # The task spec is the same for every result of a task: its JSON is built once. Every
    # worker acknowledgement encodes one, so the times are read inline and the status by its
    # `_value_` attribute (`.value` is a property): four and three Python calls a task fewer.
    enqueued, started, attempted, finished = (
        result.enqueued_at,
        result.started_at,
        result.last_attempted_at,
        result.finished_at,
    )
    doc = {
        "id": result.id,
        "status": result.status._value_,
        "args": result.args,
        "kwargs": result.kwargs,
        "enqueued_at": None if enqueued is None else enqueued.timestamp(),
        "started_at": None if started is None else started.timestamp(),
        "last_attempted_at": None if attempted is None else attempted.timestamp(),
        "finished_at": None if finished is None else finished.timestamp(),
        "errors": [{"exception_class_path": e.exception_class_path, "traceback": e.traceback} for e in result.errors],
        "worker_ids": result.worker_ids,
        "return_value": return_value,
    }
    trace = getattr(result, "trace_context", None)
    if trace:  # kept across retries and requeues, so every attempt joins the enqueue's trace
        doc["trace"] = trace
    rest = _dumps(doc)
    return f'{{"task":{_spec_json(result.task)},{rest[1:]}'


def _task_of(spec: dict[str, Any]) -> Task:
    retry = spec["retry"]
    key = (
        spec["path"],
        spec["priority"],
        spec["queue"],
        spec["backend"],
        spec["context"],
        spec["run_after"],
        _dumps(retry) if isinstance(retry, dict) else retry,
        spec.get("timeout"),
    )
    task = _tasks.get(key)
    if task is None:
        task = _tasks.put(key, _resolve_task(spec))
    return task


def _resolve_task(spec: dict[str, Any]) -> Task:
    found = import_string(spec["path"])
    if not isinstance(found, Task):
        raise TypeError(f"{spec['path']} is not a task.")
    changes: dict[str, Any] = {}
    if found.priority != spec["priority"]:
        changes["priority"] = spec["priority"]
    if found.queue_name != spec["queue"]:
        changes["queue_name"] = spec["queue"]
    if found.backend != spec["backend"]:
        changes["backend"] = spec["backend"]
    if spec["run_after"] is not None:
        changes["run_after"] = moment(spec["run_after"])
    if hasattr(found, "retry"):
        policy = policy_from_spec(spec["retry"])
        if policy != found.retry:
            changes["retry"] = policy
    if hasattr(found, "timeout"):
        # The stored limit is the one it was enqueued with; none stored (an older release) means none.
        stored = spec.get("timeout")
        limit = None if stored is None else timedelta(seconds=stored)
        if limit != found.timeout:
            changes["timeout"] = limit
    return replace(found, **changes) if changes else found


def _errors_of(entries: list[dict[str, str]]) -> list[TaskError]:
    return [TaskError(exception_class_path=e["exception_class_path"], traceback=e["traceback"]) for e in entries]


def _trace_of(stored: Any) -> dict[str, str] | None:
    """Return a stored trace context, None when there is none or it is not a mapping of texts."""
    if not stored or not isinstance(stored, dict):
        return None
    return {k: v for k, v in stored.items() if isinstance(k, str) and isinstance(v, str)} or None


def decode(
    data: bytes,
    segment: Segment,
    *,
    started_at: bytes | None = None,
    lease_worker: str = "",
    lease_started_at: datetime | None = None,
    lease_token: str = "",
    lease_deadline: datetime | None = None,
    worker_losses: int | None = None,
    progress: bytes | None = None,
    metadata: bytes | None = None,
    attempts: bytes | None = None,
    unique_key: str = "",
) -> ThreadmillTaskResult:
    """Read a stored document as the task result of a task in `segment`, its lease and reports applied.

    Raises one of UNREADABLE_PAYLOAD_ERRORS when this code cannot read it.
    """
    doc = _loads(data.decode())
    if doc["status"] not in _VALID_STATUSES:
        raise ValueError(f"Unknown task status {doc['status']!r}.")
    status = _STATUS_OF_SEGMENT[segment]
    worker_ids = doc["worker_ids"]
    first_started = doc["started_at"]
    if lease_worker:
        worker_ids = [*worker_ids, lease_worker]
        last_attempted_at = lease_started_at
        started = moment(started_at) if first_started is None else moment(first_started)
    else:
        last_attempted_at = moment(doc["last_attempted_at"])
        started = moment(first_started)
    finished = segment is Segment.SUCCESSFUL or segment is Segment.FAILED
    result = ThreadmillTaskResult(
        task=_task_of(doc["task"]),
        id=doc["id"],
        status=status,
        enqueued_at=moment(doc["enqueued_at"]),
        started_at=started,
        finished_at=moment(doc["finished_at"]) if finished else None,
        last_attempted_at=last_attempted_at,
        args=doc["args"],
        kwargs=doc["kwargs"],
        backend=doc["task"]["backend"],
        errors=_errors_of(doc["errors"]),
        worker_ids=worker_ids,
        lease_worker=lease_worker,
        lease_token=lease_token,
        lease_started_at=lease_started_at,
        lease_deadline=lease_deadline,
        segment=segment,
        worker_losses=worker_losses,
        progress=progress_of(progress) if progress else None,
        metadata=metadata_of(metadata) if metadata else {},
        unique_key=unique_key,
        trace_context=_trace_of(doc.get("trace")),
        attempt_records=attempts_of(attempts) if attempts else (),
    )
    if segment is Segment.SUCCESSFUL:
        object.__setattr__(result, "_return_value", doc.get("return_value"))
    return result


def with_upstream_failure(result: ThreadmillTaskResult, stored: bytes) -> ThreadmillTaskResult:
    """Return a task failed because a parent failed (its `upstream_failed` field) with that error and its finish."""
    upstream = json.loads(stored)
    message = f"Parent task {upstream['parent']!r} ({upstream['parent_id']}) failed, so this task never ran."
    error = TaskError(exception_class_path=UPSTREAM_FAILED, traceback=f"{UPSTREAM_FAILED}: {message}")
    object.__setattr__(result, "errors", [*result.errors, error])
    object.__setattr__(result, "finished_at", datetime.fromtimestamp(float(upstream["at"]), UTC))
    return result
