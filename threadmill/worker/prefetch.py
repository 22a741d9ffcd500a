"""How many tasks a worker process leases ahead of its threads: a fixed count, or sized by time.

**Sized by time** (`--prefetch-count auto`, the default): the process keeps a moving average
of how long its tasks run and of how long an acquire takes, and sizes the buffer so its
threads need about `--prefetch-window` to run what it holds (`threads * window / run time`),
or twice the acquire's round trip if that is longer, since the next acquire starts when half
the buffer is free and must come back before the rest is run. The size stays between one
task per thread and `AUTO_MAX_SIZE`, and never holds more than `LEASE_SHARE` of `lease_ttl`
of work, because buffered time counts against the lease. A process that has run nothing yet
leases `COLD_PER_THREAD` per thread. So 50 us tasks fill the cap and the process goes back
to the server once per hundreds of tasks, while 2 s tasks get one per thread and a task
enqueued now (a high priority one, or one another process could run at once) never waits
behind seconds of buffered work. When the tasks turn slower than those the buffer was leased
for, the process hands the surplus back (`SHED_FACTOR`).

**Fixed** (`--prefetch-count N`): always N; 1 leases one task at a time.
"""

from __future__ import annotations

#: Tasks per thread a process leases before it has timed any task (the fixed default of old).
COLD_PER_THREAD = 4
#: Most tasks a process sized by time holds: past this, a bigger acquire saves little server CPU.
AUTO_MAX_SIZE = 256
#: Default time the buffered tasks should take the threads to run, seconds.
DEFAULT_WINDOW_S = 0.02
#: Largest share of `lease_ttl` buffered work may take; a window beyond it is refused.
LEASE_SHARE = 0.1
#: A buffer holding this many times its size hands back all but its size: leased for faster tasks.
SHED_FACTOR = 2
#: Weight of the newest sample in the moving averages: about the last 16 tasks count.
SAMPLE_WEIGHT = 1 / 16


class Prefetch:
    """The buffer size of one worker process, fixed or sized by time; fed by the process, read by its fetcher.

    Not thread-safe: the process calls it under its lock.
    """

    def __init__(self, threads: int, count: int, window_s: float, lease_ttl_s: float) -> None:
        self.threads = threads
        #: The fixed size, or 0 when sized by time.
        self.count = count
        self.window_s = window_s
        self.lease_ttl_s = lease_ttl_s
        #: Moving average of a task's run time, seconds; None until one was timed.
        self.run_s: float | None = None
        #: Moving average of an acquire's round trip, seconds; None until one was timed.
        self.round_trip_s: float | None = None
        self.size = count or COLD_PER_THREAD * threads

    @property
    def auto(self) -> bool:
        """Whether the size follows the measured run time."""
        return not self.count

    def task_ran(self, seconds: float) -> None:
        """Take one task's run time into the average."""
        run_s = self.run_s
        self.run_s = seconds if run_s is None else run_s + (seconds - run_s) * SAMPLE_WEIGHT

    def acquired(self, seconds: float) -> None:
        """Take one acquire's round trip into the average."""
        trip = self.round_trip_s
        self.round_trip_s = seconds if trip is None else trip + (seconds - trip) * SAMPLE_WEIGHT

    def resize(self, running_s: float = 0.0) -> int:
        """Recompute the size from the averages (sized by time only) and return it.

        `running_s` is how long the longest run still going has taken so far: a lower bound of
        its run time, counted as a sample once it passes the average, so a buffer leased for
        fast tasks shrinks while the first slow one still runs instead of after it.
        """
        if self.count:
            return self.size
        run_s = self.run_s
        if run_s is None:
            if not running_s:
                return self.size
            run_s = running_s
        elif running_s > run_s:
            run_s += (running_s - run_s) * SAMPLE_WEIGHT
        run_s = max(run_s, 1e-6)
        held_s = max(self.window_s, 2 * (self.round_trip_s or 0.0))
        held_s = min(held_s, LEASE_SHARE * self.lease_ttl_s)
        self.size = max(self.threads, min(AUTO_MAX_SIZE, int(self.threads * held_s / run_s)))
        return self.size

    def describe(self) -> str:
        """The rule in a few words, for the start-up log line."""
        if self.count:
            return f"buffer of {self.count} tasks"
        return f"buffer sized to {self.window_s * 1000:g} ms of work (starting at {self.size} tasks)"
