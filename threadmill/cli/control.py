"""What `quiet` and `stop` share: choosing live worker processes and leaving them a command.

The command waits in Redis until the worker's supervisor takes it on its next broker pass
(within `broker_interval`), so a busy process cannot miss it.
"""

from __future__ import annotations

import argparse
import getpass
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from ..api import controls
from ..exit_codes import EXIT_OK
from ..identity import WorkerName
from .common import add_backend_argument, threadmill_backend


def add_target_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "workers",
        nargs="*",
        metavar="WORKER_ID",
        help="Worker processes as status lists them (host:pid:incarnation), or host:pid when one live process has it.",
    )
    parser.add_argument("--host", metavar="HOST", help="Every live worker process on this host.")
    parser.add_argument("--all", action="store_true", help="Every live worker process of the backend.")
    add_backend_argument(parser)


def send(command: BaseCommand, options: dict[str, Any], verb: str) -> int:
    """Leave `verb` ("quiet" or "stop") for the chosen live workers and say which; CommandError on a bad choice."""
    alias = threadmill_backend(options["backend"]).alias
    live = [w["worker"] for w in controls.live_worker_documents(alias)]
    targets = _targets(live, options)
    controls.command_workers(alias, targets, verb, by=f"{getpass.getuser()} (command line)")
    command.stdout.write(
        f"Asked {len(targets)} worker process{'es' if len(targets) != 1 else ''} to {verb}: {', '.join(targets)}. "
        "Their supervisors act on their next broker pass."
    )
    return EXIT_OK


def _targets(live: list[str], options: dict[str, Any]) -> list[str]:
    chosen = [bool(options["workers"]), options["host"] is not None, options["all"]]
    if sum(chosen) != 1:
        raise CommandError("Name worker processes (their ids), or give --host HOST or --all: exactly one of them.")
    if options["all"]:
        targets = live
    elif options["host"] is not None:
        targets = [name for name in live if (parsed := WorkerName.parse(name)) and parsed.host == options["host"]]
    else:
        found = {name: _matching(name, live) for name in options["workers"]}
        unknown = [name for name, matches in found.items() if not matches]
        if unknown:
            raise CommandError(f"No live worker process {', '.join(unknown)}; `threadmill status` lists them.")
        ambiguous = [name for name, matches in found.items() if len(matches) > 1]
        if ambiguous:
            raise CommandError(
                f"Several live worker processes are {', '.join(ambiguous)}; name one by its full id "
                "(host:pid:incarnation) as `threadmill status` lists it."
            )
        targets = list(dict.fromkeys(matches[0] for matches in found.values()))
    if not targets:
        raise CommandError("No live worker process matches.")
    return targets


def _matching(wanted: str, live: list[str]) -> list[str]:
    """Return the live worker that `wanted` names exactly, else those whose host:pid it is."""
    if wanted in live:
        return [wanted]
    return [name for name in live if (parsed := WorkerName.parse(name)) and parsed.process == wanted]
