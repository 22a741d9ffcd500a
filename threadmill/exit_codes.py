"""The exit codes of `manage.py threadmill` and of the worker processes its `worker` forks, in one place.

Several codes share a value: a caller (a shell, systemd, Kubernetes) sees only the number, and
each subcommand gives it one meaning. docs/reference/exit-codes.md lists exactly these names and
values (tests/test_docs_reference.py holds the two together), so a new code starts here.
"""

#: Exit code of a subcommand that did what it was asked, and of a pool that stopped or drained.
EXIT_OK = 0
#: Exit code of a subcommand stopped by a `CommandError` (Django's default `returncode`): an unknown
#: alias, queue or workflow id, a server not reached within `--wait-for-server`, a refused preflight or layout.
EXIT_ERROR = 1
#: Exit code of a subcommand given a bad flag or value (argparse's usage error), printed as one line.
EXIT_USAGE = 2
#: Exit code of `status` when a queue that is not paused has ready tasks and no live worker serves it.
EXIT_UNSERVED = 1
#: Exit code of `cancel` when a task given was neither cancelled nor asked to abort.
EXIT_NOT_CANCELLED = 1
#: Exit code of `run` when one of the processes it started (the pool, the ASGI server) exited by itself.
EXIT_CHILD_EXITED = 1
#: Exit code of a worker process that failed (a call the server refused, every consumer thread gone).
EXIT_FAILED = 1
#: Exit code of a worker process that stopped because it ran its `--max-tasks`.
EXIT_RECYCLED = 3
#: Exit code of a worker process that replaced itself because a task outlived its time limit and grace.
EXIT_TIMED_OUT = 4
#: Exit code of a worker process, a pool or `run` stopped at once by a second SIGTERM or Ctrl-C.
EXIT_INTERRUPTED = 130
