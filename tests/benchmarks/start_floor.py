"""The start benchmark's floor: what any worker run by `manage.py` pays before its first task.

`python -m tests.benchmarks.start_floor TOKEN` does what `manage.py` does up to a command's
own code (import Django's management package, `django.setup()` with the settings named in
DJANGO_SETTINGS_MODULE), imports redis-py as every Redis worker does, and then runs the
probe task's first statement itself. No worker is that fast; the row shows how much of a
start is the project's Django and the driver rather than threadmill.
"""

from __future__ import annotations

import os
import sys
import time


def main(token: str) -> None:
    import django
    import django.core.management  # manage.py's import, checks and all

    django.setup()
    import redis  # noqa: F401

    from .probe import record_start

    record_start(token, time.time())
    os._exit(0)  # as the worker command exits: the interpreter's finalisation is no part of a start


if __name__ == "__main__":
    main(sys.argv[1])
