"""What every mixin of `WorkerProcess` uses of the process it is mixed into.

The mixins (`Fetcher`, `AbortPolling`, `TimeLimits`, `Consumers`, `Suspects`, `HeartbeatTrust`)
hold no state of their own: `WorkerProcess.__init__` sets these attributes (its comments say what
each means), and each mixin calls the others' methods listed here. Everything is an annotation or
a stub seen only by the type checker, so nothing here shadows the real attributes or methods.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import threading
    from collections import deque
    from collections.abc import Callable

    from ..backends.redis import RedisTaskBackend
    from ..base import ThreadmillTaskResult
    from .config import WorkerConfig
    from .executor import Executor, Outcome
    from .prefetch import Prefetch
    from .reports import TaskReports
    from .state import Buffered, Phase
    from .taskstats import TaskStatsCounts
    from .watchdog import Watchdog


class ProcessHost:
    """The worker process's shared state and cross-mixin methods, as its mixins read them."""

    backend: RedisTaskBackend
    config: WorkerConfig
    name: str
    _executors: list[Executor]
    prefetch: Prefetch
    # Set by `Fetcher._resize`, under the lock.
    size: int
    refill_at: int
    ack_batch: int
    _wake_at_refill: bool
    budget: int | None
    phase: Phase
    buffer: deque[Buffered]
    running: dict[str, ThreadmillTaskResult]
    outcomes: list[Outcome]
    unstarted: list[ThreadmillTaskResult]
    reports: TaskReports
    task_stats: TaskStatsCounts
    done: int
    consumers_alive: int
    recycled: bool
    failed: bool
    left_leases: bool
    unsettled: int
    heartbeat_confirmed_at: float
    trust_epoch: int
    trust_s: float
    finished: threading.Event
    first_heartbeat: Callable[[], None] | None
    announced: threading.Event
    default_limit_s: float | None
    watchdog: Watchdog
    timed_out: bool
    aborted: dict[str, str]
    _next_abort_check_at: float
    _interrupted_because: str
    _shutdown_at: float
    _outcomes_since: float
    _next_fetch_at: float
    _last_fetch_empty: bool
    _poll_pause: float
    _offline_until: float
    _offline_since: float | None
    _reconnect_pause: float
    _unanswered: list[str]
    _alone: str
    _idle: bool
    _idle_until: float
    _woken: bool
    _lock: threading.Lock
    _has_tasks: threading.Condition
    _has_work: threading.Condition

    if TYPE_CHECKING:
        # From WorkerProcess.
        @property
        def holds_leases(self) -> bool: ...

        def _enter(self, phase: Phase) -> None: ...

        # From Fetcher.
        def _resize(self) -> None: ...

        # From AbortPolling.
        def _abort_candidates(self) -> list[ThreadmillTaskResult]: ...

        def _deliver_aborts(self, results: list[ThreadmillTaskResult]) -> None: ...

        # From Consumers.
        def _drop_unstarted(self, result: ThreadmillTaskResult, unstarted: list[ThreadmillTaskResult]) -> None: ...

        # From TimeLimits.
        def _cover_lease(self, result: ThreadmillTaskResult, expires: float, limit_s: float) -> bool: ...

        # From Suspects.
        def _held_back(self) -> bool: ...

        def _record_start(self, result: ThreadmillTaskResult) -> bool: ...

        def _record_finish(self, result: ThreadmillTaskResult) -> None: ...

        # From HeartbeatTrust.
        def _distrust_buffer(self, entry: Buffered | None, now: float) -> None: ...
