"""How script calls reach a server: one raw connection per thread and process, durable waits, the wake wait.

Each call goes straight to a connection taken from the client's pool (kept per thread and
per process), not through redis-py's command layer: measured, that layer cost about 57 us
of CPU per call against 15 us for sending and reading directly, and the worker makes one or
two calls per batch of tasks. A call is packed by hiredis straight from its arguments (`send`).
`ServerTransport` serves a single server; `cluster.ClusterTransport`
sends each call to the primary owning its keys' slot. The script wrappers (`scripts.RedisScripts`)
hold one and never touch a connection themselves.
"""

from __future__ import annotations

import os
import select
import threading
from collections.abc import Sequence
from typing import Any

import redis
from redis.connection import HiredisRespSerializer

from .errors import durable_enqueue_error, is_failover_refusal
from .script_source import LuaScript

try:
    from hiredis import pack_command
except ImportError:  # without hiredis, redis-py packs in Python and `send` never calls this
    pack_command = None  # type: ignore[assignment]


def reusable(connection: redis.Connection) -> redis.Connection:
    """Return a kept connection fit to send on, connected: one the server closed (a restart, CLIENT KILL) is made anew.

    The check redis-py's pool makes when it hands out a connection, which ours (kept per
    thread) never pass through. An idle request/response connection whose socket polls
    readable holds the server's FIN or RST, or a reply nobody read: nothing to keep, and it
    is connected anew. A poll, no round trip: measured 0.4 us a call, against
    1.5 us for redis-py's `connect()` and `can_read()` and 15 us for the call itself.
    """
    sock = getattr(connection, "_sock", None)
    if sock is not None and polls_readable(sock):
        connection.disconnect()
        sock = None
    if sock is None:
        # Through the connection's own connect(), not send_command's: a Sentinel-managed
        # connection asks the sentinels for the primary there (send_command would dial its
        # last address, or localhost:6379 the first time).
        connection.connect()
    return connection


def polls_readable(sock: Any) -> bool:
    """Whether a socket (anything with `fileno()`) has something to read now, its peer's close included."""
    poller = select.poll()
    poller.register(sock, select.POLLIN)  # POLLHUP and POLLERR are reported whatever the mask
    return bool(poller.poll(0))


def dropped_on_failover(connection: redis.Connection, error: redis.ResponseError) -> bool:
    """Drop `connection` if `error` is a failover's refusal (READONLY and kin, `errors.is_failover_refusal`); say whether.

    Only on that error, so the default path pays nothing: the next call connects anew, and
    through Sentinel asks for the primary again.
    """
    if not is_failover_refusal(error):
        return False
    connection.disconnect()
    return True


def send(connection: redis.Connection, command: Sequence[Any]) -> None:
    """Send `command` (its name, then its arguments) on `connection`, packed by hiredis when the connection would be.

    redis-py's hiredis packer copies the arguments into a new tuple first, checking each for a
    buffer type these calls never send: measured half of its time on an acknowledgement of 256
    tasks (2,300 arguments). An argument hiredis cannot pack goes the usual way, which says why.
    """
    if type(getattr(connection, "_command_packer", None)) is HiredisRespSerializer:
        try:
            packed = pack_command(tuple(command))  # no copy of a tuple
        except TypeError:
            pass
        else:
            connection.send_packed_command([packed])
            return
    connection.send_command(*command)


def _evalsha(connection: redis.Connection, script: LuaScript, keys: Sequence[str], args: Sequence[Any]) -> Any:
    """Send EVALSHA of `script` on `connection` and return its reply; on NOSCRIPT load it first."""
    try:
        send(connection, ("EVALSHA", script.sha, len(keys), *keys, *args))
        return connection.read_response()
    except redis.exceptions.NoScriptError:
        connection.send_command("SCRIPT", "LOAD", script.source)
        connection.read_response()
        send(connection, ("EVALSHA", script.sha, len(keys), *keys, *args))
        return connection.read_response()


class ServerTransport:
    """Script calls to one server, over this thread's own connection (made anew in a forked child)."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self._local = threading.local()

    def connection(self):
        """Return this thread's connection, made on first use in this process."""
        local = self._local
        if getattr(local, "pid", None) != os.getpid():
            local.connection = self.client.connection_pool.make_connection()
            local.pid = os.getpid()
            local.aof_checked = False
        return local.connection

    def connection_for(self, key: str):
        """Return this thread's connection that a script over `key` runs on (a follow-up such as WAIT goes there too)."""
        return self.connection()

    def server_name(self, key: str) -> str:
        """Name the server `key` lives on: calls that share it fail together."""
        return ""

    def run(self, script: LuaScript, keys: Sequence[str], args: Sequence[Any]) -> Any:
        """Run `script` by its SHA (loading it first where the server lacks it) and return its reply."""
        connection = self.connection()
        try:
            return _evalsha(reusable(connection), script, keys, args)
        except (redis.ConnectionError, redis.TimeoutError):
            connection.disconnect()
            raise
        except redis.ResponseError as e:
            dropped_on_failover(connection, e)
            raise

    def run_durably(self, script: LuaScript, keys: Sequence[str], args: Sequence[Any], wait_s: float) -> tuple:
        """Run a script, then WAITAOF for its writes on the same connection; return both replies.

        WAITAOF waits for the writes of its own connection, hence the same one. It is a second
        round trip, not pipelined with the script: pipelined, the server blocks WAITAOF before
        the write reaches the file and wakes it only at its next cron tick (measured 108 ms an
        enqueue at appendfsync everysec, against 0.1 ms for two round trips).
        """
        connection = self.connection()
        wait_ms = max(1, round(wait_s * 1000))
        if not self._local.aof_checked:
            # Once per connection, before its first durable write, so a server without an
            # append-only file refuses before any task is stored. WAITAOF on a connection that
            # has written nothing returns at once; unlike CONFIG GET it is never disabled.
            self.wait_for_append_only_file(reusable(connection), wait_ms)
            self._local.aof_checked = True
        reply = self.run(script, keys, args)
        return reply, self.wait_for_append_only_file(connection, wait_ms)

    @staticmethod
    def wait_for_append_only_file(connection, wait_ms: int) -> list:
        """WAITAOF on `connection` for its writes to reach the local append-only file; return the reply."""
        try:
            connection.send_command("WAITAOF", 1, 0, wait_ms)
            return connection.read_response()
        except redis.ResponseError as e:
            if dropped_on_failover(connection, e):
                raise
            raise durable_enqueue_error(e) from e
        except (redis.ConnectionError, redis.TimeoutError):
            connection.disconnect()
            raise

    def wait_for_wake(self, wake_keys: Sequence[str], timeout_s: float, socket_timeout_s: float) -> str | None:
        """Block until a token arrives on one of `wake_keys` (BLPOP) or `timeout_s` passes; return its key or None."""
        connection = self.connection()
        try:
            reusable(connection)
            connection.send_command("BLPOP", *wake_keys, timeout_s)
            reply = connection.read_response(timeout=timeout_s + socket_timeout_s)
            return None if reply is None else reply[0].decode()
        except (redis.ConnectionError, redis.TimeoutError):
            connection.disconnect()
            raise
        except redis.ResponseError as e:
            dropped_on_failover(connection, e)
            raise
