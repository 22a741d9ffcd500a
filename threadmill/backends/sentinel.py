"""REDIS_URL for a primary found through Redis Sentinel: `redis+sentinel://` and `rediss+sentinel://`.

The form is `redis+sentinel://[user:password@]host:port[,host:port...]/service_name[/db]`: the
sentinels to ask, the name they monitor the primary under, and the database. The user and
password are the primary's (and its replicas'); the sentinels' own come from
`OPTIONS["sentinel"]`. `rediss+sentinel://` speaks TLS to the primary. A sentinel without a
port is on 26379, the Sentinel default.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import unquote

#: The schemes of a Sentinel REDIS_URL: plain, and TLS to the primary.
SENTINEL_SCHEMES = ("redis+sentinel", "rediss+sentinel")
#: Port of a sentinel named without one.
DEFAULT_SENTINEL_PORT = 26379


@dataclass(frozen=True, slots=True)
class SentinelURL:
    """A parsed Sentinel REDIS_URL."""

    sentinels: tuple[tuple[str, int], ...]
    service_name: str
    db: int = 0
    username: str | None = None
    password: str | None = None
    #: Whether the primary's connections use TLS (`rediss+sentinel://`).
    ssl: bool = False

    def primary_kwargs(self) -> dict[str, object]:
        """Return the redis-py keyword arguments this URL sets for the primary's connections."""
        kwargs: dict[str, object] = {"db": self.db}
        if self.username is not None:
            kwargs["username"] = self.username
        if self.password is not None:
            kwargs["password"] = self.password
        if self.ssl:
            kwargs["ssl"] = True
        return kwargs


def is_sentinel_url(url: str) -> bool:
    """Whether `url` names its primary through Sentinel (`redis+sentinel://` or `rediss+sentinel://`)."""
    return url.partition("://")[0].lower() in SENTINEL_SCHEMES


def parse_sentinel_url(url: str) -> SentinelURL:
    """Return `url` parsed; ValueError says what is wrong with it (never quoting its password)."""
    scheme, separator, rest = url.partition("://")
    if not separator or scheme.lower() not in SENTINEL_SCHEMES:
        raise ValueError("a Sentinel URL starts with redis+sentinel:// or rediss+sentinel://")
    if "?" in rest or "#" in rest:
        raise ValueError("a Sentinel URL takes no query or fragment; give options in OPTIONS['connection']")
    userinfo, at, address = rest.rpartition("@")
    if not at:
        userinfo, address = "", rest
    hosts, _, path = address.partition("/")
    service_name, _, db = path.partition("/")
    if not service_name:
        raise ValueError("a Sentinel URL names the service after the hosts: redis+sentinel://host:26379/mymaster/0")
    username, password = _credentials(userinfo) if at else (None, None)
    return SentinelURL(
        sentinels=tuple(_sentinel(host) for host in hosts.split(",")),
        service_name=unquote(service_name),
        db=_db(db.strip("/")),
        username=username,
        password=password,
        ssl=scheme.lower() == "rediss+sentinel",
    )


def _credentials(userinfo: str) -> tuple[str | None, str | None]:
    user, colon, password = userinfo.partition(":")
    return unquote(user) or None, unquote(password) if colon else None


def _sentinel(host: str) -> tuple[str, int]:
    if not host:
        raise ValueError("a Sentinel URL names at least one sentinel, host:port, and no empty one between commas")
    if host.startswith("["):  # an IPv6 address, [::1]:26379
        name, _, port = host[1:].partition("]")
        port = port.removeprefix(":")
    else:
        name, _, port = host.rpartition(":") if ":" in host else (host, "", "")
    if not port:
        return name, DEFAULT_SENTINEL_PORT
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"the sentinel {name!r} has a port that is not a number from 1 to 65535")
    return name, int(port)


def _db(text: str) -> int:
    if not text:
        return 0
    if not text.isdigit():
        raise ValueError(f"the database after the service name must be a number, not {text!r}")
    return int(text)
