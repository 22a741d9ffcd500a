"""The backend's half of `threadmill.api.controls`: paused queues, and commands waiting for worker supervisors.

A pause is copied into every partition (acquire reads it in its own slot); a worker command
waits in one hash until its worker's supervisor takes it, in one script.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from ..base import PausedQueue
from ..scripts import translate_errors
from .host import ToolingHost

#: What an operator can ask of a worker process: stop fetching but stay alive, or stop.
WORKER_COMMANDS = ("quiet", "stop")


class ControlTooling(ToolingHost):
    """Pausing and resuming queues, and sending worker processes the commands quiet and stop."""

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

    @translate_errors
    def send_control(self, workers: Sequence[str], command: str, *, by: str = "") -> None:
        """Ask the supervisors of `workers` to make them quiet or stop; the command waits in Redis until taken."""
        if command not in WORKER_COMMANDS:
            raise ValueError(f"Unknown worker command {command!r}; expected one of {', '.join(WORKER_COMMANDS)}.")
        if workers:
            document = json.dumps({"command": command, "by": by, "at": time.time()})
            self.client.hset(self.keys.control(), mapping=dict.fromkeys(workers, document))

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
