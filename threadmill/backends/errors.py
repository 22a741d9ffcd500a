"""Driver errors translated at the boundary: what redis-py raises becomes Threadmill's own exceptions.

A lost connection, a timeout or a cluster without a primary for a slot is `ServerUnreachable`
(the caller rides it out); so is a refusal that says the server is not, or not yet, the
writable primary (`is_failover_refusal`); a refusal for memory at `maxmemory` is
`ServerOutOfMemory`; any other refusal by the server is `BackendConnectionError`; a WAITAOF
refusal is `DurableEnqueueError` naming what to change.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator

import redis

from ..exceptions import BackendConnectionError, DurableEnqueueError, ServerOutOfMemory, ServerUnreachable
from ..redaction import redact_text

#: Driver errors that mean the server (or the cluster's node for a key) cannot be reached now, not a
#: refusal: a lost connection, a timeout, and on a cluster a slot without a live primary or a
#: redirection still wrong after a refresh of the slot map (a failover in progress).
UNREACHABLE_ERRORS = (
    redis.ConnectionError,
    redis.TimeoutError,
    redis.exceptions.ClusterError,
    redis.exceptions.RedisClusterException,
    redis.exceptions.TryAgainError,
    redis.exceptions.AskError,
)

#: What a NOREPLICAS refusal starts with: fewer good replicas than `min-replicas-to-write` (redis-py has no class for it).
_NO_REPLICAS = "NOREPLICAS"


def is_failover_refusal(error: BaseException) -> bool:
    """Whether `error` is a refusal of a server that is not the writable primary now, so its connection is dropped.

    READONLY (a primary demoted by a failover, or a DNS name that now points at a replica),
    LOADING (a restarted server reading its data), MASTERDOWN (a replica without its primary)
    and NOREPLICAS (too few replicas for `min-replicas-to-write`). Each ends when the failover
    or the restart does; a connection kept to a demoted primary would keep hearing READONLY, so
    the caller drops it and the next call connects anew (through Sentinel: to the new primary).
    """
    if isinstance(
        error, redis.exceptions.ReadOnlyError | redis.exceptions.BusyLoadingError | redis.exceptions.MasterDownError
    ):
        return True
    return isinstance(error, redis.ResponseError) and str(error).startswith(_NO_REPLICAS)


def _refused(error: redis.ResponseError) -> BackendConnectionError:
    text = redact_text(str(error))
    if is_failover_refusal(error):
        return ServerUnreachable(f"The Redis server cannot take writes now (a failover or a restart): {text}")
    return BackendConnectionError(f"The Redis server refused a Threadmill script: {text}")


#: The driver errors `translate_errors` turns into Threadmill's; any other passes through as it is.
_TRANSLATED = (*UNREACHABLE_ERRORS, redis.ResponseError)


def translate_errors(method):
    """Re-raise redis-py's errors: connection losses and timeouts as ServerUnreachable, the rest as BackendConnectionError."""

    @functools.wraps(method)
    def wrapper(*args, **kwargs):
        try:
            return method(*args, **kwargs)
        except _TRANSLATED as e:
            raise _translation(e) from e

    return wrapper


@contextlib.contextmanager
def translated_errors() -> Iterator[None]:
    """The same translation as `translate_errors`, for a block (the asyncio client's calls)."""
    try:
        yield
    except _TRANSLATED as e:
        raise _translation(e) from e


def _translation(error: Exception) -> BackendConnectionError:
    """Return Threadmill's exception for a driver error of `_TRANSLATED`."""
    if isinstance(error, UNREACHABLE_ERRORS):
        return ServerUnreachable(f"Cannot reach the Redis server: {redact_text(str(error))}")
    if isinstance(error, redis.exceptions.OutOfMemoryError):
        return out_of_memory(error)
    return _refused(error)  # the rest of _TRANSLATED: a ResponseError


def out_of_memory(
    error: redis.exceptions.OutOfMemoryError,
    what: str = "a write",
    maxmemory: int | None = None,
    policy: str | None = None,
) -> ServerOutOfMemory:
    """Explain a refusal for memory: `what` was refused at `maxmemory` (bytes) under `policy`, and what to do.

    Where the caller does not know the limit or the policy (they come from the preflight's
    INFO), the message names them as the server's settings.
    """
    limit = f"maxmemory ({maxmemory} bytes)" if maxmemory else "maxmemory"
    policy_text = (
        f"maxmemory-policy {policy}" if policy else "its maxmemory-policy (noeviction, or nothing left to evict)"
    )
    return ServerOutOfMemory(
        f"The Redis server refused {what}: its used memory reached {limit}, and under {policy_text} it refuses "
        f"writes that add data ({redact_text(str(error))}); raise maxmemory, let the workers drain the queues "
        "(they keep running on a full server), or purge tasks nobody needs (the console's purge, threadmill.api.purge)."
    )


def durable_enqueue_error(error: redis.ResponseError) -> DurableEnqueueError:
    """Explain a WAITAOF refusal: no append-only file, or a server too old to have WAITAOF."""
    text = str(error)
    if "appendonly is disabled" in text:
        reason = (
            "the Redis server has no append-only file (appendonly no), so it cannot confirm a task is on disk. "
            "Turn it on (appendonly yes in its configuration, or CONFIG SET appendonly yes)"
        )
    elif "unknown command" in text.lower():
        reason = "the Redis server does not know WAITAOF, which needs Redis or Valkey 7.2 or later. Upgrade the server"
    else:
        reason = f"the Redis server refused WAITAOF ({text}). Fix the server"
    return DurableEnqueueError(f"The backend option fsync_enqueue is on, but {reason}, or turn fsync_enqueue off.")
