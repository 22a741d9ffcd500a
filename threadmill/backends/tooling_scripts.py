"""The wrappers of the scripts only the tooling API calls (the console and the operator commands).

`RedisScripts` inherits them, so every wrapper is still called as `scripts.<verb>(...)`; they
live apart from the task path's (enqueue, acquire, acknowledge, the broker's) so that a reader
of the hot path sees only what it runs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..base import Segment
from .errors import translate_errors
from .keys import QUARTER_MINUTES, THROUGHPUT_COUNTER_TTL_S, THROUGHPUT_SERIES
from .maintenance_scripts import encode_heartbeats
from .options import DEFAULT_RESULT_TTL_S
from .script_source import LuaScript, ScriptHost


class ToolingScripts(ScriptHost):
    """Peek, purge, delete, bulk requeue, lease reads, cancel, pause, resume, limits, worker commands, schedule pauses and chart summaries: one wrapper a script."""

    _purge: LuaScript
    _delete: LuaScript
    _peek: LuaScript
    _peek_after: LuaScript
    _peek_matching: LuaScript
    _requeue_many: LuaScript
    _live_leases: LuaScript
    _scan: LuaScript
    _cancel: LuaScript
    _pause: LuaScript
    _resume: LuaScript
    _limit: LuaScript
    _limit_state: LuaScript
    _send_control: LuaScript
    _pause_schedule: LuaScript
    _summarise_quarters: LuaScript

    @translate_errors
    def purge(
        self, queue_name: str, segment: Segment, batch_size: int, result_ttl: float = DEFAULT_RESULT_TTL_S
    ) -> int:
        """Delete up to `batch_size` tasks of a segment, settling workflow tasks; return how many left it (0: empty)."""
        k = self.keys
        return self._run(
            self._purge,
            keys=[k.segment(queue_name, segment), k.task_prefix(), k.result_prefix()],
            args=[batch_size, segment.value, int(result_ttl)],
        )

    @translate_errors
    def delete(
        self, queue_name: str, segment: Segment, task_ids: Sequence[str], result_ttl: float = DEFAULT_RESULT_TTL_S
    ) -> tuple[list[str], bool]:
        """Delete those of the given tasks still in one segment of a queue; return (the ids deleted, cut short).

        Cut short: settling a deleted workflow task's children ran out of one call's budget.
        """
        k = self.keys
        cut_short, *deleted = self._run(
            self._delete,
            keys=[k.task_prefix(), k.result_prefix(), k.segment(queue_name, segment)],
            args=[queue_name, segment.value, int(result_ttl), *task_ids],
        )
        return [task_id.decode() for task_id in deleted], bool(cut_short)

    @translate_errors
    def peek(self, queue_name: str, segment: Segment, offset: int, count: int, newest_first: bool) -> list:
        k = self.keys
        return self._run(
            self._peek,
            keys=[k.segment(queue_name, segment), k.task_prefix(), k.result_prefix()],
            args=[offset, count, "1" if newest_first else "0"],
        )

    @translate_errors
    def peek_after(
        self, queue_name: str, segment: Segment, cursor: tuple[str, str] | None, count: int, newest_first: bool
    ) -> list:
        """Return the segment's total and the rows of its first `count` entries past `cursor` (None: the head)."""
        k = self.keys
        score, task_id = cursor or ("", "")
        return self._run(
            self._peek_after,
            keys=[k.segment(queue_name, segment), k.task_prefix(), k.result_prefix()],
            args=[score, task_id, count, "1" if newest_first else "0"],
        )

    @translate_errors
    def peek_matching(
        self,
        queue_name: str,
        segment: Segment,
        offset: int,
        count: int,
        newest_first: bool,
        scan_limit: int,
        needles: Sequence[str],
    ) -> list:
        k = self.keys
        return self._run(
            self._peek_matching,
            keys=[k.segment(queue_name, segment), k.task_prefix(), k.result_prefix()],
            args=[offset, count, "1" if newest_first else "0", scan_limit, *needles],
        )

    @translate_errors
    def requeue_many(
        self,
        queue_name: str,
        segment: Segment,
        entries: Sequence[tuple[str, str, str]],
        needles: Sequence[str],
        force: bool,
        worker_timeout: float,
        heartbeats: Mapping[str, float] | None = None,
        settle_s: float | None = None,
    ) -> tuple[list[str], list[str]]:
        """Requeue (task id, lease token, document) entries of one segment to ready; return (moved, refused).

        `heartbeats` None reads heartbeats from the workers set (partition 0), and with `settle_s`
        counts none as silent until the server has been up that long; a mapping gives every
        worker's heartbeat age, read from partition 0 (another partition's slot lacks the set).
        """
        k = self.keys
        given = encode_heartbeats(heartbeats, settle_s)
        args: list[Any] = [segment.value, "1" if force else "0", worker_timeout, given, len(needles), *needles]
        for entry in entries:
            args += entry
        reply = self._run(
            self._requeue_many,
            keys=[
                k.task_prefix(),
                k.result_prefix(),
                k.segment(queue_name, Segment.READY),
                k.segment(queue_name, segment),
                k.workers(),
                k.wake(queue_name),
            ],
            args=args,
        )
        ids = [task_id.decode() for task_id in reply[1:]]
        return ids[: reply[0]], ids[reply[0] :]

    @translate_errors
    def live_leases(
        self,
        queue_name: str,
        task_ids: Sequence[str],
        worker_timeout: float,
        heartbeats: Mapping[str, float] | None = None,
        settle_s: float | None = None,
    ) -> list[str]:
        """Return those of the ids running under a live lease (deadline ahead, worker not silent); see requeue_many."""
        k = self.keys
        reply = self._run(
            self._live_leases,
            keys=[k.segment(queue_name, Segment.RUNNING), k.task_prefix(), k.workers()],
            args=[worker_timeout, encode_heartbeats(heartbeats, settle_s), *task_ids],
        )
        return [task_id.decode() for task_id in reply]

    @translate_errors
    def scan(
        self, queue_name: str, segment: Segment, cursor: tuple[bytes, bytes], count: int, newest_first: bool
    ) -> list[tuple[bytes, bytes]]:
        """Return the next (id, score) entries of a segment after a (score, id) cursor; (b"", b"") starts."""
        reply = self._run(
            self._scan,
            keys=[self.keys.segment(queue_name, segment)],
            args=[cursor[0], cursor[1], count, "1" if newest_first else "0"],
        )
        return [(reply[i], reply[i + 1]) for i in range(0, len(reply), 2)]

    @translate_errors
    def cancel(
        self, task_id: str, queue_name: str, segment: str, document: str, result_ttl: float, request: str, minute: int
    ) -> int:
        """Cancel one task read in `segment`, or ask it to abort if it runs; the reply codes are cancel.lua's."""
        k = self.keys
        read = segment if segment in ("waiting", "ready", "deferred") else "ready"
        keys = [
            k.task(task_id),
            k.segment(queue_name, read),
            k.segment(queue_name, Segment.FAILED),
            k.totals(queue_name),
            k.throughput(queue_name, "egress", minute),
            k.throughput(queue_name, "failed", minute),
        ]
        args = [task_id, segment, document, int(result_ttl), request, THROUGHPUT_COUNTER_TTL_S]
        return self._run(self._cancel, keys=keys, args=args)

    @translate_errors
    def pause(self, queue_name: str, by: str) -> int:
        return self._run(self._pause, keys=[self.keys.paused()], args=[queue_name, by])

    @translate_errors
    def resume(self, queue_name: str) -> int:
        k = self.keys
        return self._run(
            self._resume, keys=[k.paused(), k.segment(queue_name, Segment.READY), k.wake(queue_name)], args=[queue_name]
        )

    @translate_errors
    def send_control(self, workers: Sequence[str], document: str) -> int:
        """Leave the command `document` for each of `workers` (taken on a full server too); return how many were new."""
        return self._run(self._send_control, keys=[self.keys.control()], args=[document, *workers])

    @translate_errors
    def pause_schedule(self, field: str, document: str) -> int:
        """Store a schedule's pause `document` unless one is stored (taken on a full server too); 1 when stored."""
        return self._run(self._pause_schedule, keys=[self.keys.schedules()], args=[field, document])

    @translate_errors
    def limit(self, queue_name: str, given: str | None, by: str) -> bytes | None:
        """Store the `given` parts of a queue's runtime limits ("c|n|period", empty parts kept), or clear them (None)."""
        k = self.keys
        keys = [k.limits(), k.segment(queue_name, Segment.READY), k.wake(queue_name)]
        args = [queue_name, "clear", "", by] if given is None else [queue_name, "set", given, by]
        return self._run(self._limit, keys=keys, args=args)

    @translate_errors
    def limit_state(self, queue_names: Sequence[str], rate_counts: Sequence[int | None], partitions: int) -> list:
        """Read each queue's runtime limits, ready and running counts and the lease time its next rate token waits on.

        `rate_counts` are the settings' rate counts (None: no rate); see limit_state.lua for the reply.
        """
        k = self.keys
        keys = [k.limits()]
        args: list[Any] = [k.partition, partitions]
        for name, count in zip(queue_names, rate_counts, strict=True):
            keys += [k.segment(name, Segment.READY), k.segment(name, Segment.RUNNING), k.lease_times(name)]
            args += [name, "" if count is None else count]
        return self._run(self._limit_state, keys=keys, args=args)

    @translate_errors
    def summarise_quarters(self, queue_name: str, first_minutes: Sequence[int], grace_minutes: int) -> list[bytes]:
        """Sum each quarter-hour of a queue starting at `first_minutes`; store the sums of those closed `grace_minutes` ago.

        Returns one "in,out,failed,latency_ms" summary a quarter, in order (latency empty where none was sampled).
        """
        k = self.keys
        keys: list[str] = []
        for first in first_minutes:
            span = range(first, first + QUARTER_MINUTES)
            keys += [
                k.quarter(queue_name, first),
                *(k.throughput(queue_name, s, m) for s in THROUGHPUT_SERIES for m in span),
            ]
        args = [grace_minutes, THROUGHPUT_COUNTER_TTL_S, *(first + QUARTER_MINUTES for first in first_minutes)]
        return self._run(self._summarise_quarters, keys=keys, args=args)
