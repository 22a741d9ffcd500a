"""The worker command freezes what its start imported out of garbage collection, and its processes still collect.

Read at each fork of an `--exit-empty` run on empty queues, from a hook the wrapper installs;
nothing is timed here (`python -m tests.benchmarks start` times the start).
"""

from __future__ import annotations

import gc
import subprocess
import sys

from tests.worker.conftest import ROOT, worker_env
from threadmill.management.commands.threadmill import Command

#: Runs manage.py and prints, in the parent at each fork and in the forked process, the objects
#: frozen out of collection and whether the collector runs.
AT_FORK = """
import gc, os, runpy, sys

def tell(where):
    print(f"{where} frozen={gc.get_freeze_count()} enabled={gc.isenabled()}", file=sys.stderr, flush=True)

os.register_at_fork(before=lambda: tell("supervisor"), after_in_child=lambda: tell("worker"))
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""
#: Fewer objects than a start imports (about 95,000 under a new project's settings).
FEW_OBJECTS = 50_000


def at_fork(settings: str) -> dict[str, tuple[int, bool]]:
    """Run an `--exit-empty` worker on empty queues; return each side's frozen count and collector state at its fork."""
    command = [sys.executable, "-c", AT_FORK, "manage.py", "threadmill", "worker", "--exit-empty", "-w", "1", "-t", "1"]
    env = worker_env(DJANGO_SETTINGS_MODULE=settings)
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    told = {}
    for line in done.stderr.splitlines():
        where, _, rest = line.partition(" frozen=")
        if where in ("supervisor", "worker") and rest:
            frozen, _, enabled = rest.partition(" enabled=")
            told[where] = (int(frozen), enabled == "True")
    return told


def test_a_worker_forks_with_its_start_frozen_and_collecting_and_call_command_freezes_nothing(redis_url):
    told = at_fork("tests.settings_project")
    assert told["supervisor"][0] > FEW_OBJECTS and told["supervisor"][1]
    assert told["worker"][0] > FEW_OBJECTS and told["worker"][1]
    # A caller of call_command (a test, a site's code) keeps its objects collectable.
    frozen = gc.get_freeze_count()
    Command().create_parser("manage.py", "threadmill")
    assert gc.get_freeze_count() == frozen
