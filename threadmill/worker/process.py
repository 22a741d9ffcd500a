"""One worker process: a fetcher thread, consumer threads and the bounded buffer between them.

The **fetcher** is the only thread that talks to the server about tasks. Once half the buffer
is free it leases as many tasks as there are free slots, in one acquire. The buffer's size is
fixed, or by default sized by time (`prefetch.Prefetch`: about `--prefetch-window` of work by
the moving average of run time the consumers feed it). It acknowledges finished tasks in one
acknowledge_many call, apart from fetching: once a batch is waiting (a buffer's worth when
sized by time, else at least `ACK_BATCH`), `ACK_DELAY_S` after the first of them finished, or
at once when the consumers have nothing left to run. **Consumers** take tasks in lease order and never touch the server, so a fast
task costs a fraction of a round trip, except for a suspect (a task that was in a lost
worker's lease): its consumer records the run's start and finish (`record_progress`), and one
that would fail at its next lost worker runs alone (`runs_alone`), so that loss is its own.
A consumer never starts a task whose lease may have run out while it waited in the buffer
(by this process's monotonic clock): that task is handed back instead. The heartbeat is sent
by the telemetry thread, which reports each one the server stored. A process that saw no
stored heartbeat for `HEARTBEAT_TRUST_SHARE` of `worker_timeout` (it was frozen, starved or
cut off) may have had its leases recovered by the broker: it starts nothing buffered on trust
and fetches nothing until a heartbeat is stored again, and hands everything it buffered before
the gap back (fenced by lease token, so a task the broker already took is left alone). Only a
task that was running at the freeze may run again; its late acknowledgement is refused.

The process moves through these phases (`Phase`); `_enter` is the only place that changes it:

- FETCHING -> DRAINING: the `--max-tasks` budget is spent, or `--exit-empty` found nothing ready.
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

Aborts: while a task has run `ABORT_CHECK_INTERVAL_S` or more, the fetcher reads, at most that
often and in one read-only call, whether an abort was requested for any such run, and hands a
request to the run's executor (`Executor.request_abort`); the watchdog raises `TaskCancelled`
in it `abort_grace` later. A drain of short tasks never makes the call. A run aborted and still
going at the shutdown deadline is recorded FAILED with `TaskCancelled`, not handed back.

An idle process (nothing ready, nothing held) does not poll: it blocks on its queues' wake
lists, which every script that makes a task ready pushes one token onto (one token wakes one
worker; a full acquire passes it on), and on its own wake list, which a stop signal pushes.
A process that turns quiet or stopping while it waits passes on the token it may have taken.

Riding out the server: a call that cannot reach it (`ServerUnreachable`) keeps everything in
memory (buffered tasks still run, outcomes wait) and the fetcher tries again after a pause that
doubles from `RECONNECT_PAUSE_S` to `RECONNECT_MAX_PAUSE_S`. Acknowledgements are fenced by
lease token, so one that arrives after the broker took the task back is refused. The leases
an acquire took whose reply was lost are handed back once the server answers again.

Invariants: the fetcher never leases past the `--max-tasks` budget, so every leased task runs
or is handed back; and the process says goodbye (leaves the workers set) only when every lease
it took was acknowledged or handed back by a call the server answered (`named_on_server`),
otherwise its heartbeat ages and the broker recovers the rest. A task's BaseException
(`sys.exit()`, KeyboardInterrupt) is its outcome, like any failure: the consumer thread lives on.
"""

from __future__ import annotations

import copy
import enum
import logging
import os
import random
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from ..backends.base import ThreadmillTaskResult, time_limit_s
from ..exceptions import ServerUnreachable, TaskCancelled, TaskTimeout
from ..outcome import cancelled_error, error_of, mark_failed, record_abandoned, retry_delay, runs_alone
from ..progress import PendingReport, TaskReports, running
from .config import EXIT_FAILED, EXIT_RECYCLED, EXIT_TIMED_OUT, WorkerConfig
from .executor import Executor, Outcome
from .prefetch import SHED_FACTOR, Prefetch
from .watchdog import Armed, Watchdog

if TYPE_CHECKING:
    from ..backends.redis import RedisTaskBackend

logger = logging.getLogger("threadmill.worker")

#: Longest time a finished task waits in the process for its acknowledgement, seconds.
ACK_DELAY_S = 0.02
#: Finished tasks that trigger an acknowledgement before `ACK_DELAY_S` is up. Acknowledging
#: is decoupled from fetching: one call costs about as much CPU as three echo tasks, and
#: batching it at 100 instead of at each 4-task fetch saved a third of the CPU per task.
ACK_BATCH = 100
#: Buffer size from which a lone consumer wakes the fetcher at the refill mark.
WAKE_AT_REFILL_SIZE = 32
#: First pause before calling an unreachable server again, seconds.
RECONNECT_PAUSE_S = 0.05
#: Longest such pause, seconds: short, so a drain resumes within seconds of the server's return.
RECONNECT_MAX_PAUSE_S = 2.0
#: Longest an idle process blocks on its queues' wake lists before it looks again, seconds.
#: An enqueue wakes it at once; the timeout only bounds what a lost token could cost.
IDLE_WAIT_S = 5.0
#: Shortest run, and pause between two looks, after which the fetcher looks for abort requests, seconds:
#: a request reaches a run within about twice this, and tasks shorter than it never cost a call.
ABORT_CHECK_INTERVAL_S = 0.5
#: Share of `worker_timeout` a heartbeat gap may reach before buffered leases are no longer
#: trusted. The broker recovers a worker silent for the whole timeout; half leaves room for a
#: slow heartbeat call and the two clocks, and is still twice the heartbeat interval.
HEARTBEAT_TRUST_SHARE = 0.5


class Phase(enum.Enum):
    """Where a worker process is in its life; see the module docstring for the transitions."""

    FETCHING = "fetching"
    QUIET = "quiet"
    DRAINING = "draining"
    STOPPING = "stopping"
    STOPPED = "stopped"


@dataclass(slots=True)
class Buffered:
    """A leased task waiting for a consumer, the monotonic time its lease may have run out by, and its trust epoch."""

    result: ThreadmillTaskResult
    expires: float
    epoch: int


@dataclass(slots=True)
class Work:
    """What the fetcher does in one turn, taken from the shared state under the lock."""

    release: list[ThreadmillTaskResult] = field(default_factory=list)
    outcomes: list[Outcome] = field(default_factory=list)
    interrupted: list[ThreadmillTaskResult] = field(default_factory=list)
    reports: list[PendingReport] = field(default_factory=list)
    #: Runs whose abort requests to look for.
    abort_check: list[ThreadmillTaskResult] = field(default_factory=list)
    lease: int = 0
    wait_for_wake: bool = False
    pass_wake: bool = False
    last: bool = False


class WorkerProcess:
    """Leases tasks into a buffer, runs them on consumer threads and acknowledges them."""

    def __init__(self, backend: RedisTaskBackend, config: WorkerConfig, name: str, kill_at=None) -> None:
        self.backend = backend
        self.config = config
        self.name = name
        #: The consumers' executors, whose `started_at` tells the fetcher how long the runs going on took so far.
        self._executors: list[Executor] = []
        self.prefetch = Prefetch(config.threads, config.prefetch_count, config.prefetch_window, backend.config.lease_ttl)
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
        self._poll_pause = backend.config.poll_interval
        self._offline_until = 0.0
        self._offline_since: float | None = None
        self._reconnect_pause = RECONNECT_PAUSE_S
        self._unanswered: list[str] = []
        #: Lease token of the last task that ran alone; nothing starts while it is running.
        self._alone = ""
        #: Set when an acquire found nothing and nothing is held: block on the wake lists next.
        self._idle = False
        #: Set while the turn after a wait has not fetched: a token it took is passed on if it will not.
        self._woken = False
        self._lock = threading.Lock()
        self._has_tasks = threading.Condition(self._lock)
        self._has_work = threading.Condition(self._lock)

    # -- lifecycle --------------------------------------------------------------------

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

    def stop(self) -> bool:
        """Stop: hand buffered tasks back, let running ones finish until the shutdown timeout.

        Returns False when the process was already stopping (a second stop signal).
        """
        with self._lock:
            if self.phase in (Phase.STOPPING, Phase.STOPPED):
                return False
            self._shutdown_at = time.monotonic() + self.config.shutdown_timeout
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
        return EXIT_TIMED_OUT if self.timed_out else EXIT_RECYCLED if self.recycled else 0

    def _enter(self, phase: Phase) -> None:
        """Move to `phase` (the lock held); the one place the phase changes."""
        if phase is Phase.STOPPING and self.buffer:
            self.unstarted.extend(entry.result for entry in self.buffer)
            self.buffer.clear()
        self.phase = phase
        self._has_work.notify()
        self._has_tasks.notify_all()

    # -- the fetcher ------------------------------------------------------------------

    def _fetch(self) -> None:
        try:
            while (work := self._next_work()) is not None:
                done = self._carry_out(work)
                if work.last:
                    self.left_leases = not done
                    break
        except Exception:
            logger.exception(
                "A call to the server failed on queues %s; this worker process stops.", ", ".join(self.config.queues)
            )
            self.failed = self.left_leases = True
        finally:
            with self._lock:
                if self.buffer:
                    logger.warning("%d leased tasks were not run; the broker will recover them.", len(self.buffer))
                    self.buffer.clear()
                    self.left_leases = True
                self._enter(Phase.STOPPED)
            self.finished.set()

    def _next_work(self) -> Work | None:
        """Wait until there is something to do and take it from the shared state; None once settled."""
        with self._lock:
            while True:
                now = time.monotonic()
                if now >= self._shutdown_at:
                    return self._take_last_work()
                if now >= self._offline_until:
                    work = self._due_work(now)
                    if work is not None:
                        return work
                if self._settled():
                    return None
                if not self.consumers_alive and self.phase in (Phase.FETCHING, Phase.QUIET):
                    # Draining or stopping, consumers leave once nothing is buffered: only here is it a death.
                    logger.error("Every consumer thread of this worker process died; it stops and is replaced.")
                    self.failed = True
                    self._shutdown_at = now
                    self._enter(Phase.STOPPING)
                    continue
                self._has_work.wait(self._wait_time(now))

    def _due_work(self, now: float) -> Work | None:
        """Take what is due now (the lock held): hand-backs, acknowledgements and a fetch."""
        work = Work()
        if self.prefetch.auto:
            self._resize()
            self._shed_surplus()
        if self.unstarted:
            work.release, self.unstarted = self.unstarted, []
        work.lease = self._fetch_size(now)
        if self.outcomes and self._acknowledgement_due(now, work.lease):
            work.outcomes, self.outcomes = self.outcomes, []
        if self.reports:
            work.reports = self.reports.due(now, {o.result.lease_token for o in work.outcomes})
        if now >= self._next_abort_check_at and self.running:
            work.abort_check = self._abort_candidates()
            if work.abort_check:
                self._next_abort_check_at = now + ABORT_CHECK_INTERVAL_S
        if work.lease and self.budget is not None:
            self.budget -= work.lease
        if self._woken and (work.lease or self.phase is not Phase.FETCHING):
            # Quiet or stopping since it waited: the wake token it took would wake no one else.
            self._woken, work.pass_wake = False, not work.lease
        if (
            work.release or work.outcomes or work.reports or work.abort_check or work.lease or work.pass_wake
            or self._unanswered
        ):  # fmt: skip
            return work
        if self._idle and self.phase is Phase.FETCHING:
            # The fetch after the wait comes at once, whether a token or the timeout ended it.
            self._idle, self._next_fetch_at, self._woken = False, 0.0, True
            work.wait_for_wake = True
            return work
        return None

    def _abort_candidates(self) -> list[ThreadmillTaskResult]:
        """The runs going on for `ABORT_CHECK_INTERVAL_S` or more that no abort reached yet (the lock held)."""
        since = time.perf_counter() - ABORT_CHECK_INTERVAL_S
        candidates = []
        for executor in self._executors:
            result, started = executor.current, executor.started_at
            if result is not None and started is not None and started <= since:
                if result.lease_token not in self.aborted:
                    candidates.append(result)
        return candidates

    def _deliver_aborts(self, results: list[ThreadmillTaskResult]) -> None:
        """Look for abort requests of these runs and hand each one found to its run's executor."""
        requests = self.backend.aborts_requested(results)
        grace_s = self.backend.config.abort_grace
        for result in results:
            request = requests.get(result.lease_token)
            if request is None:
                continue
            at = datetime.fromtimestamp(request["at"], UTC).isoformat()
            message = f"Task {result.id} was aborted by {request['by']} (requested at {at})."
            for executor in self._executors:
                if executor.current is result and executor.request_abort(result, message, grace_s):
                    with self._lock:
                        if result.lease_token in self.running:
                            self.aborted[result.lease_token] = message
                    logger.warning(
                        "Task %s: %s asked to abort it; TaskCancelled is raised in it in %g s unless it ends.",
                        result.id, request["by"], grace_s,
                    )  # fmt: skip

    def _take_last_work(self) -> Work:
        """At the shutdown deadline, take everything still held (the lock held): the last turn."""
        release = self.unstarted + [entry.result for entry in self.buffer]
        work = Work(release=release, outcomes=self.outcomes, interrupted=list(self.running.values()), last=True)
        if self.reports:
            held = {r.lease_token for r in work.interrupted} | {o.result.lease_token for o in work.outcomes}
            work.reports = self.reports.due(time.monotonic(), held)
        self.unstarted, self.outcomes = [], []
        self.buffer.clear()
        self.running.clear()
        return work

    def _acknowledgement_due(self, now: float, fetching: int) -> bool:
        # An idle process acknowledges at once unless it is about to fetch: the acknowledgement
        # then waits for a full batch or its delay, so a drain makes few calls.
        idle = not self.running and not self.buffer
        return (
            (idle and not fetching)
            or self.phase is not Phase.FETCHING
            or len(self.outcomes) >= self.ack_batch
            or now - self._outcomes_since >= ACK_DELAY_S
        )

    def _fetch_size(self, now: float) -> int:
        """How many tasks to lease now: 0 unless fetching, due, and half the buffer is free."""
        if self.phase is not Phase.FETCHING or now < self._next_fetch_at or not self.consumers_alive:
            return 0
        if now - self.heartbeat_confirmed_at > self.trust_s:
            return 0  # the broker may take what it leases now; the next confirmed heartbeat wakes the fetcher
        free = self.size - len(self.buffer)
        if free < self.refill_at:
            return 0
        return free if self.budget is None else min(free, self.budget)

    def _shed_surplus(self) -> None:
        """Hand back the newest buffered tasks beyond the size (the lock held), when far more are held.

        They were leased while tasks ran faster: kept, they would wait here while another
        process, or a task enqueued since, could start. Not while draining: the budget is spent.
        """
        if self.phase is not Phase.FETCHING or len(self.buffer) < SHED_FACTOR * self.size:
            return
        surplus = [self.buffer.pop().result for _ in range(len(self.buffer) - self.size)]
        surplus.reverse()
        if self.budget is not None:
            self.budget += len(surplus)
        self.unstarted.extend(surplus)
        logger.info(
            "%d buffered tasks go back to ready: tasks now take %.0f ms, so %d hold the buffer's window.",
            len(surplus),
            1000 * (self.prefetch.run_s or 0.0),
            self.size,
        )

    def _resize(self) -> None:
        """Follow the prefetch's size (the lock held): the refill mark and the acknowledgement batch with it."""
        started = [at for executor in self._executors if (at := executor.started_at) is not None]
        self.size = self.prefetch.resize(time.perf_counter() - min(started) if started else 0.0)
        #: Free slots that trigger a fetch. Refilling at half empty, not at every free slot,
        #: keeps batches large: a fetch costs about as much CPU as running four echo tasks.
        self.refill_at = max(1, self.size // 2)
        # Sized by time, a batch is a buffer's worth: slow tasks are acknowledged one by one at once.
        self.ack_batch = self.size if self.prefetch.auto else max(ACK_BATCH, self.size)
        # Several consumers need the early refill. A lone one with a small buffer runs it dry
        # before the fetcher gets the GIL anyway, and a wake-up per few tasks cost about a fifth
        # more CPU per echo task; with a large one, the wake-up is rare and hides the acquire.
        self._wake_at_refill = self.config.threads > 1 or self.size >= WAKE_AT_REFILL_SIZE

    def _settled(self) -> bool:
        """Whether a draining or stopping process has nothing left to run, acknowledge or hand back."""
        return self.phase in (Phase.DRAINING, Phase.STOPPING) and not self.holds_leases and not self._unanswered

    def _wait_time(self, now: float) -> float | None:
        deadlines = [self._shutdown_at]
        if now < self._offline_until:
            deadlines.append(self._offline_until)
        elif self.outcomes:
            deadlines.append(self._outcomes_since + ACK_DELAY_S)
        elif self.running or self.buffer:
            deadlines.append(now + ACK_DELAY_S)
        elif self.phase is Phase.FETCHING:
            deadlines.append(self._next_fetch_at)
        deadline = min(deadlines)
        return None if deadline == float("inf") else max(0.0, deadline - now)

    def _carry_out(self, work: Work) -> bool:
        """Do one turn's server calls; False when the server was unreachable (what was not done is kept)."""
        try:
            if self._unanswered:
                self.backend.release_unanswered(self.config.queues, self._unanswered)
                self._unanswered = []
            if work.reports:
                # Before the acknowledgements, fenced by the same leases: the last values are kept.
                self._write_reports(work.reports)
                work.reports = []
            if work.abort_check:
                self._deliver_aborts(work.abort_check)
                work.abort_check = []
            if work.release:
                self.backend.release(work.release)
                self._settled_leases(len(work.release))
                work.release = []
            if work.outcomes:
                self._settle(work.outcomes)
                self._settled_leases(len(work.outcomes))
                work.outcomes = []
            if work.interrupted:
                self._hand_back_interrupted(work.interrupted)
                self._settled_leases(len(work.interrupted))
            if work.lease:
                self._lease(work.lease)
                work.lease = 0
            if work.wait_for_wake:
                self.backend.wait_for_tasks(self.config.queues, self.name, IDLE_WAIT_S)
            if work.pass_wake:
                self.backend.pass_wake_on(self.config.queues)
        except ServerUnreachable as e:
            if not work.last:
                self._wait_for_server(work, e)
            return False
        if self._offline_since is not None:
            logger.warning("The server answers again after %.1f s.", time.monotonic() - self._offline_since)
            self._offline_since, self._reconnect_pause = None, RECONNECT_PAUSE_S
        return True

    def _settled_leases(self, count: int) -> None:
        with self._lock:
            self.unsettled -= count

    def _wait_for_server(self, work: Work, error: ServerUnreachable) -> None:
        """Keep what `work` did not do for the next turn and pause before calling again."""
        now = time.monotonic()
        with self._lock:
            self.unstarted[:0] = work.release
            if work.outcomes:
                self.outcomes[:0] = work.outcomes
                self._outcomes_since = now
            if work.lease and self.budget is not None:
                self.budget += work.lease
            pause = self._reconnect_pause
            self._offline_until = now + pause
            self._reconnect_pause = min(2 * pause, RECONNECT_MAX_PAUSE_S)
        if self._offline_since is None:
            self._offline_since = now
        # Logged once per backoff step, not once per attempt: the step stops growing at its cap.
        if pause < RECONNECT_MAX_PAUSE_S:
            logger.warning("%s; keeping %s and trying again in %.2f s.", error, self._held_summary(), pause)

    def _held_summary(self) -> str:
        return (
            f"{len(self.buffer)} buffered, {len(self.running)} running and "
            f"{len(self.outcomes)} finished tasks in memory"
        )

    def _lease(self, count: int) -> None:
        token_base = os.urandom(6).hex()
        sent_at = time.monotonic()
        expires = sent_at + self.backend.config.lease_ttl
        epoch = self.trust_epoch
        try:
            results = self.backend.acquire(*self.config.queues, count=count, worker=self.name, token_base=token_base)
        except ServerUnreachable:
            # The server may have run the call and leased tasks whose reply was lost.
            self._unanswered.append(token_base)
            raise
        answered_at = time.monotonic()
        with self._lock:
            self.prefetch.acquired(answered_at - sent_at)
            if self.budget is not None and len(results) < count:
                self.budget += count - len(results)
            self.unsettled += len(results)
            if results and (self.phase is Phase.STOPPING or epoch != self.trust_epoch):
                # The reply came after stop() emptied the buffer, or after a heartbeat gap: hand them back.
                logger.info("%d tasks leased by a call answered after %s go back to ready.", len(results),
                            "the stop" if self.phase is Phase.STOPPING else "a heartbeat gap")
                self.unstarted.extend(results)
            elif results:
                self._poll_pause = self.backend.config.poll_interval
                self.buffer.extend(Buffered(result, expires, epoch) for result in results)
                self._has_tasks.notify(len(results))
            elif not self.holds_leases and not self.config.exit_empty:
                # Nothing ready and nothing held: wait on the server, woken by the next enqueue.
                self._idle, self._next_fetch_at = True, float("inf")
            else:
                # Tasks still run here: poll, so their acknowledgements are not held up by a wait.
                self._next_fetch_at = time.monotonic() + self._poll_pause
                self._poll_pause = min(2 * self._poll_pause, self.backend.config.poll_max_interval)
            if self.phase is Phase.FETCHING:
                if self.budget is not None and self.budget <= 0:
                    self.recycled = True
                    self._enter(Phase.DRAINING)
                elif not results and self.config.exit_empty:
                    self._enter(Phase.DRAINING)

    def _write_reports(self, pending: list[PendingReport]) -> None:
        """Store what running tasks reported; a first metadata write that met stored metadata goes again, merged."""
        while pending:
            replies = self.backend.report([p.entry for p in pending])
            pending = self.reports.written(pending, replies, time.monotonic())

    def _settle(self, outcomes: list[Outcome]) -> None:
        """Acknowledge finished tasks and requeue the ones to retry."""
        acknowledged = [(o.result, o.return_value) for o in outcomes if o.retry_after is None]
        if acknowledged:
            self.backend.acknowledge_many(acknowledged)
        for outcome in outcomes:
            if outcome.retry_after is not None:
                self.backend.requeue(outcome.result, run_after=outcome.retry_after)

    def _hand_back_interrupted(self, results: list[ThreadmillTaskResult]) -> None:
        because = (
            self._interrupted_because
            or f"stopped and interrupted this attempt after {self.config.shutdown_timeout:g} s"
        )
        for result in results:
            interrupted = copy.copy(result)
            object.__setattr__(interrupted, "errors", list(result.errors))
            message = self.aborted.pop(result.lease_token, None)
            if message is not None:
                # An abort reached it: interrupted now, it ends cancelled, not run again.
                mark_failed(interrupted, cancelled_error(f"{message} Worker {self.name} {because}."), datetime.now(UTC))
                self.backend.acknowledge_many([(interrupted, None)])
                continue
            record_abandoned(interrupted, f"Worker {self.name} {because}.")
            self.backend.requeue(interrupted)
            logger.warning("Task %s was still running at the shutdown deadline; it goes back to ready.", result.id)

    def _give_up(self, armed: Armed) -> None:
        """Replace this process: a task did not end `timeout_grace` after its limit (the watchdog's thread)."""
        result, now = armed.result, time.monotonic()
        with self._lock:
            if self.running.pop(result.lease_token, None) is None:
                return  # it ended, or was handed back, meanwhile
            timed_out = copy.copy(result)
            object.__setattr__(timed_out, "errors", list(result.errors))
            aborted = self.aborted.pop(result.lease_token, None)
            if aborted is not None:
                message = f"{aborted} It had not ended {armed.limit_s + self.watchdog.grace_s:g} s later; "
                mark_failed(timed_out, error_of(TaskCancelled(f"{message}worker {self.name} was replaced.")),
                            datetime.now(UTC))  # fmt: skip
            else:
                message = (
                    f"Task {result.id} passed its time limit of {armed.limit_s:g} s and had not ended "
                    f"{self.watchdog.grace_s:g} s later; worker {self.name} was replaced."
                )
                mark_failed(timed_out, error_of(TaskTimeout(message)), datetime.now(UTC))
            if not self.outcomes:
                self._outcomes_since = now
            self.outcomes.append(Outcome(timed_out, None, None if aborted is not None else retry_delay(timed_out)))
            self.timed_out = True
            self._interrupted_because = f"was replaced after task {result.id} outlived its time limit"
            self._shutdown_at = now
            if self.phase is Phase.STOPPED:
                return
            if self.phase is not Phase.STOPPING:
                self._enter(Phase.STOPPING)
            self._has_work.notify()

    # -- the consumers ----------------------------------------------------------------

    def _consume(self, executor: Executor) -> None:
        lock, buffer, outcome, result, ran_s = self._lock, self.buffer, None, None, 0.0
        clock = time.perf_counter
        executor.thread_id, running.executor = threading.get_ident(), executor
        try:
            while True:
                with lock:
                    if outcome is not None:
                        self._finish(outcome, ran_s)
                    outcome = result = None
                    while result is None:
                        if not buffer or self._held_back():
                            if not self._wait_for_tasks():
                                return
                            executor.idle = True
                        entry = self._take_runnable(buffer.popleft())
                        result = None if entry is None else entry.result
                    self.running[result.lease_token] = result
                    if runs_alone(result):
                        self._alone = result.lease_token
                    # Edge-triggered: the fetcher re-checks before it waits, and a wake-up
                    # per task cost more CPU than the echo task itself.
                    if self._wake_at_refill and self.size - len(buffer) == self.refill_at:
                        self._has_work.notify()
                if result.worker_losses is not None and not self._record_start(result):
                    result = None
                    continue
                limit_s = time_limit_s(result.task, self.default_limit_s)
                if limit_s is not None and not self._cover_lease(result, entry.expires, limit_s):
                    result = None
                    continue
                executor.started_at = started = clock()
                outcome = self._run(executor, result, limit_s)
                ran_s = clock() - started
                executor.started_at = None
                if result.worker_losses is not None:
                    self._record_finish(result)
        finally:
            executor.started_at = None
            with lock:
                self.consumers_alive -= 1
                self._has_tasks.notify_all()  # It may have run alone.
                if outcome is not None:
                    self._finish(outcome, ran_s)
                elif result is not None and self.running.pop(result.lease_token, None) is not None:
                    # Not reached by task code (its BaseExceptions are outcomes): the broker recovers it.
                    logger.error("Task %s stopped its consumer thread; its lease is left to the broker.", result.id)
                    self.left_leases = True
                self._has_work.notify()
            executor.close()

    def _take_runnable(self, entry: Buffered) -> Buffered | None:
        """Return `entry` when its task may run, or None when its lease may be lost (it is handed back)."""
        now = time.monotonic()
        if entry.epoch != self.trust_epoch or now - self.heartbeat_confirmed_at > self.trust_s:
            # The broker may have recovered it while this process was silent: never start it on trust.
            self._distrust_buffer(entry, now)
            return None
        if now < entry.expires:
            return entry
        logger.warning("Task %s waited in the buffer past its lease; it is handed back, not run.", entry.result.id)
        self.unstarted.append(entry.result)
        self._has_work.notify()
        return None

    def _distrust_buffer(self, entry: Buffered | None, now: float) -> None:
        """Hand back `entry` and everything buffered (the lock held); the fenced release skips recovered ones."""
        handed_back = [entry.result] if entry is not None else []
        handed_back.extend(e.result for e in self.buffer)
        self.buffer.clear()
        if handed_back:
            logger.warning(
                "No heartbeat of worker process %s was confirmed for %.1f s: %d buffered tasks go back "
                "unstarted (the broker may have recovered them).",
                self.name,
                now - self.heartbeat_confirmed_at,
                len(handed_back),
            )
            self.unstarted.extend(handed_back)
            self._has_work.notify()

    def heartbeat_confirmed(self, sent_at: float) -> None:
        """Record that the server stored a heartbeat sent at monotonic `sent_at`; a long gap distrusts the buffer."""
        with self._lock:
            now = time.monotonic()
            if now - self.heartbeat_confirmed_at > self.trust_s:
                self.trust_epoch += 1
                self._distrust_buffer(None, now)
            self.heartbeat_confirmed_at = max(self.heartbeat_confirmed_at, sent_at)
            self._has_work.notify()

    def _wait_for_tasks(self) -> bool:
        """Wait, holding the lock, until a buffered task may start; False once none will come."""
        while not self.buffer or self._held_back():
            if not self.buffer and self.phase not in (Phase.FETCHING, Phase.QUIET):
                return False
            self._has_work.notify()
            self._has_tasks.wait()
        return True

    def _held_back(self) -> bool:
        """Whether the next buffered task must wait (the lock held): one that runs alone, or any while one does."""
        return bool(self.running) and (self._alone in self.running or runs_alone(self.buffer[0].result))

    def _record_start(self, result: ThreadmillTaskResult) -> bool:
        """Record a suspect's start on the server; False when it must not run (it is dropped or handed back)."""
        try:
            if self.backend.record_progress(result, "started"):
                return True
            logger.warning("Task %s was taken back before it started; it is not run here.", result.id)
            unstarted = []
        except Exception as e:  # noqa: BLE001 - unrecorded, the start could not be blamed exactly
            logger.warning("Recording the start of task %s failed (%s); it is handed back, not run.", result.id, e)
            unstarted = [result]
        self._drop_unstarted(result, unstarted)
        return False

    def _cover_lease(self, result: ThreadmillTaskResult, expires: float, limit_s: float) -> bool:
        """Make the lease outlast the run and its escalation; False when it must not run (dropped or handed back).

        A run ends by its limit + grace, or the process is replaced; its supervisor kills it one
        grace later still. Only a lease shorter than that costs a round trip.
        """
        cover_s = limit_s + 2 * self.watchdog.grace_s
        if time.monotonic() + cover_s <= expires:
            return True
        try:
            if self.backend.extend_lease(result, cover_s):
                return True
            logger.warning("Task %s was taken back before it started; it is not run here.", result.id)
            unstarted = []
        except Exception as e:  # noqa: BLE001 - without a lease that covers the run it must not start
            logger.warning("Extending the lease of task %s failed (%s); it is handed back, not run.", result.id, e)
            unstarted = [result]
        self._drop_unstarted(result, unstarted)
        return False

    def _drop_unstarted(self, result: ThreadmillTaskResult, unstarted: list[ThreadmillTaskResult]) -> None:
        with self._lock:
            self.running.pop(result.lease_token, None)
            self.unstarted += unstarted
            self._has_work.notify()
            self._has_tasks.notify_all()

    def _record_finish(self, result: ThreadmillTaskResult) -> None:
        try:
            self.backend.record_progress(result, "finished")
        except Exception as e:  # noqa: BLE001 - a lost worker then blames this run, as it would without a record
            logger.warning("Recording the finish of task %s failed: %s", result.id, e)

    def _finish(self, outcome: Outcome, ran_s: float) -> None:
        if self.running.pop(outcome.result.lease_token, None) is None:
            return  # handed back at the shutdown deadline; the process is exiting
        if self.aborted:
            self.aborted.pop(outcome.result.lease_token, None)
        self.prefetch.task_ran(ran_s)
        if outcome.result.lease_token == self._alone:
            self._has_tasks.notify_all()
        self.done += 1
        if not self.outcomes:
            self._outcomes_since = time.monotonic()
        self.outcomes.append(outcome)
        if len(self.outcomes) >= self.ack_batch or self.phase is Phase.STOPPING:
            self._has_work.notify()

    def _run(self, executor: Executor, result: ThreadmillTaskResult, limit_s: float | None) -> Outcome:
        running.task = (self.reports, result)
        try:
            return executor.run(result, limit_s)
        except BaseException as e:  # noqa: BLE001 - a consumer thread outlives whatever its task raised
            # Only a failing signal receiver gets here; the task itself is already settled.
            logger.exception("Running task %s failed outside the task code.", result.id)
            mark_failed(result, error_of(e), datetime.now(UTC))
            return Outcome(result, None, None)
        finally:
            running.task = None
