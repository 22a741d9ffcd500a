"""Unique tasks (`@task(unique=True)`): what a task's uniqueness key is, and which segments it counts in.

A unique task's key names the work, not the task: the task's module path and either the
string its `unique_key(args, kwargs)` returns or, by default, its arguments. The queue is not
part of it, so the same work sent to two queues is still one task. The enqueue script keeps
`key -> task id` and admits a duplicate only once the holder left the counted segments.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class UniqueSpec:
    """One enqueue's uniqueness: the key's digest, how long it holds and the segments it counts in."""

    #: The digest the Redis key ends with (sha256 hex of the task path and the key string).
    digest: str
    #: Milliseconds the key holds at most; 0: until its task leaves the counted segments.
    hold_ms: int
    #: Comma-separated segment names, as the scripts compare them.
    segments: str


def key_string(task_path: str, key_function: Callable[[Any, Any], Any] | None, args: Any, kwargs: Any) -> str:
    """Return the key a call of the task at `task_path` is unique by, raising TypeError for a key that is not a str."""
    if key_function is None:
        return json.dumps([args, kwargs], sort_keys=True, separators=(",", ":"))
    key = key_function(args, kwargs)
    if not isinstance(key, str) or not key:
        raise TypeError(f"unique_key of task {task_path} must return a non-empty str, not {key!r}.")
    return key


def spec_for(task: Any, args: Any, kwargs: Any) -> UniqueSpec | None:
    """Return the uniqueness of one call of `task`, or None for a task that is not unique."""
    if not getattr(task, "unique", False):
        return None
    key = key_string(task.module_path, task.unique_key, args, kwargs)
    digest = hashlib.sha256(f"{task.module_path}\0{key}".encode()).hexdigest()
    hold_ms = 0 if task.unique_for is None else max(1, round(task.unique_for.total_seconds() * 1000))
    return UniqueSpec(digest, hold_ms, ",".join(segment.value for segment in task.unique_segments))
