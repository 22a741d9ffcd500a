"""The backend's asyncio path: `aenqueue` and `aget_result` on `redis.asyncio`, without a thread.

A redis.asyncio connection belongs to the event loop that opened it, so there is one client
per running loop, held weakly: a loop that is gone takes its client with it.

Its pool replaces a connection the server closed (a restart, CLIENT KILL) when it hands it
out, by the check redis-py's pools make. redis-py 8.1 skips that check while maintenance
notifications are on, and turns them on by default under RESP3, so the first call after
every restart failed; Threadmill uses none of them, so they are off here.
"""

from __future__ import annotations

import asyncio
import inspect
import weakref
from collections.abc import Sequence
from typing import Any

import redis
import redis.asyncio
import redis.asyncio.cluster

try:
    from redis.maint_notifications import MaintNotificationsConfig
except ImportError:  # redis-py before 6.4 has no maintenance notifications
    MaintNotificationsConfig = None

from .scripts import LuaScript, translated_errors


class AsyncClients:
    """One `redis.asyncio.Redis` (or, on a cluster, `redis.asyncio.cluster.RedisCluster`) per running event loop."""

    def __init__(self, url: str, socket_timeout: float, *, cluster: bool = False) -> None:
        self.url = url
        self.socket_timeout = socket_timeout
        self.cluster = cluster
        self._by_loop: weakref.WeakKeyDictionary[
            asyncio.AbstractEventLoop, redis.asyncio.Redis | redis.asyncio.cluster.RedisCluster
        ] = weakref.WeakKeyDictionary()

    def client(self) -> redis.asyncio.Redis | redis.asyncio.cluster.RedisCluster:
        """Return the running loop's client, created on first use."""
        loop = asyncio.get_running_loop()
        client = self._by_loop.get(loop)
        if client is None:
            factory = redis.asyncio.cluster.RedisCluster if self.cluster else redis.asyncio.Redis
            client = self._by_loop[loop] = factory.from_url(
                self.url,
                decode_responses=False,
                socket_timeout=self.socket_timeout,
                socket_connect_timeout=self.socket_timeout,
                **_without_maintenance_notifications(factory),
            )
        return client

    async def run(self, script: LuaScript, keys: Sequence[str], args: Sequence[Any]) -> Any:
        """Call `script` by its SHA, loading it once if the server does not know it.

        The cluster client routes EVALSHA by its first key; a node that lacks the script gets
        it by EVAL on the same slot (SCRIPT LOAD would go to a node of the client's choosing).
        """
        client = self.client()
        with translated_errors():
            if self.cluster:
                # Awaited by each call (a no-op once the slot map is read): redis-py 8.1's cluster
                # client, first used by many coroutines at once, sent a third of them to the wrong
                # node, and the reinitialisation those MOVED replies caused closed connections
                # under other calls (a raw TypeError from the transport).
                await client.initialize()
            try:
                return await client.evalsha(script.sha, len(keys), *keys, *args)
            except redis.exceptions.NoScriptError:
                if self.cluster:
                    return await client.eval(script.source, len(keys), *keys, *args)
                await client.script_load(script.source)
                return await client.evalsha(script.sha, len(keys), *keys, *args)

    async def read_task(self, task_key: str, result_key: str, fields: Sequence[str]) -> tuple[list, bytes | None]:
        """Return a task hash's `fields` and its stored result, in one round trip."""
        with translated_errors():
            pipe = self.client().pipeline(transaction=False)
            pipe.hmget(task_key, fields)
            pipe.get(result_key)
            task_fields, stored_result = await pipe.execute()
        return task_fields, stored_result


def _without_maintenance_notifications(factory: type) -> dict[str, Any]:
    """Return the client option that turns maintenance notifications off, where this redis-py has them."""
    if MaintNotificationsConfig is None or "maint_notifications_config" not in inspect.signature(factory).parameters:
        return {}
    return {"maint_notifications_config": MaintNotificationsConfig(enabled=False)}
