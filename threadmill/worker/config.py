"""The worker pool's runtime configuration, as the command line sets it."""

from __future__ import annotations

import os
from dataclasses import dataclass

from .prefetch import DEFAULT_WINDOW_S

#: Default seconds running tasks may take to finish after SIGTERM (below Kubernetes' 30 s grace period).
DEFAULT_SHUTDOWN_TIMEOUT_S = 25.0


def default_process_count() -> int:
    """Return the default number of worker processes: CPU count minus one, at least one."""
    return max(1, (os.cpu_count() or 1) - 1)


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    """What every worker process of one pool runs, and how."""

    backend: str = "default"
    queues: tuple[str, ...] = ("default",)
    processes: int = 1
    threads: int = 1
    #: Tasks each process leases ahead of its threads; 0 sizes the buffer by time (`prefetch.Prefetch`).
    prefetch_count: int = 0
    #: Seconds of work a buffer sized by time holds.
    prefetch_window: float = DEFAULT_WINDOW_S
    max_tasks: int | None = None
    max_tasks_jitter: int = 0
    exit_empty: bool = False
    shutdown_timeout: float = DEFAULT_SHUTDOWN_TIMEOUT_S
    log_format: str = "json"
    verbosity: int = 1
