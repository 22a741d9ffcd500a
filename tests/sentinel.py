"""A real Redis Sentinel set for the test suite: one primary, one replica, three sentinels, on free ports.

Every process is Debian's `redis-server` (installed by `.ci/bootstrap test`); a sentinel is
`redis-server sentinel.conf --sentinel` with a config file of its own (a sentinel rewrites
it). The sentinels count a primary silent for `down_after_ms` as down and two of them agree
to fail it over, so a SIGKILLed primary is replaced within a few seconds. The set counts as
up once each sentinel sees the replica and the two other sentinels: a failover needs both.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import redis

from threadmill.embedded import EmbeddedValkey, free_port
from threadmill.lifeline import die_with_parent

#: The name the sentinels monitor the primary under.
SERVICE_NAME = "threadmill"
#: Longest the set may take to be up: the sentinels find the replica and each other by hello messages.
SET_READY_TIMEOUT_S = 30.0
#: Sentinels that must agree the primary is down.
QUORUM = 2


def redis_server() -> str:
    """Return the path of Debian's redis-server, or fail with how to install it."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise RuntimeError("The Sentinel tests need Debian's redis-server: run `.ci/bootstrap test`.")
    return binary


@dataclass
class SentinelSet:
    """A primary, its replica and three sentinels on 127.0.0.1; `url` is the backend's REDIS_URL."""

    down_after_ms: int = 1000
    failover_timeout_ms: int = 3000
    #: Password the sentinels require of their clients (`requirepass` of the sentinels), if any.
    sentinel_password: str | None = None
    servers: list[EmbeddedValkey] = field(default_factory=list)
    sentinel_ports: list[int] = field(default_factory=list)
    _sentinels: list[subprocess.Popen] = field(default_factory=list)
    _dirs: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{port}" for port in self.sentinel_ports)
        return f"redis+sentinel://{hosts}/{SERVICE_NAME}/0"

    def start(self) -> SentinelSet:
        primary = self._server()
        self._server("--replicaof", "127.0.0.1", str(primary.port))
        for _ in range(3):
            self._start_sentinel(primary.port)
        self._wait_until_up()
        return self

    def _server(self, *extra: str) -> EmbeddedValkey:
        data_dir = tempfile.mkdtemp(prefix="threadmill-test-sentinel-")
        self._dirs.append(data_dir)
        # A replica's first sync starts at once instead of waiting 5 s for more replicas.
        args = ("--repl-diskless-sync-delay", "0", *extra)
        server = EmbeddedValkey(data_dir, free_port(), persist=False, binary=redis_server(), extra_args=args)
        self.servers.append(server.start())
        return server

    def _start_sentinel(self, primary_port: int) -> None:
        data_dir = tempfile.mkdtemp(prefix="threadmill-test-sentinel-")
        self._dirs.append(data_dir)
        port = free_port()
        lines = [
            f"port {port}",
            "bind 127.0.0.1",
            f"dir {data_dir}",
            "logfile sentinel.log",
            f"sentinel monitor {SERVICE_NAME} 127.0.0.1 {primary_port} {QUORUM}",
            f"sentinel down-after-milliseconds {SERVICE_NAME} {self.down_after_ms}",
            f"sentinel failover-timeout {SERVICE_NAME} {self.failover_timeout_ms}",
            f"sentinel parallel-syncs {SERVICE_NAME} 1",
        ]
        if self.sentinel_password:
            lines.append(f"requirepass {self.sentinel_password}")
            lines.append(f"sentinel sentinel-pass {self.sentinel_password}")
        config = Path(data_dir) / "sentinel.conf"
        config.write_text("\n".join(lines) + "\n")
        process = subprocess.Popen(
            [redis_server(), str(config), "--sentinel"],
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=die_with_parent(os.getpid()),  # noqa: PLW1509 - only prctl
        )
        self._sentinels.append(process)
        self.sentinel_ports.append(port)

    def sentinel_client(self, port: int) -> redis.Redis:
        return redis.Redis(port=port, password=self.sentinel_password, decode_responses=True, socket_timeout=1)

    def _wait_until_up(self) -> None:
        deadline = time.monotonic() + SET_READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if all(self._sees_the_set(port) for port in self.sentinel_ports):
                return
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"The Sentinel set did not come up within {SET_READY_TIMEOUT_S:g} s.")

    def _sees_the_set(self, port: int) -> bool:
        try:
            with self.sentinel_client(port) as client:
                state = client.sentinel_master(SERVICE_NAME)
        except (redis.ConnectionError, redis.ResponseError):
            return False
        return int(state["num-other-sentinels"]) == 2 and int(state["num-slaves"]) == 1

    def primary_port(self) -> int:
        """The port of the primary, as the first sentinel that answers names it."""
        for port in self.sentinel_ports:
            try:
                with self.sentinel_client(port) as client:
                    return int(client.sentinel_get_master_addr_by_name(SERVICE_NAME)[1])
            except redis.ConnectionError:
                continue
        raise RuntimeError("No sentinel answers.")

    def server_on(self, port: int) -> EmbeddedValkey:
        return next(server for server in self.servers if server.port == port)

    def kill_primary(self) -> EmbeddedValkey:
        """SIGKILL the primary (no goodbye to its replica or the sentinels) and return it."""
        primary = self.server_on(self.primary_port())
        primary.process.kill()
        primary.process.wait()
        return primary

    def flush(self) -> None:
        with redis.Redis(port=self.primary_port()) as client:
            client.flushall()

    def stop(self) -> None:
        for process in self._sentinels:
            if process.poll() is None:
                process.terminate()
                process.wait(10)
        for server in self.servers:
            server.stop()
        for data_dir in self._dirs:
            shutil.rmtree(data_dir, ignore_errors=True)
