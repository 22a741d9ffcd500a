"""A live console for browser tests and benchmarks: daphne and workers as real processes.

The site runs with the test settings against the session's Valkey and a throwaway SQLite
file, so the browser, the server and the workers share one Redis and one user table. Each
console's file is a copy of one migrated once per session, so no console sees another's writes.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

#: Seconds a process may take to start listening.
START_TIMEOUT_S = 30.0

ROOT = Path(__file__).resolve().parents[2]
#: The migrated database of each settings module, copied for every console: migrating took 4 to
#: 8 s of a console's 7 to 10 s start on the loaded two-core machine, once per browser test module.
_migrated: dict[str, Path] = {}

_SETUP = """
import django
django.setup()
from django.contrib.auth.models import Permission, User
from django.core.management import call_command
call_command("migrate", interactive=False, verbosity=0)
User.objects.create_superuser("admin", "", "admin-pw")
viewer = User.objects.create_user("viewer", password="viewer-pw", is_staff=True)
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class LiveConsole:
    """A running daphne serving the site, and any worker pools started beside it."""

    url: str
    env: dict[str, str]
    server: subprocess.Popen
    logs: Path
    workers: list[subprocess.Popen] = field(default_factory=list)

    def start_worker(self, *args: str) -> subprocess.Popen:
        """Start `manage.py threadmill worker` (one process, two threads unless told otherwise)."""
        command = [
            sys.executable,
            "-m",
            "django",
            "threadmill",
            "worker",
            "-w",
            "1",
            "-t",
            "2",
            "--log-format",
            "text",
            *args,
        ]
        log = open(self.logs / f"worker-{len(self.workers)}.log", "w")  # noqa: SIM115 - the child owns it
        worker = subprocess.Popen(command, env=self.env, cwd=ROOT, start_new_session=True, stdout=log, stderr=log)
        self.workers.append(worker)
        return worker

    def stop_worker(self, worker: subprocess.Popen, timeout: float = 20.0) -> int:
        """SIGTERM a worker pool (it finishes its tasks) and return its exit code."""
        worker.send_signal(signal.SIGTERM)
        try:
            return worker.wait(timeout)
        finally:
            if worker.poll() is None:
                os.killpg(worker.pid, signal.SIGKILL)
                worker.wait()

    def stop(self) -> None:
        for worker in self.workers:
            if worker.poll() is None:
                self.stop_worker(worker)
        self.server.send_signal(signal.SIGTERM)
        try:
            self.server.wait(10)
        except subprocess.TimeoutExpired:
            self.server.kill()
            self.server.wait()


def _migrated_database(env: dict[str, str]) -> Path:
    """A database migrated with the `admin` and `viewer` users for `env`'s settings, made on first use."""
    settings_module = env["DJANGO_SETTINGS_MODULE"]
    if settings_module not in _migrated:
        made = Path(tempfile.mkdtemp(prefix="threadmill-live-db-")) / "db.sqlite3"
        subprocess.run(
            [sys.executable, "-c", _SETUP], env={**env, "THREADMILL_TEST_DB": str(made)}, cwd=ROOT, check=True
        )
        _migrated[settings_module] = made
    return _migrated[settings_module]


def start_live_console(redis_url: str, settings_module: str = "tests.settings") -> LiveConsole:
    """Copy in a fresh migrated database with the `admin` and `viewer` users, and start daphne on a free port."""
    data_dir = tempfile.mkdtemp(prefix="threadmill-live-")
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": settings_module,
        "THREADMILL_TEST_REDIS_URL": redis_url,
        "THREADMILL_TEST_DB": str(Path(data_dir) / "db.sqlite3"),
        "PYTHONPATH": str(ROOT),
        "THREADMILL_TEST_SCHEDULE": "1",
    }
    shutil.copyfile(_migrated_database(env), env["THREADMILL_TEST_DB"])
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "inspector.site.asgi:application"],
        env=env, cwd=ROOT, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            break
        except OSError:
            if server.poll() is not None or time.monotonic() > deadline:
                server.kill()
                raise RuntimeError(f"daphne did not start on port {port} (exit code {server.poll()}).") from None
            time.sleep(0.05)
    return LiveConsole(f"http://127.0.0.1:{port}", env, server, Path(data_dir))
