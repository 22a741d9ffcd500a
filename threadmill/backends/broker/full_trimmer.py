"""The full trimmer: while the server is over its `maxmemory`, drops the oldest successful tasks.

A full server (maxmemory, noeviction) refuses enqueues but takes the workers' writes, and a
finished task holds about twice the memory of its ready one (its result beside its payload):
draining a full server pushed it to about twice its maxmemory. While the server's used memory
is at or over maxmemory, this duty drops the oldest successful tasks of each queue, batch by
batch, reading the memory again after each, until it is under. Each leaves a tombstone (its
id and finish time, about 100 bytes) for `result_ttl`, so `get_result` raises `ResultTrimmed`
instead of saying the task never existed. Failed tasks and unique ones are never dropped.

It reads the memory (one INFO) every `FULL_CHECK_INTERVAL_S` while the server is under half
its maxmemory, and at every broker pass above; it also drops tombstones older than
`result_ttl` then. On a cluster it does nothing: one INFO would not say which node is full.
"""

from __future__ import annotations

import logging
import time

from ..preflight import ServerReport
from .passes import BrokerPass, Duty

logger = logging.getLogger("threadmill.broker")

#: Most successful tasks one trim call drops from a queue, before the memory is read again.
TRIM_FULL_BATCH = 200
#: Seconds between two memory reads while the server is under half its maxmemory (or has none).
FULL_CHECK_INTERVAL_S = 10.0


class FullTrimmer(Duty):
    """Drops the oldest successful tasks, leaving tombstones, while the server is over its maxmemory."""

    name = "full-trimmer"

    def __init__(self, backend) -> None:
        super().__init__(backend)
        #: Whether the last read found the server at half its maxmemory or more (then it reads every pass).
        #: True until the first read: the broker takes a duty's interval before running it, and a
        #: server full at the start would otherwise wait `FULL_CHECK_INTERVAL_S` for its second read.
        self.near_full = True

    def interval(self) -> float:
        broker_interval = self.backend.config.broker_interval
        return broker_interval if self.near_full else max(FULL_CHECK_INTERVAL_S, broker_interval)

    def run_once(self, pass_: BrokerPass) -> int:
        """Drop old tombstones, then trim while the server is full; return how many tasks were dropped."""
        if self.backend.cluster:
            return 0
        report = pass_.attempt(0, self.read_memory)
        if report is None:
            return 0
        for partition in pass_.partitions:
            pass_.attempt(partition, self.drop_old_tombstones, partition)
        dropped = 0
        while report is not None and report.full:
            batch = sum(
                pass_.attempt(partition, self.backend.scripts_for(partition).trim_full, queue_name, TRIM_FULL_BATCH)
                or 0
                for queue_name, partition in pass_.each()
            )
            if not batch:
                break
            dropped += batch
            report = pass_.attempt(0, self.read_memory)
        if dropped:
            logger.warning(
                "Trimmed the results of %d successful tasks: the server is over its maxmemory (%s of %s bytes "
                "used); get_result raises ResultTrimmed for them.",
                dropped,
                None if report is None else report.used_memory,
                None if report is None else report.maxmemory,
            )
        return dropped

    def read_memory(self) -> ServerReport:
        """Read the server's used memory and maxmemory now (one INFO), noting whether it is near full."""
        report = self.backend.preflight(fresh=True)
        used, limit = report.used_memory or 0, report.maxmemory or 0
        self.near_full = bool(limit) and used * 2 >= limit
        return report

    def drop_old_tombstones(self, partition: int) -> int:
        """Drop the partition's tombstones of tasks that finished more than `result_ttl` ago; return how many."""
        cutoff = time.time() - self.backend.config.result_ttl
        return int(self.backend.client.zremrangebyscore(self.backend.keys_for(partition).trimmed(), "-inf", cutoff))
