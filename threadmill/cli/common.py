"""What the subcommands share: finding the backend and the queues a command line names."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import CommandError

from ..api import queues
from ..exceptions import BackendConnectionError, LayoutVersionError, UnsupportedServer

if TYPE_CHECKING:
    from ..backends.redis import RedisTaskBackend

#: First pause before trying an unreachable server again at start, seconds.
START_RETRY_PAUSE_S = 0.1
#: Longest such pause, seconds.
START_RETRY_MAX_PAUSE_S = 2.0


def add_backend_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-b",
        "--backend",
        default="default",
        metavar="ALIAS",
        help="Alias of the task backend in TASKS (default: default).",
    )


def seconds(text: str) -> float:
    """Parse a command-line number of seconds, finite and at least 0."""
    try:
        value = float(text)
    except ValueError:
        value = None
    if value is None or not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number of seconds of at least 0, not {text!r}")
    return value


def threadmill_backend(alias: str, wait_s: float = 0.0, say: Callable[[str], None] | None = None) -> RedisTaskBackend:
    """Return the Threadmill backend of `alias`, reachable, its data layout checked; CommandError naming what is wrong otherwise.

    An unreachable server (down, restarting, still loading its data) is tried again for up to
    `wait_s` seconds, told once through `say`; a refused data layout is an error at once, and so
    is a server the preflight refuses (too old), before anything is written to it.
    """
    try:
        queues.find_backend(alias)
    except LookupError as e:
        raise CommandError(str(e)) from None
    deadline, pause, told = time.monotonic() + wait_s, START_RETRY_PAUSE_S, False
    while True:
        try:
            return queues.reach(alias)
        except (LayoutVersionError, UnsupportedServer, ImproperlyConfigured) as e:
            raise CommandError(str(e)) from None
        except BackendConnectionError as e:
            if time.monotonic() + pause > deadline:
                tried = f" (tried for {wait_s:g} s)" if wait_s else ""
                raise CommandError(f"{str(e).rstrip('.')}{tried}.") from None
            if say is not None and not told:
                say(f"{e} Trying again for up to {wait_s:g} s.")
                told = True
        time.sleep(pause)  # A retry pause, not a synchronisation.
        pause = min(2 * pause, START_RETRY_MAX_PAUSE_S)


def known_queues(alias: str, requested: list[str] | None) -> list[str]:
    """Return the requested queues of the backend `alias` (all when none), or CommandError naming the unknown ones."""
    known = queues.queue_names(alias)
    if not requested:
        return known
    unknown = [name for name in dict.fromkeys(requested) if name not in known]
    if unknown:
        raise CommandError(f"Unknown queue(s) {', '.join(unknown)}; backend {alias!r} has {', '.join(known)}.")
    return list(dict.fromkeys(requested))


def text_table(rows: list[list[Any]]) -> str:
    """Return rows as a plain text table, each column as wide as its widest cell."""
    cells = [[str(cell) for cell in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(cells[0]))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in cells
    )
