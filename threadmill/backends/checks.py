"""System checks for a Redis backend's configuration."""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.core.checks import Error

if TYPE_CHECKING:
    from .redis import RedisTaskBackend


def check_backend(backend: RedisTaskBackend) -> list[Error]:
    """Return configuration errors of `backend`, each with a hint."""
    errors = []
    options = backend.config
    if options.poll_interval > options.poll_max_interval:
        errors.append(
            Error(
                f"TASKS[{backend.alias!r}] has poll_interval above poll_max_interval.",
                hint="Make poll_interval at most poll_max_interval.",
                id="threadmill.E001",
            )
        )
    if not backend.redis_url.startswith(("redis://", "rediss://", "unix://", "valkey://", "valkeys://")):
        errors.append(
            Error(
                f"TASKS[{backend.alias!r}]['REDIS_URL'] is not a redis://, rediss:// or unix:// URL.",
                hint="Use a URL such as redis://127.0.0.1:6379/0.",
                id="threadmill.E002",
            )
        )
    return errors
