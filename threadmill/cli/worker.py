"""`manage.py threadmill worker`: run a pool of worker processes for one task backend."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError
from django.db import connections

from ..worker.config import DEFAULT_SHUTDOWN_TIMEOUT_S, WorkerConfig, default_process_count
from ..worker.logs import LOG_FORMATS, configure
from ..worker.prefetch import AUTO_MAX_SIZE, COLD_PER_THREAD, DEFAULT_WINDOW_S, LEASE_SHARE
from ..worker.supervisor import Supervisor
from .common import add_backend_argument, known_queues, seconds, threadmill_backend

logger = logging.getLogger("threadmill.worker")

#: Default longest time `worker` keeps trying an unreachable server at start, seconds.
DEFAULT_WAIT_FOR_SERVER_S = 60.0

HELP = "Run a pool of worker processes that run the tasks of one backend's queues."


def _whole_number(minimum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < minimum:
            raise argparse.ArgumentTypeError(f"must be a whole number of at least {minimum}, not {text!r}")
        return value

    return parse


def _prefetch_count(text: str) -> int:
    """Parse --prefetch-count: "auto" (0, the buffer sized by time) or a whole number of tasks."""
    if text.strip().lower() == "auto":
        return 0
    try:
        return _whole_number(0)(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"must be auto or a whole number of at least 1, not {text!r}") from None


def _prefetch_window(text: str) -> float:
    value = seconds(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a number of seconds above 0, not {text!r}")
    return value


def _queue_list(text: str) -> list[str]:
    names = [name.strip() for name in text.split(",")]
    if not all(names):
        raise argparse.ArgumentTypeError(f"must be queue names separated by commas, not {text!r}")
    return names


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_backend_argument(parser)
    parser.add_argument(
        "-q",
        "--queues",
        action="extend",
        type=_queue_list,
        metavar="QUEUE[,QUEUE...]",
        help="Queues to run tasks from, comma-separated or repeated (default: every queue of the backend).",
    )
    parser.add_argument(
        "-w",
        "--workers",
        type=_whole_number(1),
        metavar="N",
        default=default_process_count(),
        help="Worker processes (default: the CPU count minus one, at least 1; here %(default)s).",
    )
    parser.add_argument(
        "-t",
        "--threads",
        type=_whole_number(1),
        default=1,
        metavar="N",
        help="Consumer threads per worker process (default: 1).",
    )
    parser.add_argument(
        "--prefetch-count",
        type=_prefetch_count,
        metavar="auto|N",
        default=0,
        help="Tasks each worker process leases ahead of its threads. auto (the default; 0 means the same) sizes "
        "the buffer by time: it holds about --prefetch-window of work by the process's moving average of task "
        f"run time, at least 1 task per thread and at most {AUTO_MAX_SIZE} ({COLD_PER_THREAD} per thread until "
        "a task has run), so fast tasks are leased hundreds at a time and slow ones one per thread. "
        "N always leases N; 1 fetches one task at a time.",
    )
    parser.add_argument(
        "--prefetch-window",
        type=_prefetch_window,
        metavar="SECONDS",
        default=None,
        help=f"With --prefetch-count auto: the work a buffer holds, in seconds of its threads' time (default: "
        f"{DEFAULT_WINDOW_S:g}). At most {LEASE_SHARE:g} of the backend's lease_ttl.",
    )
    parser.add_argument(
        "--max-tasks",
        type=_whole_number(1),
        metavar="N",
        default=None,
        help="Replace each worker process after it ran this many tasks (plus its jitter). It stops fetching at "
        "the budget, so it runs exactly that many tasks, never more (fewer only when stopped or drained).",
    )
    parser.add_argument(
        "--max-tasks-jitter",
        type=_whole_number(0),
        metavar="N",
        default=0,
        help="Add a random 0 to N tasks to each process's --max-tasks, so processes do not recycle together.",
    )
    parser.add_argument(
        "--exit-empty",
        action="store_true",
        help=(
            "Exit 0 once no ready task is left on the queues and every process is idle "
            "(a workflow task waiting on a ready or running task of these queues is waited for)."
        ),
    )
    parser.add_argument(
        "--shutdown-timeout",
        type=seconds,
        metavar="SECONDS",
        default=DEFAULT_SHUTDOWN_TIMEOUT_S,
        help="On SIGTERM, how long running tasks may take to finish before they are handed back to ready and "
        f"the pool exits (default: {DEFAULT_SHUTDOWN_TIMEOUT_S:g}). Buffered tasks are handed back at once.",
    )
    parser.add_argument(
        "--wait-for-server",
        type=seconds,
        metavar="SECONDS",
        default=DEFAULT_WAIT_FOR_SERVER_S,
        help="At start, how long to keep trying a server that cannot be reached yet (down, restarting, loading "
        f"its data) before exiting 1 (default: {DEFAULT_WAIT_FOR_SERVER_S:g}; 0 fails at once). Once running, "
        "the pool rides out outages of any length.",
    )
    parser.add_argument(
        "--log-format",
        choices=LOG_FORMATS,
        default="json",
        help="Log lines as JSON objects or plain text (default: json).",
    )
    parser.add_argument(
        "-v",
        "--verbosity",
        type=int,
        choices=[0, 1, 2, 3],
        default=argparse.SUPPRESS,
        help="0 warnings, 1 worker events, 2 every task, 3 debug.",
    )


def handle(command: BaseCommand, options: dict[str, Any]) -> int:
    """Validate the options against the backend, then run the pool; return its exit code."""
    if options["max_tasks_jitter"] and options["max_tasks"] is None:
        raise CommandError("--max-tasks-jitter needs --max-tasks.")
    window = options["prefetch_window"]
    if window is not None and options["prefetch_count"]:
        raise CommandError("--prefetch-window sizes the buffer by time: it needs --prefetch-count auto, not a count.")
    backend = threadmill_backend(options["backend"], options["wait_for_server"], command.stderr.write)
    if window is not None and window > LEASE_SHARE * backend.config.lease_ttl:
        raise CommandError(
            f"--prefetch-window {window:g} is more than {LEASE_SHARE:g} of the backend's lease_ttl "
            f"({backend.config.lease_ttl:g} s): buffered tasks would risk their lease. Give a shorter window."
        )
    for schedule in backend.schedules:
        try:
            schedule.task()
        except ImproperlyConfigured as e:
            raise CommandError(str(e)) from None
    config = WorkerConfig(
        backend=options["backend"],
        queues=tuple(known_queues(backend.alias, options["queues"])),
        processes=options["workers"],
        threads=options["threads"],
        prefetch_count=options["prefetch_count"],
        prefetch_window=DEFAULT_WINDOW_S if window is None else window,
        max_tasks=options["max_tasks"],
        max_tasks_jitter=options["max_tasks_jitter"],
        exit_empty=options["exit_empty"],
        shutdown_timeout=options["shutdown_timeout"],
        log_format=options["log_format"],
        verbosity=options["verbosity"],
    )
    configure(config.log_format, config.verbosity)
    for warning in backend.preflight().warnings:
        logger.warning("%s", warning)
    code = Supervisor(backend, config).run()
    if getattr(command, "_called_from_command_line", False):
        _exit_now(code)
    return code


def _exit_now(code: int) -> None:
    """Exit at once, skipping the interpreter's finalisation."""
    # With the site's apps loaded, finalisation took 0.3 to 0.4 s, which every drain with
    # --exit-empty paid after its last task. Logs, stdio and connections are closed here.
    logging.shutdown()
    connections.close_all()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
