"""The redis-py clients a backend makes: one place for the URL forms and `OPTIONS["connection"]`.

Invariant: every client, sync or asyncio, of a single server, a cluster or a primary found
through Sentinel, is made here with `OPTIONS["connection"]` as keyword arguments. The raw
connections of the thread path and of the asyncio path come from those clients' pools
(`make_connection()`), which keep the same arguments, so they carry them too; so does every
pub/sub connection. Threadmill's `socket_timeout` option is the one read timeout (it is what a
worker rides an outage out by), so `OPTIONS["connection"]` may not set it; it may set
`socket_connect_timeout`, which is `socket_timeout` otherwise.

A sentinel is asked with `OPTIONS["sentinel"]` only (its own password, TLS), plus the timeouts:
`OPTIONS["connection"]` is for the primary, whose credentials a sentinel rarely shares.

A client of a single server drops a connection that answered READONLY (a primary demoted by a
failover, or a DNS name that now points elsewhere), as it does one that failed, so the next
call connects anew; Sentinel's own connections do so already.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.asyncio.retry
import redis.asyncio.sentinel
import redis.retry
import redis.sentinel
from django.core.exceptions import ImproperlyConfigured
from redis.backoff import NoBackoff
from redis.cluster import REDIS_ALLOWED_KEYS, RedisCluster

from ..redaction import redact_url
from .options import BackendOptions
from .sentinel import is_sentinel_url, parse_sentinel_url

try:
    from redis.maint_notifications import MaintNotificationsConfig
except ImportError:  # redis-py before 6.4 has no maintenance notifications
    MaintNotificationsConfig = None
try:
    from redis.driver_info import DriverInfo
except ImportError:  # an older redis-py, whose connections take no DriverInfo
    DriverInfo = None

#: The connection keyword arguments that say what a client is (`CLIENT SETINFO`); given one, redis-py's default goes.
DRIVER_KEYWORDS = frozenset({"driver_info", "lib_name", "lib_version"})

#: Keyword arguments Threadmill sets itself, with where to set them instead.
OWNED_KEYWORDS = {
    "host": "REDIS_URL",
    "port": "REDIS_URL",
    "path": "REDIS_URL",
    "db": "REDIS_URL",
    "decode_responses": "nowhere: Threadmill reads replies as bytes",
    "socket_timeout": "OPTIONS['socket_timeout']",
}


def _init_parameters(*classes: type) -> dict[str, inspect.Parameter]:
    """The keyword parameters of the `__init__` of `classes` and their bases, by name."""
    found: dict[str, inspect.Parameter] = {}
    for cls in classes:
        for base in cls.__mro__:
            if "__init__" in vars(base):
                for name, parameter in inspect.signature(vars(base)["__init__"]).parameters.items():
                    if name != "self" and parameter.kind not in (parameter.VAR_KEYWORD, parameter.VAR_POSITIONAL):
                        found.setdefault(name, parameter)
    return found


#: URL schemes whose connections speak TLS, and the one of a unix socket.
_TLS_SCHEMES = ("rediss", "valkeys", "rediss+sentinel")
_UNIX_SCHEME = "unix"


def connection_classes(url: str) -> tuple[type, type]:
    """Return the sync and asyncio connection classes redis-py makes for `url`'s scheme (TCP, TLS or unix socket)."""
    scheme = url.partition("://")[0].lower()
    if scheme in _TLS_SCHEMES:
        return redis.SSLConnection, redis.asyncio.SSLConnection
    if scheme == _UNIX_SCHEME:
        return redis.UnixDomainSocketConnection, redis.asyncio.UnixDomainSocketConnection
    return redis.Connection, redis.asyncio.Connection


def connection_parameters(url: str) -> dict[str, inspect.Parameter]:
    """The keyword arguments both the sync and the asyncio connections of `url` take."""
    sync_class, aio_class = connection_classes(url)
    sync, aio = _init_parameters(sync_class), _init_parameters(aio_class)
    return {name: parameter for name, parameter in sync.items() if name in aio}


def cluster_keywords() -> set[str]:
    """The connection keyword arguments both redis-py cluster clients pass on to their nodes' connections."""
    aio = set(inspect.signature(redis.asyncio.cluster.RedisCluster.__init__).parameters)
    return set(REDIS_ALLOWED_KEYS) & aio


def sentinel_parameters() -> dict[str, inspect.Parameter]:
    """The keyword arguments of a client of a sentinel, sync and asyncio (`redis.Redis`)."""
    sync = _init_parameters(redis.Redis)
    aio = _init_parameters(redis.asyncio.Redis)
    return {name: parameter for name, parameter in sync.items() if name in aio and name not in ("host", "port")}


def url_problem(url: str) -> str | None:
    """Return why redis-py cannot read the server URL `url` (in words that hold none of it), or None."""
    if url.lower().startswith("unix://") or is_sentinel_url(url):
        return None  # a socket path has no port; a Sentinel URL has its own parser
    try:
        _ = urlsplit(url).port  # reading it parses it
    except ValueError:
        # Not the driver's message: it quotes what it took for the port, a piece of the password.
        return "its port is not a number"
    return None


def readable_url(url: str) -> None:
    """Raise ImproperlyConfigured, naming `url` without its secrets, if redis-py cannot read it."""
    if problem := url_problem(url):
        raise ImproperlyConfigured(
            f"REDIS_URL {redact_url(url)} cannot be read: {problem}. "
            "Percent-encode a '?', '#', '/' or '@' in the user name or password (urllib.parse.quote(password, safe=''))."
        )


def client_kwargs(config: BackendOptions) -> dict[str, Any]:
    """Return the keyword arguments every client of the backend gets: `OPTIONS["connection"]` and the timeouts."""
    # A timeout on every read, so a hung server (SIGSTOP, a dead host) fails a call instead of
    # blocking its thread for good; the worker then backs off and retries.
    kwargs = {
        "socket_connect_timeout": config.socket_timeout,
        **config.connection,
        "socket_timeout": config.socket_timeout,
        "decode_responses": False,
    }
    if DriverInfo is not None and not DRIVER_KEYWORDS & config.connection.keys():
        # redis-py's own name and version, as it sends them by default, but its version read from
        # the module: its default reads the installed package's metadata for every connection,
        # which cost a worker's start 30 ms (the first lookup scans sys.path) and 2 ms a connection after.
        kwargs["driver_info"] = DriverInfo(lib_version=redis.__version__)
    return kwargs


def _sentinel_kwargs(config: BackendOptions, retry_class: type) -> dict[str, Any]:
    """Return the keyword arguments of the clients of the sentinels: the timeouts, no retry, `OPTIONS["sentinel"]`.

    No retry: redis-py asks the next sentinel when one fails, and its default for these clients
    (three retries, pauses of up to seconds) made each failing sentinel cost a connect seconds:
    tests/backends' enqueue refused by three password-guarded sentinels took 12.3 s, 3.3 s without.
    """
    timeouts = {"socket_timeout": config.socket_timeout, "socket_connect_timeout": config.socket_timeout}
    return {**timeouts, "retry": retry_class(NoBackoff(), 0), **config.sentinel}


def sync_client(url: str, config: BackendOptions, *, cluster: bool) -> redis.Redis | RedisCluster:
    """Return the sync client of `url`: a cluster's, a Sentinel-found primary's, or a single server's."""
    kwargs = client_kwargs(config)
    if is_sentinel_url(url):
        parsed = parse_sentinel_url(url)
        asked = _sentinel_kwargs(config, redis.retry.Retry)
        sentinel = redis.sentinel.Sentinel(list(parsed.sentinels), sentinel_kwargs=asked, **kwargs)
        return sentinel.master_for(parsed.service_name, **parsed.primary_kwargs())
    readable_url(url)
    if cluster:
        return RedisCluster.from_url(url, **{**without_maintenance_notifications(RedisCluster), **kwargs})
    kwargs = {**without_maintenance_notifications(redis.Redis), **kwargs}
    return redis.Redis.from_url(url, **_dropping_on_readonly(kwargs, redis.retry.Retry))


def async_client(url: str, config: BackendOptions, *, cluster: bool) -> Any:
    """Return an asyncio client of `url`, as `sync_client` does; it belongs to the running event loop."""
    kwargs = client_kwargs(config)
    if is_sentinel_url(url):
        parsed = parse_sentinel_url(url)
        sentinel = redis.asyncio.sentinel.Sentinel(
            list(parsed.sentinels), sentinel_kwargs=_sentinel_kwargs(config, redis.asyncio.retry.Retry), **kwargs
        )
        return sentinel.master_for(parsed.service_name, **parsed.primary_kwargs())
    readable_url(url)
    factory = redis.asyncio.cluster.RedisCluster if cluster else redis.asyncio.Redis
    kwargs = {**without_maintenance_notifications(factory), **kwargs}
    return factory.from_url(url, **(kwargs if cluster else _dropping_on_readonly(kwargs, redis.asyncio.retry.Retry)))


def _dropping_on_readonly(kwargs: dict[str, Any], retry_class: type) -> dict[str, Any]:
    """Add to a single server's client `kwargs` a retry policy that drops a connection on READONLY too.

    redis-py's default for a client made from a URL: no retry, and a connection that failed is
    dropped before the error is raised. This keeps both (no retry: a command is never sent
    twice) and counts READONLY as such a failure. A `retry` of `OPTIONS["connection"]` wins.
    """
    if "retry" in kwargs:
        return kwargs
    errors = (redis.ConnectionError, redis.TimeoutError, TimeoutError, redis.exceptions.ReadOnlyError)
    return {**kwargs, "retry": retry_class(NoBackoff(), 0, supported_errors=errors)}


def without_maintenance_notifications(factory: type) -> dict[str, Any]:
    """Return the client option that turns maintenance notifications off, where this redis-py has them.

    redis-py 8.1 skips the check its pool makes of a connection it hands out while they are on,
    and turns them on by default under RESP3; Threadmill uses none of them. On, every new
    connection also asked for them, a round trip that Valkey and older Redis refuse: three in a
    worker's start before its first task.
    """
    if MaintNotificationsConfig is None or "maint_notifications_config" not in inspect.signature(factory).parameters:
        return {}
    return {"maint_notifications_config": MaintNotificationsConfig(enabled=False)}


def keyword_problems(given: Mapping[str, Any], accepted: Mapping[str, inspect.Parameter], taker: str) -> list[str]:
    """Return a sentence for each keyword of `given` that `accepted` lacks or whose value has the wrong type.

    The type is checked where it is cheap: a parameter whose default is a bool takes a bool, one
    whose default is a number takes a number, one whose default is a string a string.
    """
    problems = []
    for name, value in given.items():
        parameter = accepted.get(name)
        if parameter is None:
            problems.append(f"{name!r} is not a keyword argument of {taker}")
            continue
        for kind, words in _CHECKED_KINDS:
            if isinstance(parameter.default, kind):
                if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
                    problems.append(f"{name!r} must be {words}, not {type(value).__name__}")
                break
    return problems


#: The defaults whose type a value must share, the first that matches (a bool is an int too), in words.
_CHECKED_KINDS: tuple[tuple[Any, str], ...] = ((bool, "True or False"), (int | float, "a number"), (str, "a string"))
