"""Latency sampling: records the age of each queue's oldest ready task for the minute's history.

The sample is the largest age seen in that minute (`...:latency:<minute>`, ms); a minute no
broker sampled is a gap in the history, not a zero.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..redis import RedisTaskBackend


class Latency:
    """Samples the oldest ready task's age of a queue."""

    name = "latency"

    def __init__(self, backend: RedisTaskBackend) -> None:
        self.backend = backend

    def sample(self, queue_name: str, partition: int) -> None:
        """Record the age of the queue's oldest ready task in one partition."""
        self.backend.scripts_for(partition).sample_latency(queue_name)
