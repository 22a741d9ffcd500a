"""`manage.py threadmill schedules [--pause|--resume|--run NAME]`: list the schedules, or act on one."""

from __future__ import annotations

import argparse
import getpass
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from ..api import schedules as api
from ..exit_codes import EXIT_OK
from .common import add_backend_argument, threadmill_backend

HELP = "List the schedules with their next and last run, or pause, resume or run one now."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_backend_argument(parser)
    action = parser.add_mutually_exclusive_group()
    action.add_argument("--pause", metavar="NAME", help="Skip the schedule's ticks until it is resumed.")
    action.add_argument("--resume", metavar="NAME", help="Run the schedule again from its next tick.")
    action.add_argument("--run", metavar="NAME", help="Enqueue one run now (recorded as its last run).")


def handle(command: BaseCommand, options: dict[str, Any]) -> int:
    alias = threadmill_backend(options["backend"]).alias
    try:
        if options["pause"]:
            done = api.pause_schedule(alias, options["pause"], by=_who())
            command.stdout.write(f"Paused schedule {options['pause']!r}." if done else "It was paused already.")
        elif options["resume"]:
            done = api.resume_schedule(alias, options["resume"])
            command.stdout.write(f"Resumed schedule {options['resume']!r}." if done else "It was not paused.")
        elif options["run"]:
            result = api.run_schedule(alias, options["run"])
            command.stdout.write(f"Enqueued a run of schedule {options['run']!r}: task {result.id}.")
        else:
            command.stdout.write(_listing(alias))
    except LookupError as e:
        raise CommandError(str(e)) from None
    return EXIT_OK


def _who() -> str:
    return f"{getpass.getuser()} (command line)"


def _listing(alias: str) -> str:
    rows = [row for row in api.schedules() if row.alias == alias]
    if not rows:
        return f"Backend {alias!r} has no schedule (TASKS[{alias!r}]['SCHEDULE'])."
    lines = []
    for row in rows:
        state = f"paused by {row.paused.get('by')}" if row.paused else "enabled"
        last = (
            f"last {row.last_enqueued_at:%Y-%m-%d %H:%M:%S} UTC task {row.last_task}" if row.last_task else "never run"
        )
        lines.append(
            f"{row.schedule.name}  {row.schedule.cron!r}  {row.schedule.task_path}  {state}  "
            f"next {row.next_run:%Y-%m-%d %H:%M %Z}  {last}"
        )
    return "\n".join(lines)
