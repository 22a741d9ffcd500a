"""The entry point of a worker process forked by the supervisor: signals, heartbeat, exit code.

The first SIGTERM or SIGINT stops the process the bounded way (`WorkerProcess.stop`): buffered
tasks go back to ready at once, running ones may finish until `--shutdown-timeout`, then they
are handed back too and the process exits 0. Meanwhile it logs which tasks it still waits for,
at the stop and again each time one of them finishes (`Stopping`). A second SIGTERM or
SIGINT exits at once and leaves the leases to the broker, which recovers them once the
heartbeat is `worker_timeout` old. A process whose supervisor died stops the same bounded way.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from collections import Counter
from typing import TYPE_CHECKING

from ..exit_codes import EXIT_INTERRUPTED
from ..identity import name_this_process
from .config import WorkerConfig
from .process import Phase, WorkerProcess
from .telemetry import TelemetryPublisher

if TYPE_CHECKING:
    from ..backends.redis import RedisTaskBackend

logger = logging.getLogger("threadmill.worker")

#: Seconds between two checks that the supervisor is still alive.
PARENT_CHECK_INTERVAL_S = 1.0


#: The signal that makes a worker process quiet (the supervisor sends it on an operator's "quiet").
QUIET_SIGNAL = signal.SIGUSR1
#: The signals a worker process handles; the supervisor blocks them while it forks, so none is lost.
HANDLED_SIGNALS = {signal.SIGTERM, signal.SIGINT, QUIET_SIGNAL}


def run_worker_process(
    backend: RedisTaskBackend, config: WorkerConfig, supervisor_pid: int, incarnation: str, kill_at=None
) -> None:
    """Run one worker process until it drains, stops, recycles or fails; exit with its code.

    It starts with SIGTERM and SIGINT blocked (the supervisor forks it so), and unblocks
    them once its own handlers replace the supervisor's, so a signal is never lost. Its name
    is `host:pid:incarnation`, the incarnation chosen by the supervisor, which so knows it too.
    `kill_at` is shared with the supervisor: the monotonic moment it kills this process, should a
    task outlive its time limit and the process not manage to replace itself (see `watchdog`).
    `backend` is the supervisor's, inherited through the fork with its settings parsed, its
    preflight and layout checked and its script wrappers built; its connections are made anew
    in this process (`transport.py`, and redis-py's pools, check the pid).
    """
    signal.set_wakeup_fd(-1)
    # A group of its own: a terminal's Ctrl-C reaches the supervisor only, which passes one
    # stop on, so a single Ctrl-C is never taken for the second one that means "now".
    os.setpgid(0, 0)
    process = WorkerProcess(backend, config, name_this_process(incarnation), kill_at)
    stopping = Stopping(process)
    _install_signal_handlers(process, stopping)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, HANDLED_SIGNALS)
    telemetry = TelemetryPublisher(process)
    started = time.process_time(), time.monotonic()
    # The heartbeat thread first: started after the fetcher, its start waited out the fetcher's first
    # turns at the GIL, and the fetcher its (8 ms from the fork to the first task, median of 9).
    telemetry.start()
    process.start()
    logger.info("Worker process %s started: %d threads, %s.", process.name, config.threads, process.prefetch.describe())
    while not process.finished.wait(PARENT_CHECK_INTERVAL_S):
        if os.getppid() != supervisor_pid and stopping.first_request() and process.stop():
            logger.warning("The supervisor of worker process %s is gone; stopping: %s.", process.name, stopping.tell())
            _wake(process)
        stopping.update()
    telemetry.goodbye()
    cpu, wall = time.process_time() - started[0], time.monotonic() - started[1]
    logger.info(
        "Worker process %s exits with code %d after %d tasks in %.3f s, %.3f s of CPU.",
        process.name,
        process.exit_code,
        process.done,
        wall,
        cpu,
    )
    if process.consumers_alive:
        # A consumer may still run a task handed back at the shutdown timeout: an
        # interpreter shutdown would wait for them or crash in them.
        logging.shutdown()
        os._exit(process.exit_code)
    sys.exit(process.exit_code)


def _install_signal_handlers(process: WorkerProcess, stopping: Stopping) -> None:
    def stop(signum: int, frame) -> None:
        # Counted before any lock is taken: a second signal can run this handler inside the
        # first one, while it holds the process's lock, and must exit without waiting for it.
        if not stopping.first_request() or not process.stop():
            # A second stop signal (Ctrl-C twice, or SIGTERM then SIGTERM or SIGINT) means now.
            os._exit(EXIT_INTERRUPTED)
        _wake(process)
        logger.info(
            "Worker process %s stopping: %s; buffered tasks go back to ready, running ones have %g s to finish.",
            process.name,
            stopping.tell(),
            process.config.shutdown_timeout,
        )

    def quiet(signum: int, frame) -> None:
        if not stopping.requests and process.quiet():
            logger.info(
                "Worker process %s is quiet: it fetches no more tasks and finishes what it holds.", process.name
            )
            _wake(process)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    signal.signal(QUIET_SIGNAL, quiet)


class Stopping:
    """A worker process's stop as its main thread sees it: the requests, and what it said it still waits for."""

    def __init__(self, process: WorkerProcess) -> None:
        self.process = process
        #: Stop requests so far (signals, or the supervisor found gone); the second means now.
        self.requests = 0
        self.told = ""

    def first_request(self) -> bool:
        """Count a stop request and return whether it is the first; lock-free, so a signal handler may nest in it."""
        self.requests += 1
        return self.requests == 1

    def tell(self) -> str:
        """Return which tasks the process still runs ("1 task still running: app.tasks.f"), remembered as told."""
        paths = Counter(result.task.module_path for result in list(self.process.running.values()))
        count = paths.total()
        names = ", ".join(path if n == 1 else f"{path} ({n})" for path, n in paths.items())
        self.told = f"{count} task{'s' if count > 1 else ''} still running: {names}" if count else "no task running"
        return self.told

    def update(self) -> None:
        """While stopping, log the tasks still running once one of them finished since the last report."""
        if self.process.phase is not Phase.STOPPING or not self.process.running:
            return
        told = self.told
        if self.tell() != told:
            logger.info("Worker process %s stopping: %s.", self.process.name, self.told)


def _wake(process: WorkerProcess) -> None:
    """Wake the fetcher if it blocks waiting for tasks, from a thread: a signal handler must not block."""

    def wake() -> None:
        try:
            process.backend.wake_worker(process.name)
        except Exception as e:  # noqa: BLE001 - without it the stop only waits for the idle timeout
            logger.warning("Could not wake worker process %s to stop: %s", process.name, e)

    threading.Thread(target=wake, name="wake", daemon=True).start()
