"""The trimmer: drops the finished ids of a queue whose task data expired with `result_ttl`.

`acknowledge` trims only the segment it writes to, so without this an idle queue would keep
listing and counting tasks that are gone.
"""

from __future__ import annotations

from .passes import BrokerPass, Duty

#: Most expired ids a trim call drops from each finished segment.
TRIM_BATCH_SIZE = 1000


class Trimmer(Duty):
    """Drops expired ids from the successful and failed segments."""

    name = "trimmer"

    def run_once(self, pass_: BrokerPass) -> int:
        """Trim every queue in every partition; return how many ids were dropped."""
        return pass_.serve_each(self.trim)

    def trim(self, queue_name: str, partition: int | None = None) -> int:
        """Drop the finished ids of a queue whose task data expired (in one partition, or all); return how many."""
        if partition is None:
            return sum(self.trim(queue_name, p) for p in self.backend.covered_partitions())
        result_ttl = self.backend.config.result_ttl
        scripts = self.backend.scripts_for(partition)
        total = 0
        while (dropped := scripts.trim_finished(queue_name, result_ttl, TRIM_BATCH_SIZE)) > 0:
            total += dropped
        return total
