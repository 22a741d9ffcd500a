"""A real Redis Sentinel set for the test suite: one primary, one replica, three sentinels, on free ports.

Every process is Debian's `redis-server` (installed by `.ci/bootstrap test`); a sentinel is
`redis-server sentinel.conf --sentinel` with a config file of its own (a sentinel rewrites
it). The sentinels count a primary silent for `down_after_ms` as down and two of them agree
to fail it over, so a SIGKILLed primary is replaced within a few seconds. The set counts as
up once each sentinel sees the replica and the two other sentinels: a failover needs both.

With `tls` every process, data node and sentinel, serves only TLS (`port 0`) and asks each
client for a certificate the test's CA signed, the replica and the sentinels included
(`tls-replication yes`). With `acl` the data nodes' only application user is `acl.username`
with `acl.rules`; the default user, which the replica and the sentinels log in as, takes
`acl.admin_password`. With `sentinel_user` the sentinels' default user is off.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from threadmill.backends.keys import ACL_RULES
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


def tls_kwargs(folder: Path) -> dict[str, Any]:
    """The redis-py keyword arguments of a client of a node or a sentinel of a set with certificates in `folder`."""
    return {
        "ssl": True,
        "ssl_ca_certs": str(folder / "ca.crt"),
        "ssl_certfile": str(folder / "client.crt"),
        "ssl_keyfile": str(folder / "client.key"),
    }


def tls_settings(folder: Path) -> list[tuple[str, str]]:
    """The TLS directives of every process of a set: TLS only, client certificates asked and given."""
    return [
        ("tls-cert-file", str(folder / "server.crt")),
        ("tls-key-file", str(folder / "server.key")),
        ("tls-client-cert-file", str(folder / "client.crt")),
        ("tls-client-key-file", str(folder / "client.key")),
        ("tls-ca-cert-file", str(folder / "ca.crt")),
        ("tls-auth-clients", "yes"),
        ("tls-replication", "yes"),
    ]


@dataclass(frozen=True)
class DataACL:
    """The ACL of a set's data nodes: the application's user, and the default user's password."""

    password: str
    admin_password: str
    username: str = "threadmill"
    rules: str = ACL_RULES


class _Node(EmbeddedValkey):
    """A data node whose start-up PING speaks the set's TLS (EmbeddedValkey's own is plain)."""

    def __init__(self, *args: Any, client_kwargs: dict[str, Any], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.client_kwargs = client_kwargs

    def _wait_until_ready(self, process: subprocess.Popen) -> None:
        deadline = time.monotonic() + SET_READY_TIMEOUT_S
        while process.poll() is None and time.monotonic() < deadline:
            try:
                with redis.Redis(port=self.port, socket_timeout=0.5, **self.client_kwargs) as client:
                    client.ping()
                return
            except redis.ConnectionError:
                time.sleep(0.02)  # a start-up poll with a deadline
        self.stop()
        raise RuntimeError(f"The data node on port {self.port} did not answer; see {self.data_dir / 'valkey.log'}.")


@dataclass
class SentinelSet:
    """A primary, its replica and three sentinels on 127.0.0.1; `url` is the backend's REDIS_URL."""

    down_after_ms: int = 1000
    failover_timeout_ms: int = 3000
    #: Password the sentinels require of their clients (`requirepass` of the sentinels), if any.
    sentinel_password: str | None = None
    #: The sentinels' own user (with `sentinel_password`); without one they check only the password.
    sentinel_user: str | None = None
    #: A folder of tests.tls.make_certificates' files: every process then serves only TLS.
    tls: Path | None = None
    #: The data nodes' ACL, if any.
    acl: DataACL | None = None
    servers: list[EmbeddedValkey] = field(default_factory=list)
    sentinel_ports: list[int] = field(default_factory=list)
    _sentinels: list[subprocess.Popen] = field(default_factory=list)
    _dirs: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        """The REDIS_URL of the set: `rediss+sentinel://` with `tls`, the application user's credentials with `acl`."""
        hosts = ",".join(f"127.0.0.1:{port}" for port in self.sentinel_ports)
        userinfo = f"{self.acl.username}:{self.acl.password}@" if self.acl else ""
        return f"{'rediss' if self.tls else 'redis'}+sentinel://{userinfo}{hosts}/{SERVICE_NAME}/0"

    @property
    def sentinel_kwargs(self) -> dict[str, Any]:
        """The redis-py keyword arguments of a client of a sentinel (`OPTIONS["sentinel"]`)."""
        kwargs: dict[str, Any] = tls_kwargs(self.tls) if self.tls else {}
        if self.sentinel_user:
            kwargs["username"] = self.sentinel_user
        if self.sentinel_password:
            kwargs["password"] = self.sentinel_password
        return kwargs

    @property
    def node_kwargs(self) -> dict[str, Any]:
        """The redis-py keyword arguments of an administrator's client of a data node."""
        kwargs: dict[str, Any] = tls_kwargs(self.tls) if self.tls else {}
        if self.acl:
            kwargs["password"] = self.acl.admin_password
        return kwargs

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
        port = free_port()
        # A replica's first sync starts at once instead of waiting 5 s for more replicas.
        args = ["--repl-diskless-sync-delay", "0", *extra]
        if self.tls:  # the last `--port` wins: TLS only
            args += ["--port", "0", "--tls-port", str(port)]
            args += [word for name, value in tls_settings(self.tls) for word in (f"--{name}", value)]
        if self.acl:
            args += ["--masterauth", self.acl.admin_password]
        tls = tls_kwargs(self.tls) if self.tls else {}
        server = _Node(data_dir, port, persist=False, binary=redis_server(), extra_args=tuple(args), client_kwargs=tls)
        self.servers.append(server.start())
        if self.acl:
            self._lock_down(server, tls)
        return server

    def _lock_down(self, server: EmbeddedValkey, tls: dict[str, Any]) -> None:
        """Give the node the application's user and an administrator's password on its default user."""
        assert self.acl is not None
        with redis.Redis(port=server.port, **tls) as admin:
            admin.execute_command(
                "ACL", "SETUSER", self.acl.username, "on", f">{self.acl.password}", *self.acl.rules.split()
            )
            admin.execute_command("ACL", "SETUSER", "default", "resetpass", f">{self.acl.admin_password}")

    def _start_sentinel(self, primary_port: int) -> None:
        data_dir = tempfile.mkdtemp(prefix="threadmill-test-sentinel-")
        self._dirs.append(data_dir)
        port = free_port()
        lines = [
            *([f"tls-port {port}", "port 0"] if self.tls else [f"port {port}"]),
            *(f"{name} {value}" for name, value in (tls_settings(self.tls) if self.tls else [])),
            "bind 127.0.0.1",
            f"dir {data_dir}",
            "logfile sentinel.log",
            f"sentinel monitor {SERVICE_NAME} 127.0.0.1 {primary_port} {QUORUM}",
            f"sentinel down-after-milliseconds {SERVICE_NAME} {self.down_after_ms}",
            f"sentinel failover-timeout {SERVICE_NAME} {self.failover_timeout_ms}",
            f"sentinel parallel-syncs {SERVICE_NAME} 1",
        ]
        if self.acl:
            lines.append(f"sentinel auth-pass {SERVICE_NAME} {self.acl.admin_password}")
        if self.sentinel_user:  # the sentinels log in to each other as that user, and the default user is off
            lines.append(f"user {self.sentinel_user} on >{self.sentinel_password} ~* &* +@all")
            lines.append("user default off")
            lines.append(f"sentinel sentinel-user {self.sentinel_user}")
            lines.append(f"sentinel sentinel-pass {self.sentinel_password}")
        elif self.sentinel_password:
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
        return redis.Redis(port=port, decode_responses=True, socket_timeout=1, **self.sentinel_kwargs)

    def node_client(self, port: int) -> redis.Redis:
        """An administrator's client of the data node on `port`."""
        return redis.Redis(port=port, socket_timeout=1, **self.node_kwargs)

    def primary_client(self) -> redis.Redis:
        return self.node_client(self.primary_port())

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
        with self.primary_client() as client:
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
