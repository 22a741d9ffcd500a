"""The supervisor: forks the worker processes, respawns them, and runs the broker between.

It is single threaded, so forking is safe: the mover and reaper passes run on its main
thread between waits on the children's sentinels. A child that exits is replaced, unless
the pool is stopping, or it drained its queues under `--exit-empty` (exit code 0).
A child that dies young is respawned after a growing pause, so a broken broker is not
hammered. SIGTERM or Ctrl-C is passed on to the children, which hand their buffered tasks
back and let running ones finish within `--shutdown-timeout`; a child still alive
`SHUTDOWN_GRACE_S` after that is killed. A second SIGTERM or Ctrl-C stops everything at once.
A child whose task outlived its time limit replaces itself (exit code `EXIT_TIMED_OUT`); one
that cannot (every thread stuck) is killed at the moment it keeps in shared memory (`kill_at`).
If the supervisor itself is killed, its children notice within a second and stop the same
bounded way.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import time
from multiprocessing.connection import wait
from multiprocessing.process import BaseProcess
from typing import TYPE_CHECKING, Any

from django.db import connections

from ..exceptions import ServerUnreachable
from ..exit_codes import EXIT_INTERRUPTED, EXIT_OK, EXIT_RECYCLED, EXIT_TIMED_OUT
from ..identity import WorkerName, new_incarnation
from .child import HANDLED_SIGNALS, QUIET_SIGNAL, run_worker_process
from .config import WorkerConfig

if TYPE_CHECKING:
    from ..backends.broker import RedisBroker
    from ..backends.redis import RedisTaskBackend

logger = logging.getLogger("threadmill.supervisor")

#: First pause before respawning a worker process that died young, seconds.
RESPAWN_PAUSE_S = 0.1
#: Longest pause before respawning a worker process that keeps dying young, seconds.
RESPAWN_MAX_PAUSE_S = 10.0
#: A worker process that lived at least this long resets the respawn pause, seconds.
HEALTHY_LIFETIME_S = 30.0
#: Seconds past the shutdown timeout a stopping worker process gets to hand back and exit before it is killed.
SHUTDOWN_GRACE_S = 3.0


class Supervisor:
    """Keeps `config.processes` worker processes running and the broker turning."""

    def __init__(self, backend: RedisTaskBackend, config: WorkerConfig) -> None:
        self.backend = backend
        self.config = config
        #: The broker's duties, made once the first children are forked (`_start_broker`).
        self.broker: RedisBroker
        # Made here, before the fork (`scripts_for(0)` is `backend.scripts`): every child inherits the
        # wrappers; each script's source is read and hashed at its first use, in the process using it.
        backend.scripts_for(0)
        self.children: dict[int, tuple[BaseProcess, float]] = {}
        #: Each slot's kill moment, monotonic seconds in shared memory its process keeps (infinity: none).
        self.kill_at: dict[int, Any] = {}
        #: Each slot's worker process name (`host:pid:incarnation`), as its leases and heartbeats carry it.
        self.names: dict[int, str] = {}
        self.stopping = False
        self.interrupted = False
        self._kill_at = float("inf")
        #: Slots whose process an operator stopped: they are not refilled.
        self._retired: set[int] = set()
        self._respawn_at: dict[int, float] = {}
        self._pause = RESPAWN_PAUSE_S
        self._next_broker_pass = 0.0
        self._broker_failing = False
        self._context = multiprocessing.get_context("fork")

    def run(self) -> int:
        """Run the pool until it is stopped or, with `--exit-empty`, has drained; return the exit code."""
        wake_read, wake_write = os.pipe()
        os.set_blocking(wake_write, False)
        signal.set_wakeup_fd(wake_write)
        self._install_signal_handlers()
        logger.info(
            "Starting %d worker processes of %d threads on queues %s.",
            self.config.processes,
            self.config.threads,
            ", ".join(self.config.queues),
        )
        try:
            for slot in range(self.config.processes):
                if not self.stopping:
                    self._spawn(slot)
            self._start_broker()
            while self.children or self._respawn_at:
                self._turn(wake_read)
        finally:
            signal.set_wakeup_fd(-1)
            os.close(wake_read)
            os.close(wake_write)
        logger.info("Worker pool stopped.")
        return EXIT_INTERRUPTED if self.interrupted else EXIT_OK

    def _start_broker(self) -> None:
        """Make the broker: imported after the fork, as no child runs its duties (3 ms less before the first task)."""
        from ..backends.broker import RedisBroker

        self.broker = RedisBroker(self.backend, list(self.config.queues))

    def _turn(self, wake_read: int) -> None:
        now = time.monotonic()
        if not self.stopping and now >= self._next_broker_pass:
            self._broker_pass(self._full_pass)
            self._next_broker_pass = time.monotonic() + self.backend.config.broker_interval
        elif not self.stopping and self.broker.next_due_at is not None and now >= self.broker.next_due_at:
            # Deferred tasks start on time, not at the next full pass: the mover alone runs when one falls due.
            self._broker_pass(self.broker.move_all)
        for slot, at in list(self._respawn_at.items()):
            if self.stopping:
                del self._respawn_at[slot]
            elif now >= at:
                del self._respawn_at[slot]
                self._spawn(slot)
        if self.stopping and now >= self._kill_at:
            self._kill_children()
        stuck_at = self._kill_stuck_children(now)
        if self.stopping:
            deadlines = [self._kill_at, stuck_at]
        else:
            deadlines = [self._next_broker_pass, stuck_at, *self._respawn_at.values()]
            if self.broker.next_due_at is not None:
                deadlines.append(self.broker.next_due_at)
        timeout = None if min(deadlines) == float("inf") else max(0.0, min(deadlines) - time.monotonic())
        ready = wait([wake_read, *(process.sentinel for process, _ in self.children.values())], timeout)
        if wake_read in ready:
            os.read(wake_read, 512)
        self._collect()

    def _full_pass(self) -> None:
        # The commands wait on partition 0 and are read before the pass: a pass that waits out another
        # partition's frozen server (socket_timeout) must not hold them up. The previous pass says
        # whether partition 0 answers.
        try:
            if 0 not in self.broker.failed_partitions:
                self._obey_operators()
        finally:
            self.broker.run_once(due_only=True)

    def _obey_operators(self) -> None:
        """Carry out the quiet and stop commands operators left in Redis for this pool's processes."""
        slots = {self.names[slot]: slot for slot in self.children}
        for name, command in self.backend.take_control(list(slots)).items():
            slot = slots[name]
            pid = self.children[slot][0].pid
            if pid is None:  # never so: a child is listed once started
                continue
            if command == "stop":
                logger.info("An operator stops worker process %s; it is not replaced.", name)
                self._retired.add(slot)
                os.kill(pid, signal.SIGTERM)
            else:
                logger.info("An operator quiets worker process %s.", name)
                os.kill(pid, QUIET_SIGNAL)

    def _broker_pass(self, run) -> None:
        try:
            run()
        except ServerUnreachable as e:
            if not self._broker_failing:
                logger.warning("A broker pass cannot reach the server (%s); it is retried every pass.", e)
            self._broker_failing = True
        except Exception:
            if not self._broker_failing:
                logger.exception("A broker pass (mover, reaper and recovery) failed; it is retried every pass.")
            self._broker_failing = True
        else:
            if self._broker_failing:
                logger.warning("Broker passes work again.")
            self._broker_failing = False

    def _spawn(self, slot: int) -> None:
        # A child must not share the supervisor's database sockets, and must not run the
        # supervisor's signal handlers before it installs its own: both are settled here.
        connections.close_all()
        # Chosen here, so this supervisor knows the child's name for operators' commands.
        incarnation = new_incarnation()
        kill_at = self._context.RawValue("d", float("inf"))
        process = self._context.Process(
            target=run_worker_process,
            args=(self.backend, self.config, os.getpid(), incarnation, kill_at),
            name=f"threadmill-worker-{slot}",
        )
        signal.pthread_sigmask(signal.SIG_BLOCK, HANDLED_SIGNALS)
        try:
            process.start()
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, HANDLED_SIGNALS)
        self.children[slot] = (process, time.monotonic())
        self.kill_at[slot] = kill_at
        self.names[slot] = str(WorkerName.for_process(incarnation, process.pid))

    def _collect(self) -> None:
        for slot, (process, born) in list(self.children.items()):
            if process.is_alive():
                continue
            process.join()
            del self.children[slot]
            code, lived = process.exitcode, time.monotonic() - born
            if self.stopping or slot in self._retired or (self.config.exit_empty and code == EXIT_OK):
                continue
            self._schedule_respawn(slot, process.pid, code, lived)

    def _kill_stuck_children(self, now: float) -> float:
        """SIGKILL each child past its kill moment (a task outlived its limit, it could not exit); return the next."""
        soonest = float("inf")
        for slot, (process, _) in self.children.items():
            kill_at = self.kill_at[slot]
            if now >= kill_at.value and process.pid is not None:
                logger.error(
                    "Worker process %s did not replace itself after a task outlived its time limit; killing it.",
                    process.pid,
                )
                kill_at.value = float("inf")
                try:
                    os.kill(process.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            soonest = min(soonest, kill_at.value)
        return soonest

    def _schedule_respawn(self, slot: int, pid: int | None, code: int | None, lived: float) -> None:
        if code == EXIT_TIMED_OUT:
            logger.warning(
                "Worker process %s replaced itself after a task outlived its time limit; respawning it.", pid
            )
            self._respawn_at[slot] = 0.0
            return
        if code == EXIT_RECYCLED:
            logger.info("Worker process %s recycled after its task budget; replacing it.", pid)
            self._respawn_at[slot] = 0.0
            return
        if lived >= HEALTHY_LIFETIME_S:
            self._pause = RESPAWN_PAUSE_S
        logger.error(
            "Worker process %s exited with code %s after %.1f s; respawning it in %.1f s.",
            pid,
            code,
            lived,
            self._pause,
        )
        self._respawn_at[slot] = time.monotonic() + self._pause
        self._pause = min(2 * self._pause, RESPAWN_MAX_PAUSE_S)

    def _install_signal_handlers(self) -> None:
        def stop(signum: int, frame) -> None:
            if self.stopping:
                # A second SIGTERM or SIGINT: the children drop everything (the broker recovers their leases).
                self.interrupted = True
                self._signal_children(signal.SIGINT)
                os._exit(EXIT_INTERRUPTED)
            self.stopping = True
            self._kill_at = time.monotonic() + self.config.shutdown_timeout + SHUTDOWN_GRACE_S
            self._signal_children(signal.SIGTERM)

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)

    def _kill_children(self) -> None:
        for process, _ in self.children.values():
            if process.is_alive():
                logger.error("Worker process %s did not stop within its shutdown timeout; killing it.", process.pid)
        self._signal_children(signal.SIGKILL)
        self._kill_at = float("inf")

    def _signal_children(self, signum: int) -> None:
        for process, _ in self.children.values():
            if process.pid is not None:
                try:
                    os.kill(process.pid, signum)
                except ProcessLookupError:
                    pass
