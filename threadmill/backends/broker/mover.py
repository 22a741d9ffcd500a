"""The mover: promotes deferred tasks whose run_after has passed.

Besides its place in every pass, it runs alone when the next deferred task falls due, so a
deferred task starts on time rather than at the next pass: each run notes when that is
(`next_due_at`). A partition that failed says nothing of its next due task; the next pass
tries it again.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from .passes import BrokerPass, Duty

if TYPE_CHECKING:
    from ..redis import RedisTaskBackend


class Mover(Duty):
    """Promotes due deferred tasks to ready, batch by batch."""

    name = "mover"

    def __init__(self, backend: RedisTaskBackend) -> None:
        super().__init__(backend)
        #: Monotonic time the next deferred task falls due, as of the last run; None when none is deferred.
        self.next_due_at: float | None = None

    def run_once(self, pass_: BrokerPass) -> int:
        """Promote the due tasks of every queue in every partition, noting when the next falls due; return how many."""
        total, next_due_in = 0, None
        for queue_name, partition in pass_.each():
            moved, due_in = pass_.attempt(partition, self.move_one, queue_name, partition) or (0, None)
            total += moved
            if due_in is not None and (next_due_in is None or due_in < next_due_in):
                next_due_in = due_in
        self.next_due_at = None if next_due_in is None else time.monotonic() + next_due_in
        return total

    def move(self, queue_name: str) -> int:
        """Promote every due deferred task of a queue to ready, in every partition; return how many."""
        return sum(self.move_one(queue_name, p)[0] for p in self.backend.covered_partitions())

    def move_one(self, queue_name: str, partition: int) -> tuple[int, float | None]:
        """Promote a queue's due tasks in one partition; return how many, and seconds until the next is due."""
        batch_size = self.backend.config.batch_size
        scripts = self.backend.scripts_for(partition)
        total = 0
        while True:
            moved, due_in = scripts.promote(queue_name, batch_size)
            total += moved
            if moved < batch_size:
                return total, due_in
