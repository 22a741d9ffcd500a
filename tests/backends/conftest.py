"""A backend on each server kind, and helpers that read the stored state directly."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
import redis

from threadmill.backends.redis import RedisTaskBackend
from threadmill.outcome import mark_successful


@pytest.fixture
def backend(server_url) -> RedisTaskBackend:
    """The contract suite's backend, once per server kind (valkey; redis where installed)."""
    return RedisTaskBackend(
        "default",
        {
            "REDIS_URL": server_url,
            "QUEUES": ["default", "emails", "reports"],
            "OPTIONS": {"lease_ttl": 300, "poll_interval": 0.005, "poll_max_interval": 0.02, "batch_size": 7},
        },
    )


@pytest.fixture
def raw(backend) -> redis.Redis:
    """A plain client on the backend's server, for asserting on stored keys."""
    return redis.Redis.from_url(backend.redis_url)


def enqueue(backend, task, *args, **kwargs):
    """Enqueue through `backend` (not the task's configured one)."""
    return backend.enqueue(task, args, kwargs)


def finish(backend, result, return_value=None) -> bool:
    """Mark a leased result successful and acknowledge it."""
    mark_successful(result, datetime.now(UTC))
    return backend.acknowledge(result, return_value)
