"""Latency sampling: records the age of each queue's oldest ready task for the minute's history.

The sample is the largest age seen in that minute (`...:latency:<minute>`, ms); a minute no
broker sampled is a gap in the history, not a zero.
"""

from __future__ import annotations

from .passes import BrokerPass, Duty


class Latency(Duty):
    """Samples the oldest ready task's age of a queue."""

    name = "latency"

    def run_once(self, pass_: BrokerPass) -> int:
        """Sample every queue in every partition; return 0, as no task is handled."""
        pass_.serve_each(self.sample)
        return 0

    def sample(self, queue_name: str, partition: int) -> None:
        """Record the age of the queue's oldest ready task in one partition."""
        self.backend.scripts_for(partition).sample_latency(queue_name)
