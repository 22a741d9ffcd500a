"""The soak's moving parts: the server under test, the counter server, the proxies and the worker pools.

The server under test persists with `appendfsync always`, so a kill -9 of it loses no write
it acknowledged. Every client of it, the soak's own and each pool's, goes through a proxy of
its own (tests/faults/proxy.py), so a network fault can cut one pool off while the other
runs. The counter server is reached directly and nothing breaks it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import psutil

from tests.faults.conftest import FaultServer
from tests.faults.proxy import Proxy
from threadmill.embedded import EmbeddedValkey, free_port

ROOT = Path(__file__).resolve().parents[2]
#: The pools' options, as the environment variables tests/settings.py reads (like tests/faults' FAULT_TIMEOUTS):
#: a short worker_timeout so a lost worker is recovered in seconds, a lease longer than every outage.
SOAK_TIMEOUTS = {
    "THREADMILL_TEST_LEASE_TTL": "60",
    "THREADMILL_TEST_WORKER_TIMEOUT": "3",
    "THREADMILL_TEST_SOCKET_TIMEOUT": "1",
    "THREADMILL_TEST_BROKER_INTERVAL": "0.2",
}
#: Seconds running tasks get to finish after SIGTERM before they are handed back.
SHUTDOWN_TIMEOUT_S = 5
#: The supervisor kills a worker process this long after its shutdown timeout (threadmill.worker.supervisor).
SHUTDOWN_GRACE_S = 3.0
#: The queues of tests.settings.
QUEUES = ["default", "emails", "reports"]
#: Each pool's queues: pool b leaves `emails` to pool a, so a fault on a strands that queue for a while.
POOL_QUEUES = {"a": QUEUES, "b": ["default", "reports"]}


def worker_timeout_s() -> float:
    return float(SOAK_TIMEOUTS["THREADMILL_TEST_WORKER_TIMEOUT"])


class ServerUnderTest(FaultServer):
    """The Valkey the faults break, on one port for good, persisting every write before it answers."""

    def __init__(self, data_dir: Path) -> None:
        super().__init__(data_dir, appendfsync="always")
        self.lock = threading.Lock()

    @property
    def port(self) -> int:
        return self.valkey.port

    def ensure_up(self) -> None:
        if self.valkey.process is None or self.valkey.process.poll() is not None:
            self.valkey.stop()
            self.valkey.start()


def start_counter(data_dir: Path) -> EmbeddedValkey:
    """The server that counts every run; never broken, never persisted."""
    return EmbeddedValkey(data_dir, free_port(), persist=False).start()


class Pool:
    """One `manage.py threadmill worker` pool through its own proxy; each restart is a new incarnation.

    Its worker processes carry `SOAK_POOL=<name>#<incarnation>` in their environment, so a
    run records which incarnation ran it. `lock` serialises restarts and the faults that
    need the pool whole.
    """

    def __init__(self, name: str, proxy: Proxy, counter_url: str, scratch: Path, processes: int, threads: int) -> None:
        self.name = name
        self.proxy = proxy
        self.counter_url = counter_url
        self.scratch = scratch
        self.processes = processes
        self.threads = threads
        self.incarnation = 0
        self.process: subprocess.Popen | None = None
        self.lock = threading.RLock()
        #: Every worker process seen: pid -> (create time, incarnation label), for the cleanup.
        self.seen: dict[int, tuple[float, str]] = {}
        #: Every supervisor started, for the cleanup.
        self.supervisors: list[subprocess.Popen] = []
        #: Incarnations that exited without being told to, with their exit codes.
        self.unexpected_exits: list[tuple[str, int]] = []

    @property
    def label(self) -> str:
        return f"{self.name}#{self.incarnation}"

    def log_path(self, label: str | None = None) -> Path:
        return self.scratch / f"pool-{(label or self.label).replace('#', '-')}.log"

    def start(self) -> None:
        """Start a new incarnation of the pool."""
        with self.lock:
            self.incarnation += 1
            env = {
                **os.environ,
                "DJANGO_SETTINGS_MODULE": "tests.settings",
                "PYTHONUNBUFFERED": "1",
                "THREADMILL_TEST_REDIS_URL": self.proxy.url,
                "THREADMILL_TEST_COUNTER_URL": self.counter_url,
                "SOAK_POOL": self.label,
                **SOAK_TIMEOUTS,
            }
            command = [
                sys.executable, "manage.py", "threadmill", "worker",
                "-q", ",".join(POOL_QUEUES[self.name]), "-w", str(self.processes), "-t", str(self.threads),
                "--shutdown-timeout", str(SHUTDOWN_TIMEOUT_S), "--log-format", "text",
            ]  # fmt: skip
            with open(self.log_path(), "w") as log:
                self.process = subprocess.Popen(
                    command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL, start_new_session=True,
                )  # fmt: skip
            self.supervisors.append(self.process)

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def workers(self) -> list[int]:
        """Pids of the worker processes of the current incarnation, remembered for the cleanup."""
        if self.process is None:
            return []
        try:
            children = psutil.Process(self.process.pid).children()
        except psutil.NoSuchProcess:
            return []
        pids = []
        for child in children:
            with contextlib.suppress(psutil.NoSuchProcess):
                self.seen.setdefault(child.pid, (child.create_time(), self.label))
                pids.append(child.pid)
        return pids

    def stop(self, timeout: float) -> int | None:
        """SIGTERM the supervisor and wait up to `timeout` for it to exit; its exit code, or None if it did not."""
        if not self.running():
            return None if self.process is None else self.process.returncode
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def kill(self) -> None:
        """SIGKILL the supervisor of the current incarnation (its worker processes stop by themselves)."""
        if self.running():
            self.process.kill()
            self.process.wait()

    def log_tail(self, label: str | None = None, chars: int = 2000) -> str:
        try:
            return self.log_path(label).read_text()[-chars:]
        except OSError:
            return ""

    def close(self) -> None:
        """Kill every supervisor and worker process this pool ever started that still lives."""
        for supervisor in self.supervisors:
            if supervisor.poll() is None:
                supervisor.kill()
                supervisor.wait()
        for pid, (created, _) in self.seen.items():
            kill_if_same(pid, created)


def alive_and_same(pid: int, created: float) -> bool:
    """Whether `pid` still runs as the process created at `created` (pids are reused); a zombie is dead."""
    try:
        process = psutil.Process(pid)
        return process.create_time() == created and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def kill_if_same(pid: int, created: float) -> None:
    """SIGCONT and SIGKILL `pid` if it is still the process created at `created`."""
    if alive_and_same(pid, created):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
            os.kill(pid, signal.SIGKILL)
