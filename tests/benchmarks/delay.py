"""A TCP forwarder that holds every chunk for a fixed time each way, as a process of its own.

`python -m tests.benchmarks.delay TARGET_PORT DELAY_MS` listens on a free port of 127.0.0.1,
prints that port on a line of its own, and forwards every connection to 127.0.0.1:TARGET_PORT
until SIGTERM. Each chunk read from either side is written to the other side DELAY_MS after
it was read, in the order it was read, so a round trip through it takes 2 x DELAY_MS more.

One thread serves every connection with `select()`, whose timeout has microsecond
resolution: epoll, and with it asyncio's default loop, rounds every wait up to a whole
millisecond, which would turn 0.25 ms into 1 ms. The timer slack is set to 1 ns for the
same reason (the kernel's default lets a wait end 50 us late), and each wait ends early by
the median lateness of 200 waits measured at start (about 20 us here), so a chunk leaves
close to its due time rather than a wake-up later. A process of its own keeps the forwarder
off the harness's interpreter lock, and lets the harness read its CPU apart.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import ctypes
import select
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

#: Bytes read from a socket at a time.
CHUNK_BYTES = 65536
#: prctl option that sets the calling thread's timer slack, in nanoseconds (linux/prctl.h).
PR_SET_TIMERSLACK = 29
#: Waits timed at start to learn how late a wait ends on this machine.
CALIBRATION_WAITS = 200
#: Seconds the harness waits for the forwarder to print its port.
START_TIMEOUT_S = 10.0
ROOT = Path(__file__).resolve().parents[2]


class Forwarder:
    """Accept on `listener`, connect each client to `target`, and pass chunks on after `delay_s`."""

    def __init__(self, listener: socket.socket, target: tuple[str, int], delay_s: float, lateness_s: float) -> None:
        self.listener = listener
        self.target = target
        self.delay_s = delay_s
        #: How late a wait ends past its timeout here; each wait is that much shorter.
        self.lateness_s = lateness_s
        #: Each socket's other end.
        self.peer: dict[socket.socket, socket.socket] = {}
        #: (due, destination, data) in the order read; one delay for all keeps it ordered by due time.
        self.pending: collections.deque[tuple[float, socket.socket, bytes]] = collections.deque()

    def serve_forever(self) -> None:
        while True:
            timeout = max(0.0, self.pending[0][0] - self.lateness_s - time.perf_counter()) if self.pending else None
            readable, _, _ = select.select([self.listener, *self.peer], [], [], timeout)
            for sock in readable:
                if sock is self.listener:
                    self.accept()
                elif sock in self.peer:
                    self.read(sock)
            self.send_due()

    def accept(self) -> None:
        client, _ = self.listener.accept()
        try:
            upstream = socket.create_connection(self.target)
        except OSError:
            client.close()
            return
        for sock in (client, upstream):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.peer[client], self.peer[upstream] = upstream, client

    def read(self, sock: socket.socket) -> None:
        try:
            data = sock.recv(CHUNK_BYTES)
        except OSError:
            data = b""
        if data:
            self.pending.append((time.perf_counter() + self.delay_s, self.peer[sock], data))
        else:
            self.close(sock)

    def send_due(self) -> None:
        now = time.perf_counter() + self.lateness_s
        while self.pending and self.pending[0][0] <= now:
            _, destination, data = self.pending.popleft()
            if destination in self.peer:
                try:
                    destination.sendall(data)
                except OSError:
                    self.close(destination)

    def close(self, sock: socket.socket) -> None:
        """Close a connection and its other end (the Redis protocol has no use for a half-close)."""
        other = self.peer.pop(sock, None)
        self.peer.pop(other, None)
        for s in (sock, other):
            if s is not None:
                s.close()


def sharpen_timers() -> None:
    """Let the kernel end this thread's waits on time instead of up to 50 us late."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_TIMERSLACK, 1, 0, 0, 0)


def wait_lateness_s(delay_s: float) -> float:
    """Return the median time a `select()` wait of `delay_s` ends past its timeout (0 for no delay)."""
    if delay_s <= 0:
        return 0.0
    late = []
    for _ in range(CALIBRATION_WAITS):
        before = time.perf_counter()
        select.select([], [], [], delay_s)
        late.append(time.perf_counter() - before - delay_s)
    return max(0.0, statistics.median(late))


class DelayProxy:
    """The forwarder's process, as the harness starts and stops it."""

    def __init__(self, target_port: int, delay_ms: float) -> None:
        self.delay_ms = delay_ms
        command = [sys.executable, "-m", "tests.benchmarks.delay", str(target_port), str(delay_ms)]
        self.process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, text=True, start_new_session=True)
        ready, _, _ = select.select([self.process.stdout], [], [], START_TIMEOUT_S)
        line = self.process.stdout.readline() if ready else ""
        if not line.strip().isdigit():
            self.stop()
            raise RuntimeError(f"The delay proxy did not print its port within {START_TIMEOUT_S:g} s.")
        self.port = int(line)

    @property
    def pid(self) -> int:
        return self.process.pid

    def url(self, db: int = 0) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
        try:
            self.process.wait(5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.benchmarks.delay", description=__doc__)
    parser.add_argument("target_port", type=int)
    parser.add_argument("delay_ms", type=float)
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(0))
    sharpen_timers()
    delay_s = args.delay_ms / 1000
    lateness_s = wait_lateness_s(delay_s)
    listener = socket.create_server(("127.0.0.1", 0))
    print(listener.getsockname()[1], flush=True)
    Forwarder(listener, ("127.0.0.1", args.target_port), delay_s, lateness_s).serve_forever()


if __name__ == "__main__":
    main()
