"""What `quiet` and `stop` share: choosing live worker processes and leaving them a command.

The command waits in Redis until the worker's supervisor takes it on its next broker pass
(within `broker_interval`), so a busy process cannot miss it.
"""

from __future__ import annotations

import argparse
import getpass
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from .common import add_backend_argument, threadmill_backend


def add_target_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "workers", nargs="*", metavar="WORKER_ID", help="Worker processes (host:pid) as status lists them."
    )
    parser.add_argument("--host", metavar="HOST", help="Every live worker process on this host.")
    parser.add_argument("--all", action="store_true", help="Every live worker process of the backend.")
    add_backend_argument(parser)


def send(command: BaseCommand, options: dict[str, Any], verb: str) -> int:
    """Leave `verb` ("quiet" or "stop") for the chosen live workers and say which; CommandError on a bad choice."""
    backend = threadmill_backend(options["backend"])
    live = [w["worker"] for w in backend.live_workers()]
    targets = _targets(live, options)
    backend.send_control(targets, verb, by=f"{getpass.getuser()} (command line)")
    command.stdout.write(
        f"Asked {len(targets)} worker process{'es' if len(targets) != 1 else ''} to {verb}: {', '.join(targets)}. "
        "Their supervisors act on their next broker pass."
    )
    return 0


def _targets(live: list[str], options: dict[str, Any]) -> list[str]:
    chosen = [bool(options["workers"]), options["host"] is not None, options["all"]]
    if sum(chosen) != 1:
        raise CommandError("Name worker processes (host:pid), or give --host HOST or --all: exactly one of them.")
    if options["all"]:
        targets = live
    elif options["host"] is not None:
        targets = [name for name in live if name.rpartition(":")[0] == options["host"]]
    else:
        unknown = [name for name in options["workers"] if name not in live]
        if unknown:
            raise CommandError(f"No live worker process {', '.join(unknown)}; `threadmill status` lists them.")
        targets = list(dict.fromkeys(options["workers"]))
    if not targets:
        raise CommandError("No live worker process matches.")
    return targets
