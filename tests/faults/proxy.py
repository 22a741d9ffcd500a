"""A TCP proxy on 127.0.0.1 in front of one server, whose link a test or the soak breaks at run time.

Faults it makes, each on the connections passing through it:

- `reset()`: every open connection is closed with a TCP reset (RST) on both sides, as a
  restarted router or a dropped NAT entry does; new connections are accepted as usual.
- `stall(seconds)`: a half-open link. Connections, new ones too, are accepted and kept, but
  nothing is forwarded either way until the stall ends; what was sent meanwhile is then
  delivered, as TCP retransmits after a short partition heals. So a command whose client
  gave up on it may still reach the server late.
- `latency(seconds)`: every chunk waits that long before it is forwarded, each way, in order.
- `lose_replies(count)`: the next `count` replies from the server are dropped, each link that
  carried one closed with a reset instead: the command ran, its caller never hears so.
- `normal()`: ends a stall and the added latency.
- `point_at(port)`: new connections go to another server, open ones stay where they are, as a
  DNS name moved to a new primary leaves the connections made before.

The proxy runs an asyncio event loop on a thread of its own; each control returns once the
loop has applied it, so a caller needs no sleep to know it holds.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading
from dataclasses import dataclass, field
from typing import Self

#: Bytes read from a socket at a time.
CHUNK_BYTES = 65536
#: Longest a control waits for the proxy's loop to apply it, seconds.
CONTROL_TIMEOUT_S = 5.0
#: The end of a stream, queued behind its data.
_EOF = b""


@dataclass(eq=False)
class _Link:
    """One client connection and its upstream connection."""

    client: asyncio.StreamWriter
    #: The task serving the link, which the proxy waits for when it stops.
    serving: asyncio.Task | None = None
    upstream: asyncio.StreamWriter | None = None
    tasks: list[asyncio.Task] = field(default_factory=list)

    def writers(self) -> list[asyncio.StreamWriter]:
        return [w for w in (self.client, self.upstream) if w is not None]


def _abort_with_reset(writer: asyncio.StreamWriter) -> None:
    """Close a connection with RST instead of FIN: SO_LINGER on with a zero timeout, then close."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class Proxy:
    """Forward 127.0.0.1:<port> to a target server, with faults switched on and off at run time."""

    def __init__(self, target_port: int, target_host: str = "127.0.0.1", name: str = "proxy") -> None:
        self.target = (target_host, target_port)
        self.name = name
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=f"{name}-loop", daemon=True)
        self._server: asyncio.Server | None = None
        self._links: set[_Link] = set()
        self._flowing: asyncio.Event | None = None
        self._stall_end: asyncio.TimerHandle | None = None
        self._delay_s = 0.0
        self._replies_to_lose = 0

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    # -- life cycle ------------------------------------------------------------------------

    def start(self, port: int = 0) -> Proxy:
        """Listen on `port` (0: a free one) and return self once connections are accepted."""
        self._thread.start()
        self._call(self._listen(port))
        return self

    def stop(self) -> None:
        """Stop listening, reset every connection and end the loop's thread."""
        if not self._thread.is_alive():
            return
        self._call(self._close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(CONTROL_TIMEOUT_S)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- controls, from any thread ------------------------------------------------------------

    def reset(self) -> int:
        """Close every open connection with a TCP reset; return how many connections there were."""
        return self._call(self._reset())

    def stall(self, seconds: float) -> None:
        """Forward nothing for `seconds` (connections are accepted and kept), then deliver what waited."""
        self._call(self._stall(seconds))

    def latency(self, seconds: float) -> None:
        """Delay every chunk by `seconds` before forwarding it, each way; 0 for none."""
        self._call(self._set_delay(seconds))

    def lose_replies(self, count: int = 1) -> None:
        """Drop the next `count` chunks the server sends, resetting the link each came on."""
        self._call(self._set_replies_to_lose(count))

    def normal(self) -> None:
        """End a stall and the added latency."""
        self._call(self._normal())

    def point_at(self, port: int, host: str = "127.0.0.1") -> None:
        """Send the connections made from now on to `host:port`; open ones keep their server."""
        self._call(self._point_at((host, port)))

    def connections(self) -> int:
        """The number of client connections open now."""
        return self._call(self._count())

    # -- the loop's side ------------------------------------------------------------------

    def _call(self, coroutine):
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(CONTROL_TIMEOUT_S)

    async def _listen(self, port: int) -> None:
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _close(self) -> None:
        if self._server is not None:
            self._server.close()
        serving = [link.serving for link in self._links if link.serving is not None]
        await self._reset()
        for task in serving:
            task.cancel()
        await asyncio.gather(*serving, return_exceptions=True)

    async def _reset(self) -> int:
        links = list(self._links)
        for link in links:
            for writer in link.writers():
                _abort_with_reset(writer)
            for task in link.tasks:
                task.cancel()
        self._links.clear()
        return len(links)

    async def _stall(self, seconds: float) -> None:
        if self._stall_end is not None:
            self._stall_end.cancel()
        self._flowing.clear()
        self._stall_end = self._loop.call_later(seconds, self._flowing.set)

    async def _set_delay(self, seconds: float) -> None:
        self._delay_s = max(0.0, seconds)

    async def _set_replies_to_lose(self, count: int) -> None:
        self._replies_to_lose = count

    async def _point_at(self, target: tuple[str, int]) -> None:
        self.target = target

    async def _normal(self) -> None:
        self._replies_to_lose = 0
        if self._stall_end is not None:
            self._stall_end.cancel()
            self._stall_end = None
        self._flowing.set()
        self._delay_s = 0.0

    async def _count(self) -> int:
        return len(self._links)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        link = _Link(writer, asyncio.current_task())
        self._links.add(link)
        try:
            # A half-open link: the connection is accepted and held, nothing goes upstream yet.
            await self._flowing.wait()
            try:
                up_reader, link.upstream = await asyncio.open_connection(*self.target)
            except OSError:
                _abort_with_reset(writer)  # As close to "connection refused" as an accepted socket gets.
                return
            if link not in self._links:  # Reset while connecting.
                _abort_with_reset(link.upstream)
                return
            link.tasks = [
                self._loop.create_task(self._pump(reader, link.upstream, link)),
                self._loop.create_task(self._pump(up_reader, writer, link)),
            ]
            await asyncio.gather(*link.tasks, return_exceptions=True)
        finally:
            self._links.discard(link)
            for w in link.writers():
                w.close()

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, link: _Link) -> None:
        """Copy one direction: a reader that queues each chunk with its due time, a sender that waits for it."""
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()
        sender = self._loop.create_task(self._send(queue, writer))
        try:
            while True:
                try:
                    data = await reader.read(CHUNK_BYTES)
                except OSError:
                    data = _EOF
                if data and writer is link.client and self._replies_to_lose:
                    self._replies_to_lose -= 1
                    for w in link.writers():
                        _abort_with_reset(w)
                    break
                queue.put_nowait((self._loop.time() + self._delay_s, data))
                if data == _EOF:
                    break
            await sender
        finally:
            sender.cancel()
            # One side is done: close the pair (the Redis protocol has no use for a half-close).
            for w in link.writers():
                w.close()

    async def _send(self, queue: asyncio.Queue, writer: asyncio.StreamWriter) -> None:
        while True:
            due, data = await queue.get()
            wait = due - self._loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            await self._flowing.wait()
            if data == _EOF:
                return
            writer.write(data)
            try:
                await writer.drain()
            except OSError:
                return
