"""The backend's asyncio path: `aenqueue` and `aget_result` without a thread.

A redis.asyncio connection belongs to the event loop that opened it, so each running loop
has its own `LoopConnections`: a `redis.asyncio` client (for `aget_result`, and on a cluster
for the scripts too) and, on a single server, `CONNECTIONS_PER_LOOP` script connections its
coroutines take in turn.

A script call on a single server goes straight to one of those connections, as the thread
path's do (`transport.ServerTransport`), not through redis.asyncio's command layer: its pool, its
retries, its response callbacks. The command is packed by hiredis, the packer the thread path's
connections use, and the reply read by the connection's own parser. A kept connection the
server closed while it sat idle (a restart, CLIENT KILL) is replaced before it is used, found
by the same poll of its socket as the thread path's (`transport.polls_readable`).

A loop's connections close when the loop ends. asyncio has no callback for that, but whoever
closes a loop properly (`asyncio.run`, `asyncio.Runner`, asgiref's `async_to_sync`) first
finalises the async generators still open on it, and each loop's `LoopConnections` holds
one, suspended, whose `finally` closes them. A loop closed without that leaves its
connections to the garbage collector: they are dropped when the next loop first calls.

The client's pool replaces a connection the server closed by the check redis-py's pools make
when they hand it out. redis-py 8.1 skips that check while maintenance notifications are on,
and turns them on by default under RESP3, so the first call after every restart failed;
Threadmill uses none of them, so `clients.async_client` turns them off.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncGenerator, Callable, Sequence
from typing import Any

import hiredis
import redis
import redis.asyncio
import redis.asyncio.cluster
from django.tasks import TaskResult
from django.tasks.signals import log_task_enqueued, task_enqueued
from redis.asyncio.connection import AbstractConnection

from .errors import is_failover_refusal, translated_errors
from .script_source import LuaScript
from .transport import polls_readable

#: Script connections each event loop keeps to a single server; more concurrent calls wait for one.
#: (redis.asyncio's pool failed the 101st concurrent call instead: "Too many connections".)
CONNECTIONS_PER_LOOP = 16

type AsyncClient = redis.asyncio.Redis | redis.asyncio.cluster.RedisCluster


class LoopConnections:
    """One event loop's client and its script connections, the free ones in a queue (last used on top)."""

    def __init__(self, client: AsyncClient, connections: list[AbstractConnection]) -> None:
        self.client = client
        self.connections = connections
        self.free: asyncio.LifoQueue[AbstractConnection] = asyncio.LifoQueue()
        for connection in connections:
            self.free.put_nowait(connection)
        #: A suspended async generator: finalised when the loop ends, it calls `aclose`.
        self.closer: AsyncGenerator[None, None] | None = None

    async def aclose(self) -> None:
        for connection in self.connections:
            await connection.disconnect()
        await self.client.aclose()


class AsyncClients:
    """Per running event loop, a `redis.asyncio` client (on a cluster a `RedisCluster`) and script connections."""

    def __init__(self, make_client: Callable[[], AsyncClient], socket_timeout: float, *, cluster: bool = False) -> None:
        #: Makes a client for the running loop (`clients.async_client`): its pool makes the script connections.
        self._make_client = make_client
        self.socket_timeout = socket_timeout
        self.cluster = cluster
        self._by_loop: dict[asyncio.AbstractEventLoop, LoopConnections] = {}
        self._lock = threading.Lock()  # loops in other threads add and drop theirs

    async def on_loop(self) -> LoopConnections:
        """Return the running loop's client and connections, created on first use."""
        loop = asyncio.get_running_loop()
        found = self._by_loop.get(loop)
        if found is None:
            client = self._make_client()
            count = 0 if self.cluster else CONNECTIONS_PER_LOOP  # the cluster client routes each call itself
            found = LoopConnections(client, [client.connection_pool.make_connection() for _ in range(count)])
            with self._lock:
                for closed in [other for other in self._by_loop if other.is_closed()]:
                    del self._by_loop[closed]
                self._by_loop[loop] = found
            found.closer = self._close_when_the_loop_ends(loop, found)
            await anext(found.closer)
        return found

    async def _close_when_the_loop_ends(
        self, loop: asyncio.AbstractEventLoop, ending: LoopConnections
    ) -> AsyncGenerator[None, None]:
        try:
            yield
        finally:
            with self._lock:
                if self._by_loop.get(loop) is ending:
                    del self._by_loop[loop]
            await ending.aclose()

    async def run(self, script: LuaScript, keys: Sequence[str], args: Sequence[Any]) -> Any:
        """Call `script` by its SHA, loading it once if the server does not know it."""
        on_loop = await self.on_loop()
        with translated_errors():
            if self.cluster:
                return await _run_on_cluster(on_loop.client, script, keys, args)
            connection = await self._free_connection(on_loop.free)
            try:
                return await _run_on(connection, script, ("EVALSHA", script.sha, len(keys), *keys, *args))
            finally:
                on_loop.free.put_nowait(connection)

    async def _free_connection(self, free: asyncio.LifoQueue[AbstractConnection]) -> AbstractConnection:
        """Take a free connection, waiting at most `socket_timeout` while all are in use."""
        try:
            return free.get_nowait()
        except asyncio.QueueEmpty:
            pass
        try:
            async with asyncio.timeout(self.socket_timeout):
                return await free.get()
        except TimeoutError:
            raise redis.TimeoutError(
                f"none of the event loop's {CONNECTIONS_PER_LOOP} connections came free "
                f"within socket_timeout ({self.socket_timeout:g} s)"
            ) from None

    async def read_task(self, task_key: str, result_key: str, fields: Sequence[str]) -> tuple[list, bytes | None]:
        """Return a task hash's `fields` and its stored result, in one round trip."""
        on_loop = await self.on_loop()
        with translated_errors():
            pipe = on_loop.client.pipeline(transaction=False)
            pipe.hmget(task_key, fields)
            pipe.get(result_key)
            task_fields, stored_result = await pipe.execute()
        return task_fields, stored_result

    async def zscore(self, key: str, member: str) -> float | None:
        """Return a sorted set member's score, None when it is not there."""
        on_loop = await self.on_loop()
        with translated_errors():
            return await on_loop.client.zscore(key, member)


async def _run_on(connection: AbstractConnection, script: LuaScript, command: tuple) -> Any:
    """Send `command` (an EVALSHA of `script`) on `connection` and return its reply; on NOSCRIPT load it first.

    `send_packed_command` and `read_response` apply `socket_timeout` and drop the connection
    on any failure (a reply left unread would be the next call's), so its next user connects anew.
    """
    if connection.is_connected and _closed_by_server(connection):
        await connection.disconnect()
    if not connection.is_connected:
        await connection.connect()  # its own connect(): a Sentinel-managed one asks for the primary there
    packed = hiredis.pack_command(command)
    try:
        return await _round_trip(connection, packed)
    except redis.exceptions.NoScriptError:
        # hiredis types its argument as a 1-tuple (`tuple[X]`, not `tuple[X, ...]`): any command is refused.
        await _round_trip(connection, hiredis.pack_command(("SCRIPT", "LOAD", script.source)))  # type: ignore[arg-type]
        return await _round_trip(connection, packed)


async def _round_trip(connection: AbstractConnection, packed: bytes) -> Any:
    await connection.send_packed_command(packed, check_health=False)
    try:
        return await connection.read_response()
    except redis.ResponseError as e:
        if is_failover_refusal(e):  # a demoted primary keeps refusing: the next call connects anew
            await connection.disconnect()
        raise


def _closed_by_server(connection: AbstractConnection) -> bool:
    """Whether an idle connection holds the server's close, read by the loop already or still in its socket."""
    transport = connection._writer.transport
    if transport.is_closing() or connection._reader.at_eof():
        return True
    sock = transport.get_extra_info("socket")
    return sock is None or polls_readable(sock)


async def _run_on_cluster(
    client: redis.asyncio.cluster.RedisCluster, script: LuaScript, keys: Sequence[str], args: Sequence[Any]
) -> Any:
    """Call `script` through the cluster client, routed by its first key.

    A node that lacks the script gets it by EVAL on the same slot (SCRIPT LOAD would go to a
    node of the client's choosing).
    """
    # Awaited by each call (a no-op once the slot map is read): redis-py 8.1's cluster client,
    # first used by many coroutines at once, sent a third of them to the wrong node, and the
    # reinitialisation those MOVED replies caused closed connections under other calls (a raw
    # TypeError from the transport).
    await client.initialize()
    try:
        return await client.evalsha(script.sha, len(keys), *keys, *args)
    except redis.exceptions.NoScriptError:
        return await client.eval(script.source, len(keys), *keys, *args)


async def send_task_enqueued(sender: type, task_result: TaskResult) -> None:
    """Send `task_enqueued` as `Signal.asend` does, but without a thread when Django's log line is its only receiver.

    asend runs sync receivers through sync_to_async, a thread hop measured at 70 us of CPU a
    call, more than the rest of an aenqueue, and Django always connects one: a debug log line.
    Any other receiver, sync or async, gets asend's own dispatch.
    """
    receivers = _receivers_fit_for_the_loop(sender)
    if receivers is None:
        await task_enqueued.asend(sender, task_result=task_result)
    else:
        for receiver in receivers:
            receiver(signal=task_enqueued, sender=sender, task_result=task_result)


def _receivers_fit_for_the_loop(sender: type) -> list | None:
    """Return `task_enqueued`'s receivers if each may run on the event loop itself (Django's log line), else None."""
    try:
        sync_receivers, async_receivers = task_enqueued._live_receivers(sender)
    except (AttributeError, TypeError, ValueError):  # a Django whose private API changed: asend
        return None
    if async_receivers or any(receiver is not log_task_enqueued for receiver in sync_receivers):
        return None
    return sync_receivers
