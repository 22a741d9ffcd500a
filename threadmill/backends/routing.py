"""Routing a backend's calls over the partitions of its alias (`OPTIONS["partitions"]`).

`PartitionRouting` is mixed into `RedisTaskBackend`. With one partition (the default)
every call goes to partition 0, the alias's own keys, exactly as before partitions
existed. With P > 1:

- enqueue takes the partitions in turn (one per call; `enqueue_many` one per script call);
- a task's other calls go to the partition its id names (`partitions.partition_of`);
- acquire asks the covered partitions in turn and stops at the first with tasks; one that
  came back short is asked last until its wake list says tasks arrived there or
  `poll_max_interval` passed (`EmptyHints`), so a trickle or a backlog costs one round trip a
  fetch, and the empty ones are all visited only when the whole alias is empty;
- the covered partitions are every partition below the highest count any process has used
  (`partitions_seen`), so lowering P leaves the upper partitions drained, not stranded.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from . import layout
from .errors import translate_errors
from .keys import KeySchema
from .partitions import partition_of

if TYPE_CHECKING:
    import redis
    from redis.cluster import RedisCluster

    from .options import BackendOptions
    from .scripts import RedisScripts

#: Seconds between two reads of the alias's highest partition count by a running process.
SEEN_REFRESH_S = 10.0


class EmptyHints:
    """When each partition last came back short from an acquire, so the next ones look elsewhere first."""

    def __init__(self, forget_after_s: float) -> None:
        self.forget_after_s = forget_after_s
        self._short_at: dict[int, float] = {}
        self._turn = 0

    def came_back(self, partition: int, *, full: bool) -> None:
        if full:
            self._short_at.pop(partition, None)
        else:
            self._short_at[partition] = time.monotonic()

    def woken(self, partition: int) -> None:
        """A wake token arrived for the partition: tasks became ready there."""
        self._short_at.pop(partition, None)

    def order(self, count: int) -> list[int]:
        """Return the partitions in the order to ask them: in turn those not short lately, then the rest.

        The rest come longest-short first. An acquire stops at the first that has tasks, so an
        empty partition costs a round trip only when every partition before it was empty too.
        """
        start = self._turn % count
        self._turn += 1
        now = time.monotonic()
        fresh, short = [], []
        for step in range(count):
            partition = (start + step) % count
            short_at = self._short_at.get(partition)
            if short_at is None or now - short_at >= self.forget_after_s:
                fresh.append(partition)
            else:
                short.append(partition)
        short.sort(key=self._short_at.__getitem__)
        return fresh + short


class WakeWaiter(threading.Thread):
    """A daemon thread that blocks on one partition's wake lists when asked (a cluster's BLPOP spans one slot)."""

    def __init__(self, scripts: RedisScripts, partition: int, replies: queue.SimpleQueue) -> None:
        super().__init__(name=f"threadmill-wake-{partition}", daemon=True)
        self.scripts, self.partition, self.replies = scripts, partition, replies
        self._asked: queue.SimpleQueue = queue.SimpleQueue()
        self.busy = False

    def ask(self, keys: Sequence[str], timeout_s: float, socket_timeout_s: float) -> None:
        self.busy = True
        self._asked.put((list(keys), timeout_s, socket_timeout_s))

    def run(self) -> None:
        while True:
            keys, timeout_s, socket_timeout_s = self._asked.get()
            try:
                outcome: object = self.scripts.wait_for_wake(keys, timeout_s, socket_timeout_s)
            except Exception as e:  # noqa: BLE001 - handed to the waiting caller, who raises it
                outcome = e
            self.busy = False
            self.replies.put((self.partition, outcome))


class PartitionRouting:
    """Hands out each partition's keys and scripts, and picks the partition of each call."""

    alias: str
    config: BackendOptions
    keys: KeySchema
    cluster: bool

    if TYPE_CHECKING:
        # A property of the backend: the cluster client with CLUSTER.
        @property
        def client(self) -> redis.Redis | RedisCluster: ...

        @property
        def scripts(self) -> RedisScripts: ...

    def _init_routing(self) -> None:
        self._partition_keys: dict[int, KeySchema] = {0: self.keys}
        self._scripts_by_partition: dict[int, RedisScripts] = {}
        self._partitions_seen = 1
        self._seen_read_at: float | None = None
        self._enqueue_turn = 0
        self.empty_hints = EmptyHints(self.config.poll_max_interval)
        self._waiters: dict[int, WakeWaiter] = {}
        self._wake_replies: queue.SimpleQueue = queue.SimpleQueue()

    @property
    def partition_count(self) -> int:
        """The `partitions` option: how many partitions new tasks are spread over."""
        return self.config.partitions

    def keys_for(self, partition: int) -> KeySchema:
        """Return the key schema of one partition of the alias (0: the alias's own keys)."""
        keys = self._partition_keys.get(partition)
        if keys is None:
            keys = self._partition_keys[partition] = KeySchema(self.alias, partition)
        return keys

    def scripts_for(self, partition: int) -> RedisScripts:
        """Return the scripts over one partition's keys (sharing this thread's connections)."""
        if partition == 0:
            return self.scripts
        scripts = self._scripts_by_partition.get(partition)
        if scripts is None:
            scripts = self._scripts_by_partition[partition] = self.scripts.for_partition(self.keys_for(partition))
        return scripts

    def task_keys(self, task_id: str) -> KeySchema:
        """Return the key schema of the partition a task's id names."""
        return self.keys_for(partition_of(task_id))

    def task_scripts(self, task_id: str) -> RedisScripts:
        """Return the scripts over the partition a task's id names."""
        return self.scripts_for(partition_of(task_id))

    def covered_partitions(self, *, fresh: bool = False) -> range:
        """Every partition that may hold tasks: below the highest `partitions` any process used on the alias.

        Read from the server at most every SEEN_REFRESH_S, so a process notices another that raised it;
        `fresh` reads it now (a pause or resume must reach partitions a process added a moment ago).
        """
        now = time.monotonic()
        if fresh or self._seen_read_at is None or now - self._seen_read_at >= SEEN_REFRESH_S:
            self._seen_read_at = now
            self._partitions_seen = translate_errors(layout.record_partitions)(
                self.client, self.keys.partitions_seen(), 1
            )
        return self.known_partitions()

    def known_partitions(self) -> range:
        """Return `covered_partitions` as last read, without reading (for a caller that goes on without partition 0)."""
        return range(max(self.partition_count, self._partitions_seen))

    def record_partitions(self) -> int:
        """Raise the alias's highest partition count to this process's `partitions`; return it.

        New partitions get the paused queues and runtime limits of partition 0, so they hold there too.
        """
        seen = translate_errors(layout.record_partitions)(
            self.client, self.keys.partitions_seen(), self.partition_count
        )
        self._partitions_seen, self._seen_read_at = seen, time.monotonic()
        if seen > 1:
            self._copy_paused(range(1, seen))
        return seen

    @translate_errors
    def _copy_paused(self, partitions: range) -> None:
        """Copy partition 0's paused queues and runtime limits into `partitions`, keeping what they have."""
        paused = self.client.hgetall(self.keys.paused())
        limits = self.client.hgetall(self.keys.limits())
        if paused or limits:
            for partition in partitions:
                self.scripts_for(partition).copy_paused(paused, limits)

    def next_enqueue_partition(self) -> int | None:
        """Return the partition the next enqueue call writes to, in turn; None with one partition (UUIDv7 ids)."""
        count = self.partition_count
        if count == 1:
            return None
        self._enqueue_turn += 1
        return self._enqueue_turn % count

    def wait_on_partitions(self, queue_names: Sequence[str], worker: str, timeout_s: float) -> bool:
        """Block until a wake token arrives on any covered partition (or for `worker`); True when one came.

        One BLPOP over every partition's wake lists on a single server; on a cluster, where a
        BLPOP spans one slot, one waiting thread per partition, the first reply wins (the others
        keep waiting and are asked nothing new until they answer).
        """
        partitions = self.covered_partitions()
        socket_timeout = self.config.socket_timeout
        worker_key = self.keys.worker_wake(worker)
        if not self.cluster or len(partitions) == 1:
            by_key = {worker_key: 0}
            for partition in partitions:
                keys = self.keys_for(partition)
                by_key.update({keys.wake(q): partition for q in queue_names})
            woke = self.scripts.wait_for_wake([*by_key][1:] + [worker_key], timeout_s, socket_timeout)
            if woke is not None:
                self.empty_hints.woken(by_key.get(woke, 0))
            return woke is not None
        for partition in partitions:
            waiter = self._waiters.get(partition)
            if waiter is None:
                waiter = self._waiters[partition] = WakeWaiter(
                    self.scripts_for(partition), partition, self._wake_replies
                )
                waiter.start()
            if not waiter.busy:
                wake_keys = [self.keys_for(partition).wake(q) for q in queue_names]
                waiter.ask(wake_keys + [worker_key] if partition == 0 else wake_keys, timeout_s, socket_timeout)
        woken = False
        try:
            reply = self._wake_replies.get(timeout=timeout_s + socket_timeout)
        except queue.Empty:
            return False
        while True:
            partition, outcome = reply
            if isinstance(outcome, Exception):
                raise outcome
            if outcome is not None:
                woken = True
                self.empty_hints.woken(partition)
            try:
                reply = self._wake_replies.get_nowait()
            except queue.Empty:
                return woken
