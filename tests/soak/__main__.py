"""Run the soak: `python -m tests.soak [--minutes 30] [--output PATH]`.

For N minutes producers enqueue a mix of tasks, two worker pools run them, an operator
works the queues and faults fire at random (tests/soak/faults.py). Then it stops producing,
lets everything drain (bounded), prints the table and writes it as JSON. It exits 1 if any
task was lost, is stuck, ended in a wrong state or ran twice without a fault that allows it.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

from tests.faults.proxy import Proxy

from .faults import FaultLog
from .harness import SOAK_TIMEOUTS, Pool, ServerUnderTest, start_counter, worker_timeout_s

#: Where the result goes unless --output says otherwise.
DEFAULT_OUTPUT = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "soak.json"
#: Longest the soak waits for the pools' first heartbeats, seconds.
START_TIMEOUT_S = 60.0
#: What `threadmill worker` says when it exits at start because the server does not answer.
UNREACHABLE_AT_START = "CommandError: Cannot reach the Redis server"
#: Seconds between two looks at the pools.
MONITOR_S = 0.25


class Soak:
    """The servers, proxies, pools and threads of one soak, and their teardown."""

    def __init__(self, args: argparse.Namespace, scratch: Path) -> None:
        self.args = args
        self.scratch = scratch
        self.log = FaultLog()
        self.counter = start_counter(scratch / "counter")
        self.server = ServerUnderTest(scratch / "server").start()
        self.proxies = {name: Proxy(self.server.port, name=name).start() for name in ("client", "a", "b")}
        os.environ.update(
            DJANGO_SETTINGS_MODULE="tests.settings",
            THREADMILL_TEST_REDIS_URL=self.proxies["client"].url,
            THREADMILL_TEST_COUNTER_URL=self.counter.url,
            **SOAK_TIMEOUTS,
        )
        import django

        django.setup()
        self.pools = [
            Pool(name, self.proxies[name], self.counter.url, scratch, args.processes, args.threads)
            for name in ("a", "b")
        ]
        self.stopping = threading.Event()
        #: When the load began, epoch seconds: the problems' times count from it.
        self.started_at = time.time()

    def direct_backend(self):
        """A backend on the server under test without a proxy, for the soak's own checks."""
        from threadmill.backends.redis import RedisTaskBackend

        from .harness import QUEUES

        options = {"lease_ttl": 60, "worker_timeout": worker_timeout_s(), "socket_timeout": 5}
        return RedisTaskBackend("default", {"REDIS_URL": self.server.url, "QUEUES": QUEUES, "OPTIONS": options})

    def monitor(self) -> None:
        """Note every worker process, and restart a pool whose supervisor exited without being told to."""
        while not self.stopping.wait(MONITOR_S):
            for pool in self.pools:
                if not pool.lock.acquire(blocking=False):
                    continue  # A fault is restarting it.
                try:
                    pool.workers()
                    if pool.process is not None and pool.process.poll() is not None and not self.stopping.is_set():
                        code, tail = pool.process.returncode, pool.log_tail(chars=600)
                        pool.unexpected_exits.append((pool.label, code))
                        text = f"pool {pool.label} exited by itself with code {code}; restarted. Its log ends: {tail!r}"
                        # A pool that starts while the server is down may refuse to start; one that ran must not exit.
                        report = self.log.note if UNREACHABLE_AT_START in tail else self.log.finding
                        report(text)
                        pool.start()
                finally:
                    pool.lock.release()

    def wait_for_heartbeats(self, backend, count: int) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            with contextlib.suppress(Exception):
                if len(backend.live_workers()) >= count:
                    return
            time.sleep(0.1)
        raise RuntimeError(f"Fewer than {count} worker processes sent a heartbeat within {START_TIMEOUT_S:g} s.")

    def close(self) -> None:
        self.stopping.set()
        for pool in self.pools:
            pool.close()
        for proxy in self.proxies.values():
            proxy.stop()
        self.server.stop()
        self.counter.stop()


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tests.soak", description=__doc__)
    parser.add_argument("--minutes", type=float, default=30.0, help="how long faults fire and producers enqueue")
    parser.add_argument(
        "--output", type=Path, default=DEFAULT_OUTPUT, help=f"the JSON result (default {DEFAULT_OUTPUT})"
    )
    parser.add_argument("--seed", type=int, default=15, help="seed of the load and of the faults")
    parser.add_argument("--fault-gap", type=float, default=20.0, help="mean seconds between two faults of one family")
    parser.add_argument("--rate", type=float, default=3.0, help="enqueue calls a second per producer")
    parser.add_argument("--producers", type=int, default=3, help="producer threads")
    parser.add_argument("--processes", type=int, default=2, help="worker processes per pool")
    parser.add_argument("--threads", type=int, default=2, help="consumer threads per worker process")
    parser.add_argument("--drain-timeout", type=float, default=120.0, help="longest wait for the drain, seconds")
    return parser.parse_args(argv)


def _interrupt(signum, frame) -> None:
    """SIGTERM ends the soak like Ctrl-C: every `finally` stops what it started."""
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    signal.signal(signal.SIGTERM, _interrupt)
    scratch = Path(tempfile.mkdtemp(prefix="threadmill-soak-"))
    soak = Soak(args, scratch)
    verdict = None
    try:
        # Imported once Soak has set the environment and Django up: importing a task reads the settings.
        from .run import run

        verdict = run(soak)
    finally:
        soak.close()
    if verdict is None or verdict.failed or soak.log.findings:
        print(f"\nThe pools' logs and the servers' data are kept in {scratch}.")
    else:
        shutil.rmtree(scratch, ignore_errors=True)
    return 2 if verdict is None else int(verdict.failed or bool(soak.log.findings))


if __name__ == "__main__":
    sys.exit(main())
