"""System checks for a Redis backend's configuration."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from django.core.checks import Error, Warning
from django.core.exceptions import ImproperlyConfigured

from ..exceptions import BackendConnectionError
from . import clients
from .options import BackendOptions
from .preflight import ServerReport
from .sentinel import is_sentinel_url, parse_sentinel_url

#: The ids of the errors about OPTIONS' redis-py keyword arguments: a client made with them may not be made.
KEYWORD_ERRORS = ("threadmill.E004", "threadmill.E005")
#: The URL schemes REDIS_URL may have.
URL_SCHEMES = ("redis://", "rediss://", "unix://", "valkey://", "valkeys://", "redis+sentinel://", "rediss+sentinel://")


def check_backend(alias: str, redis_url: str, options: BackendOptions, *, cluster: bool = False) -> list[Error]:
    """Return the configuration errors of the backend `alias` (its URL and parsed options), each with a hint."""
    errors = check_url(alias, redis_url) + check_connection(alias, redis_url, options.connection, cluster=cluster)
    errors += check_sentinel(alias, options.sentinel)
    if options.poll_interval > options.poll_max_interval:
        errors.append(
            Error(
                f"TASKS[{alias!r}] has poll_interval above poll_max_interval.",
                hint="Make poll_interval at most poll_max_interval.",
                id="threadmill.E001",
            )
        )
    return errors


def check_url(alias: str, redis_url: str) -> list[Error]:
    """Return threadmill.E002 for a REDIS_URL of no known scheme, or a Sentinel URL that cannot be read."""
    if not redis_url.lower().startswith(URL_SCHEMES):
        return [
            Error(
                f"TASKS[{alias!r}]['REDIS_URL'] is not a redis://, rediss://, unix:// or redis+sentinel:// URL.",
                hint="Use a URL such as redis://127.0.0.1:6379/0 or redis+sentinel://10.0.0.1:26379/mymaster/0.",
                id="threadmill.E002",
            )
        ]
    if problem := clients.url_problem(redis_url):
        return [
            Error(
                f"TASKS[{alias!r}]['REDIS_URL'] cannot be read: {problem}.",
                hint="Percent-encode a '?', '#', '/' or '@' in the user name or password "
                "(urllib.parse.quote(password, safe='')).",
                id="threadmill.E002",
            )
        ]
    if is_sentinel_url(redis_url):
        try:
            parse_sentinel_url(redis_url)
        except ValueError as e:
            return [
                Error(
                    f"TASKS[{alias!r}]['REDIS_URL'] cannot be read: {e}.",
                    hint="Write it as redis+sentinel://[user:password@]host:port[,host:port...]/service_name[/db].",
                    id="threadmill.E002",
                )
            ]
    return []


def check_connection(alias: str, redis_url: str, connection: Mapping[str, Any], *, cluster: bool) -> list[Error]:
    """Return threadmill.E004 for each keyword of OPTIONS['connection'] redis-py would refuse or Threadmill sets itself."""
    name = f"TASKS[{alias!r}]['OPTIONS']['connection']"
    owned = {key: where for key, where in clients.OWNED_KEYWORDS.items() if key in connection}
    errors = [
        Error(f"{name} sets {key!r}, which Threadmill sets itself.", hint=f"Set it in {where}.", id="threadmill.E004")
        for key, where in owned.items()
    ]
    rest = {key: value for key, value in connection.items() if key not in owned}
    accepted = clients.connection_parameters(redis_url)
    taker = f"redis-py's {clients.connection_classes(redis_url)[0].__name__}, the connection REDIS_URL's scheme makes"
    for problem in clients.keyword_problems(rest, accepted, taker):
        errors.append(_keyword_error(name, problem, "threadmill.E004"))
    if cluster:
        passed_on = clients.cluster_keywords()
        for key in sorted(set(rest) - passed_on):
            if key in accepted:
                errors.append(
                    Error(
                        f"{name}: {key!r} is not passed on to a node's connections by redis-py's cluster client.",
                        hint="Remove it: on a cluster it would be dropped without a word.",
                        id="threadmill.E004",
                    )
                )
    return errors


def check_sentinel(alias: str, sentinel: Mapping[str, Any]) -> list[Error]:
    """Return threadmill.E005 for each keyword of OPTIONS['sentinel'] a client of a sentinel would refuse."""
    name = f"TASKS[{alias!r}]['OPTIONS']['sentinel']"
    problems = clients.keyword_problems(sentinel, clients.sentinel_parameters(), "redis-py's client of a sentinel")
    return [_keyword_error(name, problem, "threadmill.E005") for problem in problems]


def _keyword_error(name: str, problem: str, error_id: str) -> Error:
    return Error(
        f"{name}: {problem}.",
        hint="Give only keyword arguments redis-py takes there, with values of their types (TLS ones need rediss://).",
        id=error_id,
    )


def check_server(preflight: Callable[[], ServerReport]) -> list[Error | Warning]:
    """Return the findings of a backend's `preflight` on its server, when it answers: a refused version, an evicting policy."""
    try:
        report = preflight()
    except BackendConnectionError:
        return []  # reachability is not configuration: the worker and `threadmill status` report it
    except (ValueError, ImproperlyConfigured):
        return []  # a REDIS_URL redis-py cannot read: threadmill.E002 names it
    found: list[Error | Warning] = []
    if report.refusal:
        found.append(Error(report.refusal, hint="Upgrade the server to Redis 7.0 or later.", id="threadmill.E003"))
    for warning in report.warnings:
        unread = report.policy is None
        hint = "Grant the user +info (ACL SETUSER ... +info)." if unread else "Set maxmemory-policy noeviction."
        found.append(Warning(warning, hint=hint, id="threadmill.W002" if unread else "threadmill.W001"))
    return found
