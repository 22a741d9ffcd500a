"""The fetcher of a worker process: the only thread that talks to the server about tasks.

Once half the buffer is free it leases as many tasks as there are free slots, in one acquire.
The buffer's size is fixed, or by default sized by time (`prefetch.Prefetch`: about
`--prefetch-window` of work by the moving average of run time the consumers feed it). It
acknowledges finished tasks in one acknowledge_many call, apart from fetching: once a batch is
waiting (a buffer's worth when sized by time, else at least `ACK_BATCH`), `ACK_DELAY_S` after
the first of them finished, or at once when the consumers have nothing left to run. In the
same turns it writes what running tasks reported (`threadmill.set_progress`, `set_metadata`;
before the acknowledgements, fenced by the same leases) and looks for abort requests
(`aborts.py`).

Under `--exit-empty` a fetch that leases nothing ends the fetching, unless a workflow task of the
process's queues waits while one of them holds a ready or running task (`awaits_release`): its
parent may be that task, so the process goes on as if it were not draining, until nothing can
release a waiting task any more (a parent in a queue it does not serve is not waited for).

An idle process (nothing ready, nothing held) does not poll: it blocks on its queues' wake
lists, which every script that makes a task ready pushes one token onto (one token wakes one
worker; a full acquire passes it on), and on its own wake list, which a stop signal pushes.
It always waits there, never on its lock: when its per-task counts are due first, the wait
ends at their turn, it sends them and waits again, fetching only once a token or the idle
deadline (`IDLE_WAIT_S`, or a held-back queue's next rate token) ends a wait.
A process that turns quiet or stopping while it waits passes on the token it may have taken.

Riding out the server: a call that cannot reach it (`ServerUnreachable`), or that a full server
refuses (`ServerOutOfMemory`: this release's task path scripts run on a full server, an older
release's do not), keeps everything in memory (buffered tasks still run, outcomes wait) and the
fetcher tries again after a pause that doubles from `RECONNECT_PAUSE_S` to `RECONNECT_MAX_PAUSE_S`.
Acknowledgements are fenced by
lease token, so one that arrives after the broker took the task back is refused. The leases
an acquire took whose reply was lost are handed back once the server answers again.

Invariant: the fetcher never leases past the `--max-tasks` budget, so every leased task runs
or is handed back.
"""

from __future__ import annotations

import copy
import logging
import os
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime

from ..base import ThreadmillTaskResult
from ..exceptions import BackendConnectionError, ServerOutOfMemory, ServerUnreachable
from ..outcome import cancelled_error, mark_failed, record_abandoned
from .aborts import ABORT_CHECK_INTERVAL_S
from .executor import Outcome
from .host import ProcessHost
from .prefetch import SHED_FACTOR
from .reports import PendingReport
from .state import Buffered, Phase

logger = logging.getLogger("threadmill.worker")

#: What the fetcher rides out, keeping its work in memory: a server it cannot reach, or a full one.
RIDDEN_OUT = (ServerUnreachable, ServerOutOfMemory)

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
    #: Seconds to block on the wake lists (None: no wait).
    wait_s: float | None = None
    pass_wake: bool = False
    #: Send the per-task-path counts (`taskstats.py`).
    send_stats: bool = False
    last: bool = False


class Fetcher(ProcessHost):
    """Mixed into `WorkerProcess`: the fetcher thread's loop, one turn of server calls at a time.

    Uses all of the process's shared state, under its lock; the server calls run outside it.
    """

    def _fetch(self) -> None:
        try:
            while (work := self._next_work()) is not None:
                done = self._carry_out(work)
                if not self.announced.is_set():
                    self._announce()
                if work.last:
                    self.left_leases = not done
                    break
            self._send_last_task_stats()
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
            self.announced.set()
            self.finished.set()

    def _announce(self) -> None:
        """Send the first heartbeat after the first acquire, on its connection, as its tasks start; never raises."""
        if self.first_heartbeat is not None:
            self.first_heartbeat()
        self.announced.set()

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
        """Take what is due now (the lock held): hand-backs, acknowledgements, a fetch or an idle wait."""
        work = Work()
        if self._idle and now >= self._idle_until:
            # The idle deadline passed in a turn between waits: fetch, as after a wait that reached it.
            self._idle, self._next_fetch_at = False, 0.0
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
        if self.task_stats and now >= self.task_stats.next_send_at:
            work.send_stats = True
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
            or work.send_stats or self._unanswered
        ):  # fmt: skip
            return work
        if self._idle and self.phase is Phase.FETCHING:
            # Set for the fetch that follows a token or the idle deadline; a wait that ends sooner,
            # at the counts' turn, goes back to idle (`_rest_again`). Waiting on the lock for that
            # turn instead held up a task enqueued meanwhile until it came (up to FLUSH_INTERVAL_S).
            self._idle, self._next_fetch_at, self._woken = False, 0.0, True
            until = self._idle_until
            if self.task_stats:
                until = min(until, self.task_stats.next_send_at)
            work.wait_s = until - now
            return work
        return None

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
        # then waits for a full batch or its delay, so a drain makes few calls. Unless its last fetch
        # found nothing: the next task may be the one this acknowledgement releases (a chain's next
        # step), and the fetch in the same turn comes after it.
        idle = not self.running and not self.buffer
        return (
            (idle and (not fetching or self._last_fetch_empty))
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
        if self.task_stats:
            deadlines.append(max(self.task_stats.next_send_at, self._offline_until))
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
                self._fetch_once_idle()
                work.outcomes = []
            if work.interrupted:
                self._hand_back_interrupted(work.interrupted)
                self._settled_leases(len(work.interrupted))
            if work.send_stats:
                self._send_task_stats(time.monotonic())
                work.send_stats = False
            if work.lease:
                self._lease(work.lease)
                work.lease = 0
            if work.wait_s is not None and not self.backend.wait_for_tasks(self.config.queues, self.name, work.wait_s):
                self._rest_again()
            if work.pass_wake:
                self.backend.pass_wake_on(self.config.queues)
        except RIDDEN_OUT as e:
            if not work.last:
                self._wait_for_server(work, e)
            return False
        if self._offline_since is not None:
            logger.warning("The server answers again after %.1f s.", time.monotonic() - self._offline_since)
            self._offline_since, self._reconnect_pause = None, RECONNECT_PAUSE_S
        return True

    def _rest_again(self) -> None:
        """After a wait that timed out before the idle deadline (cut short for the counts): stay idle."""
        with self._lock:
            if self.phase is Phase.FETCHING and time.monotonic() < self._idle_until:
                # No token was taken, so none is to be passed on.
                self._idle, self._next_fetch_at, self._woken = True, float("inf"), False

    def _fetch_once_idle(self) -> None:
        """After an acknowledgement that left the process with nothing to run: fetch now, not at the next poll.

        The fetch the poll would make anyway, made sooner, so it costs no call: it finds the child a
        workflow task's acknowledgement just released (the next step of a chain starts within a round
        trip, not a poll pause of 10 ms or more), or nothing, and the process goes idle on the wake lists.
        """
        with self._lock:
            if self.phase is Phase.FETCHING and not self.running and not self.buffer and not self._idle:
                self._next_fetch_at = min(self._next_fetch_at, time.monotonic())

    def _settled_leases(self, count: int) -> None:
        with self._lock:
            self.unsettled -= count

    def _wait_for_server(self, work: Work, error: BackendConnectionError) -> None:
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
        # Under --exit-empty an empty fetch ends the process unless a workflow task of its queues can still be
        # released by a task that is ready or running in them: then it waits, as an idle process does.
        awaits_release = (
            not results
            and self.config.exit_empty
            and not results.held_back
            and self.backend.awaits_release(self.config.queues)
        )
        with self._lock:
            self._last_fetch_empty = not results
            self.prefetch.acquired(answered_at - sent_at)
            if self.budget is not None and len(results) < count:
                self.budget += count - len(results)
            self.unsettled += len(results)
            if results and (self.phase is Phase.STOPPING or epoch != self.trust_epoch):
                # The reply came after stop() emptied the buffer, or after a heartbeat gap: hand them back.
                logger.info(
                    "%d tasks leased by a call answered after %s go back to ready.",
                    len(results),
                    "the stop" if self.phase is Phase.STOPPING else "a heartbeat gap",
                )
                self.unstarted.extend(results)
            elif results:
                self._poll_pause = self.backend.config.poll_interval
                # The lease was taken between sent_at and the answer: a run's start maps at or after it.
                offset = results[0].lease_started_at.timestamp() - sent_at
                self.buffer.extend(Buffered(result, expires, epoch, offset) for result in results)
                self._has_tasks.notify(len(results))
            elif not self.holds_leases and (results.held_back or not self.config.exit_empty or awaits_release):
                # Nothing leased and nothing held: wait on the server, woken by the next enqueue, by an
                # acknowledgement that frees a slot of a held-back queue or releases a child, or when its next
                # rate token is due. Awaiting a release, it looks again sooner: a cascade that fails the
                # waiting tasks wakes no one.
                wait_s = IDLE_WAIT_S if results.next_token_s is None else min(IDLE_WAIT_S, results.next_token_s)
                if awaits_release:
                    wait_s = min(wait_s, self.backend.config.poll_max_interval)
                self._idle, self._next_fetch_at, self._idle_until = True, float("inf"), answered_at + wait_s
            elif results.next_token_s is not None:
                # Tasks run here and a rate holds the rest back: fetch again when its next token is due,
                # or sooner (as a poll would), for the other queues' tasks.
                wait_s = min(results.next_token_s, self.backend.config.poll_max_interval)
                self._next_fetch_at = time.monotonic() + wait_s
            else:
                # Tasks still run here: poll, so their acknowledgements are not held up by a wait.
                self._next_fetch_at = time.monotonic() + self._poll_pause
                self._poll_pause = min(2 * self._poll_pause, self.backend.config.poll_max_interval)
            if self.phase is Phase.FETCHING:
                if self.budget is not None and self.budget <= 0:
                    self.recycled = True
                    self._enter(Phase.DRAINING)
                elif not results and self.config.exit_empty and not results.held_back and not awaits_release:
                    self._enter(Phase.DRAINING)

    def _write_reports(self, pending: list[PendingReport]) -> None:
        """Store what running tasks reported; a first metadata write that met stored metadata goes again, merged."""
        while pending:
            replies = self.backend.report([p.entry for p in pending])
            pending = self.reports.written(pending, replies, time.monotonic())

    def _settle(self, outcomes: list[Outcome]) -> None:
        """Acknowledge finished tasks and requeue the ones to retry; count what the server accepted."""
        finished = [o for o in outcomes if o.retry_after is None]
        stats = self.task_stats
        if finished:
            pairs_ = [(o.result, o.return_value) for o in finished]
            accepted = self.backend.acknowledge_many(pairs_, settle_in_background=True)
            for outcome, ok in zip(finished, accepted, strict=True):
                if ok:
                    stats.add(outcome, False)
        for outcome in outcomes:
            if outcome.retry_after is not None and self.backend.requeue(outcome.result, run_after=outcome.retry_after):
                stats.add(outcome, True)

    def _send_last_task_stats(self) -> None:
        """Once the fetcher is done: send what is still counted, or say it is lost if the server is away."""
        if not self.task_stats:
            return
        try:
            self._send_task_stats(time.monotonic())
        except RIDDEN_OUT as e:
            logger.info("The last per-task counts of this process were not sent: %s", e)

    def _send_task_stats(self, now: float) -> None:
        """Send the per-task-path counts when due (at most once every FLUSH_INTERVAL_S); kept if the server is away."""
        counts = self.task_stats.take(now)
        try:
            self.backend.record_task_stats(counts)
        except RIDDEN_OUT:
            self.task_stats.put_back(counts)
            raise

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
