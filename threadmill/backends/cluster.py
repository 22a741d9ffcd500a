"""Script calls on a Redis or Valkey Cluster: each goes to the primary that owns its keys' slot.

Every key of one script call carries one hash tag (see docs/reference/data-model.md), so the
slot of its first key is the slot of all of them. `ClusterTransport` keeps the single-node
transport's shape (one raw connection per thread, no redis-py command layer) with one
connection per thread and node, found through the cluster client's slot map.

A connection the node closed (a restart, CLIENT KILL) is found by a poll before it is reused
and made anew, as on a single server. A redirection (MOVED, ASK) or a command that could not
be sent (the node is gone) refreshes the slot map and is tried once more, which is what
carries a call across a failover; one that timed out on a node the fresh map still names is
not (the node is hung: another try would wait out another `socket_timeout`), and the map is
read from the other nodes first. A command that was sent but whose reply was lost is never
resent: it may have run, and running a script twice is not safe (an acquire would lease
twice). The caller sees `ServerUnreachable` then, as on a single server, and rides it out.
"""

from __future__ import annotations

import inspect
import logging
import os
from collections.abc import Sequence
from typing import Any

import redis
from redis.cluster import NodesManager, RedisCluster
from redis.crc import key_slot

from .script_source import LuaScript
from .transport import ServerTransport, dropped_on_failover, reusable, send

logger = logging.getLogger("threadmill.backend")

#: Whether this redis-py's slot map reload can be told which node to ask last (newer releases; 5.2 cannot).
_ASKS_FAILED_NODE_LAST = "last_failed_node_name" in inspect.signature(NodesManager.initialize).parameters
#: Redirections and refusals a node answers before running anything: the call may go again.
_NOT_RUN = (redis.exceptions.MovedError, redis.exceptions.TryAgainError, redis.exceptions.ClusterDownError)


class ClusterTransport(ServerTransport):
    """Script calls to a cluster, each sent to the primary owning its keys' slot over this thread's connection to it."""

    client: RedisCluster

    def _connections(self) -> dict[str, Any]:
        """Return this thread's raw connections by node name (`host:port`), made anew in a forked child."""
        local = self._local
        if getattr(local, "pid", None) != os.getpid():
            local.by_node = {}
            local.aof_checked = set()
            local.pid = os.getpid()
        return local.by_node

    def connection_for(self, key: str):
        """Return this thread's connection to the primary owning `key`'s slot, as the slot map names it now."""
        return self._connection_for(key)

    def server_name(self, key: str) -> str:
        """Name the primary owning `key`'s slot (`host:port`), as the slot map says now."""
        return self.client.nodes_manager.get_node_from_slot(key_slot(key.encode())).name

    def _connection_for(self, key: str):
        node = self.client.nodes_manager.get_node_from_slot(key_slot(key.encode()))
        return self._node_connection(node)

    def _node_connection(self, node):
        connections = self._connections()
        connection = connections.get(node.name)
        if connection is None:
            pool = self.client.get_redis_connection(node).connection_pool
            connection = connections[node.name] = pool.make_connection()
        return connection

    def _refresh(self, error: Exception, failed_node: str | None = None) -> None:
        """Reload the slot map after `error`; a cluster that cannot answer now leaves the old one.

        `failed_node` (`host:port`), the node that did not answer, is asked last for the map.
        """
        if isinstance(error, redis.exceptions.MovedError):
            self.client.nodes_manager.move_slot(error)
            return
        manager = self.client.nodes_manager
        try:
            if failed_node is not None and _ASKS_FAILED_NODE_LAST:
                # Asked first, a hung node (SIGSTOP) would cost the refresh a socket_timeout of its own.
                manager.initialize(last_failed_node_name=failed_node)
            else:
                manager.initialize()
        except (redis.RedisError, redis.exceptions.RedisClusterException) as e:
            logger.debug("Refreshing the cluster's slot map failed: %s", e)

    def _send(self, key: str, command: Sequence[Any], timeout: float | None = None) -> tuple[Any, Any]:
        """Send one command to the node owning `key`'s slot; return its reply and the connection it went on."""
        for attempt in (1, 2):
            connection = self._connection_for(key)
            try:
                reusable(connection)
                send(connection, command)
            except (redis.ConnectionError, redis.TimeoutError) as e:
                # Not sent, so not run: safe to send again once the map is fresh.
                connection.disconnect()
                owner = _node_name(connection)
                self._refresh(e, failed_node=owner)
                if attempt == 2 or (isinstance(e, redis.TimeoutError) and self.server_name(key) == owner):
                    # A node that timed out and still owns the slot is hung (SIGSTOP, a stalled
                    # host): a second try would only wait out another socket_timeout.
                    raise
                continue
            try:
                if timeout is None:
                    return connection.read_response(), connection
                return connection.read_response(timeout=timeout), connection
            except _NOT_RUN as e:
                self._refresh(e)
                if attempt == 2:
                    raise
            except redis.exceptions.AskError as e:
                return self._send_asking(e, command), connection
            except (redis.ConnectionError, redis.TimeoutError) as e:
                # Sent but unanswered: it may have run, so it is not sent again.
                connection.disconnect()
                self._refresh(e, failed_node=_node_name(connection))
                raise
            except redis.ResponseError as e:
                if dropped_on_failover(connection, e):
                    self._refresh(e)
                raise
        raise AssertionError("unreachable")  # pragma: no cover

    def _send_asking(self, error: redis.exceptions.AskError, command: Sequence[Any]) -> Any:
        """Send `command` once to the node an ASK names (a slot being migrated), without changing the map."""
        node = self.client.nodes_manager.get_node(host=error.host, port=error.port)
        if node is None:
            self._refresh(error)
            node = self.client.nodes_manager.get_node(host=error.host, port=error.port)
        if node is None:
            raise error
        connection = self._node_connection(node)
        try:
            reusable(connection)
            connection.send_command("ASKING")
            connection.read_response()
            send(connection, command)
            return connection.read_response()
        except (redis.ConnectionError, redis.TimeoutError):
            connection.disconnect()
            raise

    def _run_on_owner(self, script: LuaScript, keys: Sequence[str], args: Sequence[Any]) -> tuple[Any, Any]:
        command = ("EVALSHA", script.sha, len(keys), *keys, *args)
        try:
            return self._send(keys[0], command)
        except redis.exceptions.NoScriptError:
            # A node that never ran it (a new primary after a failover, one restarted, or the
            # target of an ASK): EVAL runs it there and leaves it in that node's script cache.
            return self._send(keys[0], ("EVAL", script.source, len(keys), *keys, *args))

    def run(self, script: LuaScript, keys: Sequence[str], args: Sequence[Any]) -> Any:
        return self._run_on_owner(script, keys, args)[0]

    def run_durably(self, script: LuaScript, keys: Sequence[str], args: Sequence[Any], wait_s: float) -> tuple:
        """Run a script, then WAITAOF on the connection that ran it (the owner of its slot)."""
        wait_ms = max(1, round(wait_s * 1000))
        connection = self._connection_for(keys[0])
        checked = self._local.aof_checked
        if id(connection) not in checked:
            self.wait_for_append_only_file(reusable(connection), wait_ms)
            checked.add(id(connection))
        reply, connection = self._run_on_owner(script, keys, args)
        return reply, self.wait_for_append_only_file(connection, wait_ms)

    def wait_for_wake(self, wake_keys: Sequence[str], timeout_s: float, socket_timeout_s: float) -> str | None:
        """Block on the wake lists (BLPOP, one slot) on the node owning their slot; return the key that woke, or None."""
        reply, _ = self._send(wake_keys[0], ("BLPOP", *wake_keys, timeout_s), timeout=timeout_s + socket_timeout_s)
        return None if reply is None else reply[0].decode()


def _node_name(connection: Any) -> str:
    """Name the node a connection goes to as the slot map does (`host:port`)."""
    return f"{connection.host}:{connection.port}"
