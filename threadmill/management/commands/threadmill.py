"""`manage.py threadmill <subcommand>`: a dispatcher over the registry in `threadmill.cli`.

From the command line, the cyclic garbage collector is paused while the parser is built,
which imports the subcommands' modules (for the worker: redis-py, the backend and the pool),
and what they allocated is then frozen out of later collections (`gc.freeze`), before the
worker forks its processes as Python's documentation advises. `call_command` leaves the
collector alone: its caller's objects are not ours to freeze.
"""

from __future__ import annotations

import contextlib
import gc
import sys
from collections.abc import Iterator
from importlib import import_module

from django.core.management.base import BaseCommand, CommandError, CommandParser

from threadmill.cli import SUBCOMMANDS
from threadmill.exit_codes import EXIT_USAGE


class OneLineParser(CommandParser):
    """An argument parser whose errors are one line on stderr, without the usage block."""

    def error(self, message: str):
        if self.called_from_command_line:
            self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")
        raise CommandError(f"Error: {message}")


class Command(BaseCommand):
    help = "Run Threadmill: " + ", ".join(SUBCOMMANDS) + "."
    # The worker checks its own backend; the project's checks would only slow every start.
    requires_system_checks = ()

    def create_parser(self, prog_name: str, subcommand: str, **kwargs) -> CommandParser:
        with _collector_paused(getattr(self, "_called_from_command_line", False)):
            parser = super().create_parser(prog_name, subcommand, **kwargs)
        parser.__class__ = OneLineParser  # Django builds the parser itself; only its error() changes.
        return parser

    def add_arguments(self, parser: CommandParser) -> None:
        subparsers = parser.add_subparsers(
            dest="subcommand", required=True, metavar="subcommand", parser_class=OneLineParser
        )
        for name, path in SUBCOMMANDS.items():
            module = import_module(path)
            module.add_arguments(subparsers.add_parser(name, help=module.HELP, description=module.HELP))

    def handle(self, *args, subcommand: str, **options) -> None:
        code = import_module(SUBCOMMANDS[subcommand]).handle(self, options)
        if code:
            sys.exit(code)


@contextlib.contextmanager
def _collector_paused(pause: bool) -> Iterator[None]:
    """Pause the cyclic garbage collector for the block, then freeze what survived it (when `pause`)."""
    if not pause or not gc.isenabled():
        yield
        return
    # The imports allocate long-lived objects only (modules, classes, functions): the young
    # collections they set off freed next to nothing and took 20 to 40 ms of a worker's start.
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        gc.enable()
