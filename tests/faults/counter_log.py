"""The order in which the counter server saw every start and finish `count_run` counted (its MONITOR stream).

`count_run` counts each start and finish with an HINCRBY on the counter server and records no
time: every release's tree has it, so a rolling-deploy test can run the previous release's
pool on the same tasks. The counter server's MONITOR stream gives those commands in the order
it ran them, one clock for every process of either release: enough to say a join started
after each of its parents finished.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Self

import redis

#: The command that ends the log (an ECHO of this text, which MONITOR shows like any other).
STOP = "faults:counter-log-stop"


@dataclass(frozen=True)
class Count:
    """One start or finish counted, at its place `at` in the counter server's order and its clock's `time`."""

    at: int
    time: float
    kind: str
    task_id: str


class CounterLog:
    """Reads the counter server's MONITOR stream from the moment it is made until `stop` (or the end of its `with`)."""

    def __init__(self, counter: redis.Redis) -> None:
        self.counter = counter
        # A client of its own with no read timeout: the stream is quiet while tasks wait (a sweep
        # is 5 s apart), and a client from a URL here gives up on a read after 5 s.
        where = counter.connection_pool.connection_kwargs
        self.client = redis.Redis(host=where["host"], port=where["port"], socket_timeout=None)
        self.monitor = self.client.monitor()
        self.monitor.__enter__()  # MONITOR is on once this returns: nothing counted later is missed
        self.counts: list[Count] = []
        self.error: redis.RedisError | None = None
        self.thread = threading.Thread(target=self._read, name="counter-log", daemon=True)
        self.thread.start()

    def _read(self) -> None:
        try:
            self._read_until_stopped()
        except redis.RedisError as e:
            self.error = e

    def _read_until_stopped(self) -> None:
        while True:
            command = self.monitor.next_command()
            words = command["command"].split()
            if STOP in words:
                return
            if len(words) == 4 and words[0].upper() == "HINCRBY" and words[1] in ("faults:started", "faults:finished"):
                kind = words[1].removeprefix("faults:")
                self.counts.append(Count(len(self.counts), command["time"], kind, words[2]))

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def stop(self) -> list[Count]:
        """End the log (once) and return every start and finish counted, in the counter server's order."""
        if self.thread.is_alive():
            self.counter.echo(STOP)
            self.thread.join(10)
            assert not self.thread.is_alive(), "the counter server's MONITOR stream did not end"
            self.monitor.__exit__()
            self.client.close()
        assert self.error is None, f"the counter server's MONITOR stream broke off: {self.error!r}"
        return self.counts
