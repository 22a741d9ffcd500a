"""The subcommands of `manage.py threadmill`, one module each.

A subcommand module defines `HELP` (one line), `add_arguments(parser)` and
`handle(command, options) -> int` (the exit code). Adding a subcommand is one line in
`SUBCOMMANDS`; the management command builds its parser and dispatches from this registry.
"""

#: Subcommand name -> module path, in the order `--help` lists them.
SUBCOMMANDS: dict[str, str] = {
    "worker": "threadmill.cli.worker",
    "run": "threadmill.cli.run",
    "status": "threadmill.cli.status",
    "pause": "threadmill.cli.pause",
    "resume": "threadmill.cli.resume",
    "limit": "threadmill.cli.limit",
    "quiet": "threadmill.cli.quiet",
    "stop": "threadmill.cli.stop",
    "requeue-orphaned": "threadmill.cli.requeue_orphaned",
    "cancel": "threadmill.cli.cancel",
    "schedules": "threadmill.cli.schedules",
    "workflow": "threadmill.cli.workflow",
}
