"""System checks for a Redis backend's configuration."""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.core.checks import Error, Warning

from ..exceptions import BackendConnectionError

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


def check_server(backend: RedisTaskBackend) -> list[Error | Warning]:
    """Return the preflight's findings on `backend`'s server, when it answers: a refused version, an evicting policy."""
    try:
        report = backend.preflight()
    except BackendConnectionError:
        return []  # reachability is not configuration: the worker and `threadmill status` report it
    except ValueError:
        return []  # a REDIS_URL redis-py cannot read: threadmill.E002 names it
    found: list[Error | Warning] = []
    if report.refusal:
        found.append(Error(report.refusal, hint="Upgrade the server to Redis 7.0 or later.", id="threadmill.E003"))
    for warning in report.warnings:
        unread = report.policy is None
        hint = "Grant the user +info (ACL SETUSER ... +info)." if unread else "Set maxmemory-policy noeviction."
        found.append(Warning(warning, hint=hint, id="threadmill.W002" if unread else "threadmill.W001"))
    return found
