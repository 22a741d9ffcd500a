"""The wrappers of the scripts the broker's duties call: promote, claim expired and abandoned leases, trim, sample.

`RedisScripts` inherits them, so every wrapper is still called as `scripts.<verb>(...)`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..base import Segment
from .errors import translate_errors
from .keys import PRIORITY_BAND, THROUGHPUT_COUNTER_TTL_S
from .script_source import LuaScript, ScriptHost


def encode_heartbeats(ages: Mapping[str, float] | None, settle_s: float | None = None) -> str:
    """Encode heartbeat ages for a script: "" to read the workers set itself, else "+" and `name<TAB>age` lines.

    With `settle_s` a script that reads the set itself ("@" and the seconds) counts no worker with a
    heartbeat as silent until its server has been up that long.
    """
    if ages is None:
        return "" if settle_s is None else f"@{settle_s:.3f}"
    return "+" + "".join(f"{name}\t{age:.3f}\n" for name, age in ages.items())


class MaintenanceScripts(ScriptHost):
    """The mover's, reaper's, recovery's, trimmer's, control's, stop wake's and latency sampler's scripts: one wrapper a script."""

    _promote: LuaScript
    _claim_expired: LuaScript
    _trim_finished: LuaScript
    _claim_abandoned: LuaScript
    _take_control: LuaScript
    _wake_worker: LuaScript
    _trim_full: LuaScript
    _copy_paused: LuaScript
    _sample_latency: LuaScript

    @translate_errors
    def promote(self, queue_name: str, batch_size: int) -> tuple[int, float | None]:
        """Promote due deferred tasks; return (how many, seconds until the next is due or None)."""
        k = self.keys
        moved, wait = self._run(
            self._promote,
            keys=[
                k.segment(queue_name, Segment.DEFERRED),
                k.segment(queue_name, Segment.READY),
                k.task_prefix(),
                k.wake(queue_name),
            ],
            args=[batch_size],
        )
        wait = float(wait)
        return int(moved), None if wait < 0 else wait

    @translate_errors
    def claim_expired(self, queue_name: str, batch_size: int, claim_window_s: float, token_base: str) -> list:
        k = self.keys
        return self._run(
            self._claim_expired,
            keys=[k.segment(queue_name, Segment.RUNNING), k.task_prefix()],
            args=[batch_size, claim_window_s, token_base],
        )

    @translate_errors
    def trim_finished(self, queue_name: str, result_ttl: float, limit: int) -> int:
        """Drop up to `limit` ids from each finished segment of a queue finished over `result_ttl` ago."""
        k = self.keys
        return self._run(
            self._trim_finished,
            keys=[k.segment(queue_name, Segment.SUCCESSFUL), k.segment(queue_name, Segment.FAILED)],
            args=[result_ttl, limit],
        )

    @translate_errors
    def claim_abandoned(
        self,
        queue_name: str,
        worker_timeout_s: float,
        forget_after_s: float,
        batch_size: int,
        scan_limit: int,
        claim_window_s: float,
        token_base: str,
        heartbeats: Mapping[str, float] | None = None,
        lease_ttl_s: float | None = None,
    ) -> list:
        """Claim the leases of dead workers; return the claimed rows.

        `heartbeats` (every worker's heartbeat age) is given for partitions above 0, whose slot
        lacks the workers set. With `lease_ttl_s`, a lease whose worker never sent a heartbeat is
        a dead worker's once it is `worker_timeout_s` old.
        """
        k = self.keys
        args: list[Any] = [worker_timeout_s, forget_after_s, batch_size, scan_limit, claim_window_s, token_base]
        args += [encode_heartbeats(heartbeats), "" if lease_ttl_s is None else lease_ttl_s]
        return self._run(
            self._claim_abandoned,
            keys=[k.workers(), k.segment(queue_name, Segment.RUNNING), k.task_prefix()],
            args=args,
        )

    @translate_errors
    def take_control(self, workers: Sequence[str]) -> list:
        return self._run(self._take_control, keys=[self.keys.control()], args=list(workers))

    @translate_errors
    def trim_full(self, queue_name: str, count: int) -> int:
        """Drop up to `count` of the queue's oldest successful tasks, each leaving a tombstone; return how many."""
        k = self.keys
        keys = [k.segment(queue_name, Segment.SUCCESSFUL), k.trimmed(), k.task_prefix(), k.result_prefix()]
        return self._run(self._trim_full, keys=keys, args=[count])

    @translate_errors
    def copy_paused(self, paused: Mapping[bytes, bytes], limits: Mapping[bytes, bytes]) -> int:
        """Copy partition 0's paused queues and runtime limits into this partition, keeping its own; return how many."""
        args: list[bytes | int] = [len(paused)]
        for field, value in (*paused.items(), *limits.items()):
            args += [field, value]
        return self._run(self._copy_paused, keys=[self.keys.paused(), self.keys.limits()], args=args)

    @translate_errors
    def wake_worker(self, worker: str, token_ttl_s: int) -> int:
        """Push one wake token onto `worker`'s own wake list (taken on a full server too); return its length."""
        return self._run(self._wake_worker, keys=[self.keys.worker_wake(worker)], args=[token_ttl_s])

    @translate_errors
    def sample_latency(self, queue_name: str) -> int:
        k = self.keys
        return self._run(
            self._sample_latency,
            keys=[k.segment(queue_name, Segment.READY), k.throughput_prefix(queue_name, "latency")],
            args=[THROUGHPUT_COUNTER_TTL_S, PRIORITY_BAND],
        )
