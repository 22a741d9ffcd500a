"""The backend's half of `threadmill.api.controls`: paused queues, runtime limits, and commands waiting for worker supervisors.

A pause and a runtime limit are copied into every partition (acquire reads them in its own
slot; a limit is the whole queue's value in each, acquire takes the partition's share of it,
`limits.share`); a worker command waits in one hash until its worker's supervisor takes it,
in one script.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from ...base import PausedQueue
from ...limits import NO_LIMIT, LimitError, QueueLimit, Rate, check_partitions, decode, encode, next_token_s, overlay
from ..errors import translate_errors
from .host import ToolingHost

#: What an operator can ask of a worker process: stop fetching but stay alive, or stop.
WORKER_COMMANDS = ("quiet", "stop")


@dataclass(frozen=True, slots=True)
class LimitState:
    """A queue's limits (the setting's, the runtime's, the ones in force) and what they hold back now.

    `next_token_s` is None while the rate has a token left in some partition (or there is no rate).
    """

    setting: QueueLimit
    runtime: QueueLimit
    set_by: str | None
    set_since: datetime | None
    ready: int
    running: int
    next_token_s: float | None

    @property
    def limit(self) -> QueueLimit:
        return overlay(self.setting, self.runtime)

    @property
    def at_concurrency(self) -> bool:
        return self.limit.concurrency is not None and self.running >= self.limit.concurrency

    @property
    def throttled(self) -> bool:
        """Whether the queue has ready tasks its limits hold back: full concurrency or no rate token left."""
        return self.ready > 0 and (self.at_concurrency or self.next_token_s is not None)


class ControlTooling(ToolingHost):
    """Pausing and resuming queues, their runtime limits, and sending worker processes the commands quiet and stop."""

    def pause(self, queue_name: str, *, by: str = "") -> bool:
        """Stop workers acquiring the queue's tasks (enqueues still land); False when it was paused already.

        Each partition has its own copy of the paused queues (acquire reads it in its slot).
        Partition 0 is written first and the partition count read after it, from the server: a
        process raising the count copies partition 0's pauses after raising it, so one of the
        two reaches each new partition.
        """
        paused = bool(self.scripts.pause(queue_name, by))
        for partition in self.covered_partitions(fresh=True)[1:]:
            paused = bool(self.scripts_for(partition).pause(queue_name, by)) or paused
        return paused

    def resume(self, queue_name: str) -> bool:
        """Let workers acquire the queue's tasks again, in every partition; False when no partition had it paused.

        Like `pause`, partition 0 first, then every partition below the count stored now (a
        cached count would miss the partitions a wider process copied the pause into).
        """
        resumed = bool(self.scripts.resume(queue_name))
        for partition in self.covered_partitions(fresh=True)[1:]:
            resumed = bool(self.scripts_for(partition).resume(queue_name)) or resumed
        return resumed

    @translate_errors
    def paused_queues(self) -> dict[str, PausedQueue]:
        """Return every paused queue with who paused it and since when.

        A queue paused in any partition is paused, since acquire skips it there: read over the
        partition count stored now, partition 0's record first.
        """
        pipe = self.client.pipeline(transaction=False)
        for partition in self.covered_partitions(fresh=True):
            pipe.hgetall(self.keys_for(partition).paused())
        paused: dict[str, PausedQueue] = {}
        for stored in pipe.execute():
            for name, raw in stored.items():
                if name.decode() not in paused:
                    document = json.loads(raw)
                    since = datetime.fromtimestamp(document["since"], UTC)
                    paused[name.decode()] = PausedQueue(str(document["by"]), since)
        return paused

    def set_limit(
        self, queue_name: str, *, concurrency: int | None = None, rate: Rate | None = None, by: str = ""
    ) -> QueueLimit:
        """Set the given parts of a queue's runtime limits in every partition; return the limits in force.

        Raises LimitError when a part is below the partition count (a partition would get no share).
        """
        if concurrency is None and rate is None:
            raise LimitError("Give a concurrency, a rate or both.")
        given = QueueLimit(concurrency, rate)
        partitions = self.covered_partitions(fresh=True)
        check_partitions(given, len(partitions))
        for partition in partitions:
            stored = self.scripts_for(partition).limit(queue_name, encode(given), by)
        return overlay(self.config.limits.get(queue_name, NO_LIMIT), decode(stored))

    def clear_limit(self, queue_name: str) -> bool:
        """Clear a queue's runtime limits in every partition (the settings' apply again); False when none was set."""
        had = bool(self.queue_limits([queue_name])[queue_name].runtime != NO_LIMIT)
        for partition in self.covered_partitions(fresh=True):
            self.scripts_for(partition).limit(queue_name, None, "")
        return had

    @translate_errors
    def queue_limits(self, queue_names: Sequence[str]) -> dict[str, LimitState]:
        """Return each queue's limits and what they hold back, one script call a partition (server time included)."""
        partitions = self.covered_partitions()
        settings = [self.config.limits.get(name, NO_LIMIT) for name in queue_names]
        counts = [None if limit.rate is None else limit.rate.count for limit in settings]
        replies = [self.scripts_for(p).limit_state(queue_names, counts, len(partitions)) for p in partitions]
        out = {}
        for i, (name, setting) in enumerate(zip(queue_names, settings, strict=True)):
            rows = [reply[2 + 5 * i : 7 + 5 * i] for reply in replies]
            runtime = decode(rows[0][0])
            audit = json.loads(rows[0][1]) if rows[0][1] else None
            rate = overlay(setting, runtime).rate
            waits = [next_token_s(rate, row[4], reply[:2]) for reply, row in zip(replies, rows, strict=True)]
            out[name] = LimitState(
                setting=setting,
                runtime=runtime,
                set_by=None if audit is None else str(audit["by"]),
                set_since=None if audit is None else datetime.fromtimestamp(audit["since"], UTC),
                ready=sum(row[2] for row in rows),
                running=sum(row[3] for row in rows),
                next_token_s=None if None in waits or not waits else min(w for w in waits if w is not None),
            )
        return out

    @translate_errors
    def send_control(self, workers: Sequence[str], command: str, *, by: str = "") -> None:
        """Ask the supervisors of `workers` to make them quiet or stop; the command waits in Redis until taken."""
        if command not in WORKER_COMMANDS:
            raise ValueError(f"Unknown worker command {command!r}; expected one of {', '.join(WORKER_COMMANDS)}.")
        if workers:
            document = json.dumps({"command": command, "by": by, "at": time.time()})
            self.scripts.send_control(workers, document)

    @translate_errors
    def pending_control(self) -> dict[str, dict[str, Any]]:
        """Return the commands not yet taken by a supervisor: worker name -> {"command", "by", "at"}."""
        return {name.decode(): json.loads(raw) for name, raw in self.client.hgetall(self.keys.control()).items()}

    def take_control(self, workers: Sequence[str]) -> dict[str, str]:
        """Take (and remove) the pending commands of `workers`: worker name -> "quiet" or "stop"."""
        if not workers:
            return {}
        reply = self.scripts.take_control(workers)
        return {reply[i].decode(): json.loads(reply[i + 1])["command"] for i in range(0, len(reply), 2)}
