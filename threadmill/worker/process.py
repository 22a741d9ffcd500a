"""One worker process: a fetcher thread, consumer threads and the bounded buffer between them.

The **fetcher** (`fetcher.py`) is the only thread that talks to the server about tasks: it
leases tasks into the buffer, acknowledges finished ones in batches, writes progress reports and
looks for abort requests (`aborts.py`). **Consumers** (`consumer.py`) take tasks in lease order
and never touch the server, except for a suspect (`suspects.py`) and a bounded run whose lease
must cover its limit (`limits.py`). The heartbeat is sent by the telemetry thread (the first by the
fetcher, right after its first acquire); a long gap
between stored heartbeats makes the process distrust what it buffered (`trust.py`). Each
concern is a mixin of `WorkerProcess`, not an object of its own: they all read and write the
state `__init__` lists, in the same critical sections under one lock, and their methods stay the
process's (`heartbeat_confirmed` is what the telemetry thread calls).

The process moves through these phases (`Phase`); `_enter` is the only place that changes it:

- FETCHING -> DRAINING: the `--max-tasks` budget is spent, or `--exit-empty` found nothing ready
  and no waiting workflow task its queues' ready or running tasks may release.
  Everything buffered still runs.
- FETCHING -> QUIET: `quiet()` (an operator's "quiet"). Nothing more is fetched; what is buffered
  and running finishes and is acknowledged; the process stays alive until it is stopped.
- FETCHING, QUIET or DRAINING -> STOPPING: `stop()` (SIGTERM, or the supervisor is gone). Buffered
  tasks, and those of an acquire whose reply comes after the stop, are handed back to ready at
  once, with no attempt recorded; running tasks may finish until the shutdown deadline.
- DRAINING or STOPPING -> STOPPED: nothing is buffered, running or waiting to be acknowledged.
- STOPPING -> STOPPED at the shutdown deadline: tasks still running are handed back as
  interrupted attempts (`AttemptAbandoned`), and the process exits without them.
- any -> STOPPING with the shutdown deadline now: a task did not end `timeout_grace` after its
  time limit (the watchdog gives it up, `_give_up`). It is recorded FAILED with TaskTimeout (or
  requeued, as its retry policy says), the other running tasks are handed back as interrupted
  attempts, and the process exits with `EXIT_TIMED_OUT`: its supervisor replaces it at once.
- any -> STOPPED: every consumer thread died, or the fetcher met an error it cannot ride out.

Invariants: the fetcher never leases past the `--max-tasks` budget, so every leased task runs
or is handed back; and the process says goodbye (leaves the workers set) only when every lease
it took was acknowledged or handed back by a call the server answered (`named_on_server`),
otherwise its heartbeat ages and the broker recovers the rest. A task's BaseException
(`sys.exit()`, KeyboardInterrupt) is its outcome, like any failure: the consumer thread lives on.
"""

from __future__ import annotations

import random
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..base import ThreadmillTaskResult
from ..exit_codes import EXIT_FAILED, EXIT_OK, EXIT_RECYCLED, EXIT_TIMED_OUT
from .aborts import ABORT_CHECK_INTERVAL_S, AbortPolling
from .config import WorkerConfig
from .consumer import Consumers
from .executor import Executor, Outcome
from .fetcher import (
    ACK_BATCH,
    ACK_DELAY_S,
    IDLE_WAIT_S,
    RECONNECT_MAX_PAUSE_S,
    RECONNECT_PAUSE_S,
    WAKE_AT_REFILL_SIZE,
    Fetcher,
    Work,
)
from .prefetch import Prefetch
from .reports import TaskReports
from .state import Buffered, Phase
from .suspects import Suspects
from .taskstats import TaskStatsCounts
from .time_limits import TimeLimits
from .trust import HEARTBEAT_TRUST_SHARE, HeartbeatTrust
from .watchdog import Watchdog

if TYPE_CHECKING:
    from ..backends.redis import RedisTaskBackend

__all__ = [
    "ABORT_CHECK_INTERVAL_S",
    "ACK_BATCH",
    "ACK_DELAY_S",
    "HEARTBEAT_TRUST_SHARE",
    "IDLE_WAIT_S",
    "RECONNECT_MAX_PAUSE_S",
    "RECONNECT_PAUSE_S",
    "WAKE_AT_REFILL_SIZE",
    "Buffered",
    "Phase",
    "Work",
    "WorkerProcess",
]


class WorkerProcess(Fetcher, AbortPolling, TimeLimits, Consumers, Suspects, HeartbeatTrust):
    """Leases tasks into a buffer, runs them on consumer threads and acknowledges them."""

    def __init__(self, backend: RedisTaskBackend, config: WorkerConfig, name: str, kill_at=None) -> None:
        self.backend = backend
        self.config = config
        self.name = name
        #: The consumers' executors, whose `started_at` tells the fetcher how long the runs going on took so far.
        self._executors: list[Executor] = []
        self.prefetch = Prefetch(
            config.threads, config.prefetch_count, config.prefetch_window, backend.config.lease_ttl
        )
        self._resize()
        self.budget = (
            None if config.max_tasks is None else config.max_tasks + random.randint(0, config.max_tasks_jitter)
        )
        self.phase = Phase.FETCHING
        self.buffer: deque[Buffered] = deque()
        #: Tasks the consumers run now, by lease token: the same task may run twice at once here,
        #: when its lease ran out and it was leased to this process again.
        self.running: dict[str, ThreadmillTaskResult] = {}
        self.outcomes: list[Outcome] = []
        self.unstarted: list[ThreadmillTaskResult] = []
        #: What running tasks reported (`threadmill.set_progress`, `set_metadata`), written by the fetcher.
        self.reports = TaskReports()
        #: Per-task-path counts of acknowledged attempts not yet sent (`taskstats.py`), used by the fetcher only.
        self.task_stats = TaskStatsCounts()
        self.done = 0
        self.consumers_alive = 0
        self.recycled = False
        self.failed = False
        #: Set when the last turn could not reach the server: the broker recovers what it held.
        self.left_leases = False
        #: Leases taken and not yet acknowledged, handed back or requeued by a call the server answered.
        self.unsettled = 0
        #: Monotonic time the latest heartbeat the server confirmed was sent (start counts as one).
        self.heartbeat_confirmed_at = time.monotonic()
        #: Bumped when a heartbeat gap may have let the broker recover this process's leases:
        #: a buffered task leased in an older epoch is handed back, not run.
        self.trust_epoch = 0
        #: Longest heartbeat gap after which buffered leases are not trusted, seconds.
        self.trust_s = backend.config.worker_timeout * HEARTBEAT_TRUST_SHARE
        self.finished = threading.Event()
        #: Sends the first heartbeat (`TelemetryPublisher.beat`, which registers it); the fetcher calls it.
        self.first_heartbeat: Callable[[], None] | None = None
        #: Set once the fetcher sent the first heartbeat (or has none to send): the heartbeat thread's
        #: own beats start an interval after it.
        self.announced = threading.Event()
        #: Time limit of a task with none of its own (the alias's `task_timeout`), seconds or None.
        self.default_limit_s = backend.config.task_timeout
        self.watchdog = Watchdog(backend.config.timeout_grace, self._give_up, kill_at)
        #: Set when a task outlived its limit and grace: the process exits to be replaced.
        self.timed_out = False
        #: Runs an abort request reached, by lease token: what their TaskCancelled says.
        self.aborted: dict[str, str] = {}
        self._next_abort_check_at = 0.0
        #: Why tasks still running at the shutdown deadline are interrupted, as recorded on them.
        self._interrupted_because = ""
        self._shutdown_at = float("inf")
        self._outcomes_since = 0.0
        self._next_fetch_at = 0.0
        #: Whether the last acquire leased nothing: an idle process then acknowledges before fetching again.
        self._last_fetch_empty = False
        self._poll_pause = backend.config.poll_interval
        self._offline_until = 0.0
        self._offline_since: float | None = None
        self._reconnect_pause = RECONNECT_PAUSE_S
        self._unanswered: list[str] = []
        #: Lease token of the last task that ran alone; nothing starts while it is running.
        self._alone = ""
        #: Set when an acquire found nothing and nothing is held: block on the wake lists next.
        self._idle = False
        #: Monotonic time the idle waits end in a fetch: IDLE_WAIT_S after the acquire that found
        #: nothing, or sooner, at a held-back queue's next rate token.
        self._idle_until = 0.0
        #: Set while the turn after a wait has not fetched: a token it took is passed on if it will not.
        self._woken = False
        self._lock = threading.Lock()
        self._has_tasks = threading.Condition(self._lock)
        self._has_work = threading.Condition(self._lock)

    def start(self) -> None:
        """Start the consumer threads and the fetcher thread."""
        sender = type(self.backend)
        self.consumers_alive = self.config.threads
        self._executors = [Executor(sender, self.watchdog) for _ in range(self.config.threads)]
        threads = [
            threading.Thread(target=self._consume, args=(executor,), name=f"consumer-{i}", daemon=True)
            for i, executor in enumerate(self._executors, 1)
        ]
        threads.append(threading.Thread(target=self._fetch, name="fetcher", daemon=True))
        for thread in threads:
            thread.start()

    def stop(self, because: str = "") -> bool:
        """Stop: hand buffered tasks back, let running ones finish until the shutdown timeout.

        `because` is what the tasks still running then have recorded on their interrupted
        attempt, after the worker's name (default: the stop and its timeout).
        Returns False when the process was already stopping (a second stop signal).
        """
        with self._lock:
            if self.phase in (Phase.STOPPING, Phase.STOPPED):
                return False
            self._shutdown_at = time.monotonic() + self.config.shutdown_timeout
            self._interrupted_because = because or self._interrupted_because
            self._enter(Phase.STOPPING)
            return True

    def quiet(self) -> bool:
        """Stop fetching for good but keep running what is held, and stay alive; False unless it was fetching."""
        with self._lock:
            if self.phase is not Phase.FETCHING:
                return False
            self._enter(Phase.QUIET)
            return True

    @property
    def busy(self) -> int:
        """Consumer threads running a task now."""
        return len(self.running)

    @property
    def holds_leases(self) -> bool:
        """Whether any task leased by this process is not yet acknowledged or handed back."""
        return self.left_leases or bool(self.buffer or self.running or self.outcomes or self.unstarted)

    @property
    def named_on_server(self) -> bool:
        """Whether a lease on the server may still name this process: then it must not say goodbye."""
        return self.left_leases or self.unsettled > 0 or bool(self._unanswered)

    @property
    def exit_code(self) -> int:
        """The process's exit code once `finished` is set."""
        if self.failed:
            return EXIT_FAILED
        return EXIT_TIMED_OUT if self.timed_out else EXIT_RECYCLED if self.recycled else EXIT_OK

    def _enter(self, phase: Phase) -> None:
        """Move to `phase` (the lock held); the one place the phase changes."""
        if phase is Phase.STOPPING and self.buffer:
            self.unstarted.extend(entry.result for entry in self.buffer)
            self.buffer.clear()
        self.phase = phase
        self._has_work.notify()
        self._has_tasks.notify_all()
