"""A TCP proxy in front of a real server that rewrites its INFO replies: how a test meets an older server's version.

Everything else passes through unchanged. Server replies are cut at RESP2/RESP3 reply boundaries
so INFO's text is rewritten whole, its length fixed.
"""

from __future__ import annotations

import contextlib
import re
import socket
import threading
from collections.abc import Callable

from threadmill.embedded import free_port


def reply_end(buffer: bytes, start: int = 0) -> int | None:
    """Return where the RESP2 or RESP3 reply starting at `start` ends, or None while it is incomplete."""
    line_end = buffer.find(b"\r\n", start)
    if line_end < 0:
        return None
    kind, after = buffer[start : start + 1], line_end + 2
    if kind in b"+-:_,#(":
        return after
    count = int(buffer[start + 1 : line_end])
    if kind in b"$=!":
        end = after if count < 0 else after + count + 2
        return end if len(buffer) >= end else None
    if kind not in b"*~>%|":
        raise ValueError(f"not a RESP reply: {buffer[start : start + 20]!r}")
    # A map or attribute holds count pairs; an attribute is followed by the reply it describes.
    elements = max(count, 0) * (2 if kind in b"%|" else 1) + (1 if kind == b"|" else 0)
    for _ in range(elements):
        found = reply_end(buffer, after)
        if found is None:
            return None
        after = found
    return after


def version_rewrite(redis_version: str, valkey_version: str | None = None) -> Callable[[bytes], bytes]:
    """Return a rewrite making INFO report `redis_version` (and Valkey's `valkey_version`, or none: plain Redis)."""

    def rewrite(info: bytes) -> bytes:
        info = re.sub(rb"redis_version:[^\r]*", b"redis_version:" + redis_version.encode(), info)
        if valkey_version is None:
            info = re.sub(rb"valkey_version:[^\r]*\r\n", b"", info)
            return re.sub(rb"server_name:[^\r]*", b"server_name:redis", info)
        return re.sub(rb"valkey_version:[^\r]*", b"valkey_version:" + valkey_version.encode(), info)

    return rewrite


class InfoRewritingProxy:
    """Listens on a free port of 127.0.0.1 and forwards to `upstream_port`, rewriting each INFO reply with `rewrite`."""

    def __init__(self, upstream_port: int, rewrite: Callable[[bytes], bytes]) -> None:
        self.upstream_port = upstream_port
        self.rewrite = rewrite
        self.port = free_port()
        self._listener = socket.create_server(("127.0.0.1", self.port))
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                client, _ = self._listener.accept()
                upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
                self._sockets += [client, upstream]
                threading.Thread(target=self._pass, args=(client, upstream), daemon=True).start()
                threading.Thread(target=self._replies, args=(upstream, client), daemon=True).start()

    def _pass(self, source: socket.socket, target: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                target.sendall(data)
        with contextlib.suppress(OSError):
            target.shutdown(socket.SHUT_WR)

    def _replies(self, upstream: socket.socket, client: socket.socket) -> None:
        buffer = b""
        with contextlib.suppress(OSError):
            while data := upstream.recv(65536):
                buffer += data
                while buffer and (end := reply_end(buffer)) is not None:
                    reply, buffer = buffer[:end], buffer[end:]
                    client.sendall(self._rewritten(reply))
        with contextlib.suppress(OSError):
            client.shutdown(socket.SHUT_WR)

    def _rewritten(self, reply: bytes) -> bytes:
        # INFO's text: a bulk string in RESP2, a verbatim string ("txt:" first) in RESP3.
        if reply[:1] not in b"$=" or b"redis_version:" not in reply:
            return reply
        body = self.rewrite(reply[reply.index(b"\r\n") + 2 : -2])
        return b"%s%d\r\n%s\r\n" % (reply[:1], len(body), body)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def close(self) -> None:
        self._listener.close()
        for sock in self._sockets:
            with contextlib.suppress(OSError):
                sock.close()
