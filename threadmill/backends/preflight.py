"""The preflight: the server's version, memory policy and persistence, read in one INFO and judged before any write.

`assess(info, address)` is the pure decision: it refuses a server below `MIN_REDIS_VERSION` and
warns (never refuses) about a `maxmemory-policy` that may evict Threadmill's keys. `read_info`
is its one round trip (`INFO server memory persistence`). It runs once per process (the
backend keeps the report): at the start of a worker and of every command, in `manage.py check`
and on a line of `threadmill status` (which reads it anew, for `used_memory` against
`maxmemory`: whether the server is full); never on the task path. Valkey reports a compatible
`redis_version` (7.2.4) beside its own `valkey_version`: the floor applies to the former.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import redis

#: The oldest server Threadmill supports, as its (compatible) `redis_version`: sharded pub/sub and `WAITAOF`'s era.
MIN_REDIS_VERSION = (7, 0)
#: The one policy under which the server never drops a key to make room.
SAFE_POLICY = "noeviction"
#: What each family of eviction policies may drop of Threadmill's keys.
EVICTABLE = {
    "allkeys": "any key: tasks, task results, uniqueness keys and rate tokens",
    "volatile": "keys with a TTL: task results, uniqueness keys (a duplicate can then be enqueued) and rate tokens",
}
#: What to do about an evicting policy, the end of each such warning.
POLICY_FIX = (
    "Set maxmemory-policy noeviction (CONFIG SET, or your provider's parameter group) and size maxmemory for the tasks."
)


@dataclass(frozen=True)
class ServerReport:
    """What the preflight read of a server and what it concluded; a field is None where INFO did not say."""

    #: "Valkey 9.1.2 (redis_version 7.2.4)", "Redis 7.4.1", or None.
    server: str | None
    maxmemory: int | None
    policy: str | None
    #: Whether the append-only file is on.
    aof: bool | None
    #: A one-line reason to refuse the server, or None.
    refusal: str | None
    warnings: tuple[str, ...]
    #: Bytes the server used when INFO was read.
    used_memory: int | None = None

    @property
    def full(self) -> bool:
        """Whether the server's used memory had reached its `maxmemory` (it then refuses enqueues)."""
        return bool(self.maxmemory and self.used_memory is not None and self.used_memory >= self.maxmemory)

    def summary(self) -> str:
        """Return the report as one line, as `threadmill status` prints it."""
        if self.policy is None:
            return f"server: {self.server or 'unknown'}; could not read the policy"
        memory = "no limit" if not self.maxmemory else f"{self.maxmemory} bytes"
        aof = {True: "on", False: "off", None: "unknown"}[self.aof]
        full = (
            f"; full: used memory {self.used_memory} of maxmemory {self.maxmemory} bytes, so enqueues are refused "
            "while workers drain (raise maxmemory, or purge tasks nobody needs)"
            if self.full
            else ""
        )
        return (
            f"server: {self.server or 'unknown version'}; maxmemory {memory}, maxmemory-policy {self.policy}; "
            f"append-only file {aof}{full}"
        )


def version_tuple(text: object) -> tuple[int, ...] | None:
    """Return a version's leading numbers ("7.2.4" -> (7, 2, 4)), or None when it has none."""
    found = re.match(r"\s*(\d+(?:\.\d+)*)", str(text)) if text is not None else None
    return tuple(int(part) for part in found.group(1).split(".")) if found else None


def is_supported(redis_version: object) -> bool | None:
    """Return whether a `redis_version` is at least `MIN_REDIS_VERSION`; None when it cannot be read."""
    version = version_tuple(redis_version)
    if version is None:
        return None
    return version + (0,) * (len(MIN_REDIS_VERSION) - len(version)) >= MIN_REDIS_VERSION  # "7" is 7.0


def server_name(info: Mapping[str, Any]) -> str | None:
    """Name the server's product and version(s): Valkey's own beside its compatible `redis_version`."""
    redis_version = info.get("redis_version")
    if info.get("valkey_version") is not None:
        return f"Valkey {info['valkey_version']} (redis_version {redis_version})"
    if redis_version is None:
        return None
    product = "Valkey" if str(info.get("server_name", "")).lower() == "valkey" else "Redis"
    return f"{product} {redis_version}"


def policy_warning(policy: str) -> str | None:
    """Return the warning an eviction policy deserves (what it may drop and what to do), or None for noeviction."""
    if policy == SAFE_POLICY:
        return None
    family = policy.partition("-")[0]
    drops = EVICTABLE.get(family, "keys Threadmill needs")
    return f"maxmemory-policy is {policy}, not {SAFE_POLICY}: at maxmemory the server may evict {drops}. {POLICY_FIX}"


def assess(info: Mapping[str, Any] | None, address: str, unread: str = "") -> ServerReport:
    """Judge a server from its INFO (None where it was refused, `unread` saying why) named by `address` (redacted)."""
    if info is None:
        why = f" ({unread})" if unread else ""
        unchecked = (
            f"The preflight could not read the policy of the server at {address}{why}: maxmemory-policy is unchecked."
        )
        return ServerReport(None, None, None, None, None, (unchecked,))
    policy = None if info.get("maxmemory_policy") is None else str(info["maxmemory_policy"])
    warning = (
        policy_warning(policy) if policy is not None else "The preflight could not read the policy: INFO has none."
    )
    maxmemory, aof, used = info.get("maxmemory"), info.get("aof_enabled"), info.get("used_memory")
    return ServerReport(
        server_name(info),
        maxmemory if isinstance(maxmemory, int) else None,
        policy,
        None if aof is None else bool(aof),
        refusal(info, address),
        (warning,) if warning else (),
        used if isinstance(used, int) else None,
    )


def refusal(info: Mapping[str, Any], address: str) -> str | None:
    """Return the one line refusing a server below `MIN_REDIS_VERSION` (naming its version(s) and the floor), or None."""
    if is_supported(info.get("redis_version")) is not False:
        return None  # a supported or unreadable version: an unreadable one is not grounds to stop
    floor = ".".join(map(str, MIN_REDIS_VERSION))
    return (
        f"The server at {address} is {server_name(info)}, below Redis {floor}, the oldest Threadmill supports; "
        f"upgrade it to Redis {floor} or later (or Valkey 7.2 or later)."
    )


def read_info(client: redis.Redis) -> tuple[dict[str, Any] | None, str]:
    """Read the preflight's INFO sections in one round trip; (None, why) where the server refuses INFO.

    A connection error propagates: the caller's translation names the unreachable server.
    """
    try:
        return client.info("server", "memory", "persistence"), ""
    except redis.exceptions.NoPermissionError as e:
        return None, f"INFO is not permitted: {e}"
    except redis.ResponseError:
        # A server that takes one INFO section only (Redis before 7.0): all of them, still one call.
        try:
            return client.info(), ""
        except redis.exceptions.NoPermissionError as e:
            return None, f"INFO is not permitted: {e}"
