"""System checks for a Redis backend's configuration."""

from __future__ import annotations

from collections.abc import Callable

from django.core.checks import Error, Warning

from ..exceptions import BackendConnectionError
from .options import BackendOptions
from .preflight import ServerReport


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


def check_server(preflight: Callable[[], ServerReport]) -> list[Error | Warning]:
    """Return the findings of a backend's `preflight` on its server, when it answers: a refused version, an evicting policy."""
    try:
        report = preflight()
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
