"""System checks for a Redis backend's configuration."""

from __future__ import annotations

from django.core.checks import Error

from .options import BackendOptions


def check_backend(alias: str, redis_url: str, options: BackendOptions) -> list[Error]:
    """Return the configuration errors of the backend `alias` (its URL and parsed options), each with a hint."""
    errors = []
    if options.poll_interval > options.poll_max_interval:
        errors.append(
            Error(
                f"TASKS[{alias!r}] has poll_interval above poll_max_interval.",
                hint="Make poll_interval at most poll_max_interval.",
                id="threadmill.E001",
            )
        )
    if not redis_url.startswith(("redis://", "rediss://", "unix://", "valkey://", "valkeys://")):
        errors.append(
            Error(
                f"TASKS[{alias!r}]['REDIS_URL'] is not a redis://, rediss:// or unix:// URL.",
                hint="Use a URL such as redis://127.0.0.1:6379/0.",
                id="threadmill.E002",
            )
        )
    return errors
