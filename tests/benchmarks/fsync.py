"""Enqueue cost of `fsync_enqueue`: tasks/s from one thread, option off and on, per appendfsync.

Run: `python -m tests.benchmarks.fsync [--tasks N] [--repeats R]`. Each row uses a fresh
Valkey with its append-only file in a temporary directory (on the machine's own disk) and
enqueues the `echo` task through `RedisTaskBackend`; the median of the repeats is printed.
"""

from __future__ import annotations

import shutil
import statistics
import tempfile
import time

from threadmill.embedded import EmbeddedValkey, free_port

from .backend import setup_django
from .report import enqueue_cost_args

#: (appendfsync, fsync_enqueue) pairs measured, in the order printed.
CASES = [("everysec", False), ("everysec", True), ("always", False), ("always", True)]


def enqueue_rate(appendfsync: str, fsync_enqueue: bool, tasks: int) -> float:
    """Return tasks enqueued per second on a fresh server with this append-only file policy."""
    from tests.tasks import echo
    from threadmill.backends.redis import RedisTaskBackend

    data_dir = tempfile.mkdtemp(prefix="threadmill-bench-fsync-")
    try:
        with EmbeddedValkey(data_dir, free_port(), persist=True, appendfsync=appendfsync) as server:
            backend = RedisTaskBackend(
                "default", {"REDIS_URL": server.url, "OPTIONS": {"fsync_enqueue": fsync_enqueue}}
            )
            backend.enqueue(echo, ["warm-up"], {})
            start = time.perf_counter()
            for i in range(tasks):
                backend.enqueue(echo, [i], {})
            return tasks / (time.perf_counter() - start)
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)


def run(tasks: int, repeats: int) -> None:
    print(f"enqueue from one thread, {tasks} tasks, median of {repeats}")
    print("| appendfsync | fsync_enqueue | tasks/s |")
    print("|---|---|---|")
    for appendfsync, fsync_enqueue in CASES:
        rate = statistics.median(enqueue_rate(appendfsync, fsync_enqueue, tasks) for _ in range(repeats))
        print(f"| {appendfsync} | {'on' if fsync_enqueue else 'off'} | {rate:,.0f} |")


def main() -> None:
    args = enqueue_cost_args("python -m tests.benchmarks.fsync", __doc__)
    setup_django("redis://127.0.0.1:1/0")
    run(args.tasks, args.repeats)


if __name__ == "__main__":
    main()
