"""Per-task-path statistics: what a worker counts per finished attempt, and how they are stored and read.

For each queue and task path (the task's dotted `module_path`), per server minute, per hour and
since first use: runs, successful, failed (a final failure), retried (a failed attempt that runs
again), failures by error class, time spent running (a sum and a histogram with the fixed
bounds `BOUNDS_S`) and queue wait (enqueue, or `run_after`, to the lease of a first attempt; a
sum and a histogram). A worker process adds what it acknowledged to its own counts and sends
them at most once every `FLUSH_INTERVAL_S` in one script call; an attempt whose acknowledgement
the fence refused is not counted, and the counts of at most that long are lost when the process
is killed. Each queue counts at most `PATH_CAP` task paths: later ones count under `OTHER_PATH`.

Stored as hashes whose fields are `<path>|<name>` (`runs`, `successful`, `failed`, `retried`,
`run_us`, `run_b<i>`, `waits`, `wait_us`, `wait_b<i>`, `error|<class path>`), bucket i counting
the attempts with a value <= `BOUNDS_S[i]` and above the previous bound (the last: above them all).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

#: Upper bounds of the duration and wait histograms' buckets, seconds; one more bucket holds the rest.
BOUNDS_S = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    300.0,
    1800.0,
)
#: Most task paths counted per queue (bounds the metrics' label cardinality); later ones count as OTHER_PATH.
PATH_CAP = 500
#: What the task paths beyond `PATH_CAP` are counted as.
OTHER_PATH = "(other)"
#: Longest a worker process keeps counts before sending them, seconds.
FLUSH_INTERVAL_S = 1.0
#: Seconds a per-minute or per-hour hash outlives its period: as long as the queue history.
HISTORY_TTL_S = 25 * 60 * 60

COUNTS = ("runs", "successful", "failed", "retried", "run_us", "waits", "wait_us")


def bucket_of(seconds: float) -> int:
    """Return the histogram bucket a value falls in (0 .. len(BOUNDS_S))."""
    return bisect.bisect_left(BOUNDS_S, seconds)


@dataclass
class PathStats:
    """Counts of one task path on one queue over some span, read back from the stored hashes."""

    queue: str
    path: str
    runs: int = 0
    successful: int = 0
    failed: int = 0
    retried: int = 0
    run_us: int = 0
    waits: int = 0
    wait_us: int = 0
    run_buckets: list[int] = field(default_factory=lambda: [0] * (len(BOUNDS_S) + 1))
    wait_buckets: list[int] = field(default_factory=lambda: [0] * (len(BOUNDS_S) + 1))
    errors: dict[str, int] = field(default_factory=dict)

    def add_field(self, name: str, value: int) -> None:
        """Add one stored field's value (its name without the path) to these counts; unknown names are ignored."""
        if name.startswith(("run_b", "wait_b")):
            buckets = self.run_buckets if name[0] == "r" else self.wait_buckets
            index = name.partition("_b")[2]
            if index.isdigit() and int(index) < len(buckets):
                buckets[int(index)] += value
        elif name.startswith("error|"):
            error = name[len("error|") :]
            self.errors[error] = self.errors.get(error, 0) + value
        elif name in COUNTS:
            setattr(self, name, getattr(self, name) + value)

    def merge(self, other: PathStats) -> None:
        """Add `other`'s counts (another span of the same path) to these."""
        for name in COUNTS:
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.run_buckets = [a + b for a, b in zip(self.run_buckets, other.run_buckets, strict=True)]
        self.wait_buckets = [a + b for a, b in zip(self.wait_buckets, other.wait_buckets, strict=True)]
        for error, n in other.errors.items():
            self.errors[error] = self.errors.get(error, 0) + n

    @property
    def failure_rate(self) -> float:
        """Failed attempts (final or retried) per run, 0 when none ran."""
        return (self.failed + self.retried) / self.runs if self.runs else 0.0

    @property
    def run_seconds(self) -> float:
        return self.run_us / 1e6

    def duration_quantile(self, q: float) -> float | None:
        """The q-quantile of run time, interpolated inside its bucket; None when none ran."""
        return _quantile(self.run_buckets, q)

    def wait_quantile(self, q: float) -> float | None:
        """The q-quantile of queue wait, interpolated inside its bucket; None when none was measured."""
        return _quantile(self.wait_buckets, q)


def _quantile(buckets: list[int], q: float) -> float | None:
    total = sum(buckets)
    if not total:
        return None
    rank, seen = q * total, 0
    for index, count in enumerate(buckets):
        if count and seen + count >= rank:
            low = BOUNDS_S[index - 1] if index else 0.0
            if index == len(BOUNDS_S):
                return low  # the open bucket: its lower bound is all that is known
            return low + (BOUNDS_S[index] - low) * ((rank - seen) / count)
        seen += count
    return BOUNDS_S[-1]


def parse_hash(queue: str, fields: dict, into: dict[tuple[str, str], PathStats]) -> None:
    """Add one stored hash (HGETALL reply, bytes or str) of `queue` to `into`, keyed by (queue, path)."""
    for raw_name, raw_value in fields.items():
        name = raw_name.decode() if isinstance(raw_name, bytes) else raw_name
        path, _, counter = name.partition("|")
        if not counter:
            continue
        try:
            value = int(raw_value)
        except ValueError:
            continue
        stats = into.get((queue, path))
        if stats is None:
            stats = into[(queue, path)] = PathStats(queue, path)
        stats.add_field(counter, value)
