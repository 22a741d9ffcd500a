"""A backend on each server kind, and helpers that read the stored state directly."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
import redis

from threadmill.backends.redis import RedisTaskBackend
from threadmill.outcome import mark_successful


@pytest.fixture
def backend(server) -> RedisTaskBackend:
    """The contract suite's backend, once per server kind (valkey, redis where installed, cluster)."""
    return RedisTaskBackend(
        "default",
        server.params(
            QUEUES=["default", "emails", "reports"],
            OPTIONS={"lease_ttl": 300, "poll_interval": 0.005, "poll_max_interval": 0.02, "batch_size": 7},
        ),
    )


@pytest.fixture
def raw(server) -> redis.Redis:
    """A plain client on the node holding the alias's keys (all share its hash tag), for asserting on them."""
    return server.client_for("threadmill:{default}")


def same_server(backend: RedisTaskBackend, **params) -> dict:
    """Return a TASKS entry for another backend on `backend`'s server, plus `params`."""
    return {"REDIS_URL": backend.redis_url, "CLUSTER": backend.cluster, **params}


def enqueue(backend, task, *args, **kwargs):
    """Enqueue through `backend` (not the task's configured one)."""
    return backend.enqueue(task, args, kwargs)


def finish(backend, result, return_value=None) -> bool:
    """Mark a leased result successful and acknowledge it."""
    mark_successful(result, datetime.now(UTC))
    return backend.acknowledge(result, return_value)
