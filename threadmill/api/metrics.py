"""Prometheus metrics of every threadmill backend, in the text exposition format written by `prometheus_client`.

A scrape reads counts and counters only, never a segment's members: per backend one pipeline
of ZCARDs, one of two-entry ZRANGEs for the oldest ready task, one of HMGETs for the totals,
the heartbeats and their documents, and the paused queues, so its cost does not grow with the
number of tasks stored; and per backend one pipeline of HGETALLs for the per-task-path totals,
whose label `task` is bounded by `taskstats.PATH_CAP` paths a queue; and per backend one INFO for
the server's memory against its `maxmemory`.

`prometheus_client` is imported at the first scrape, not with the API: every command of
`manage.py threadmill` imports the API, and the worker's start paid 10 ms for it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from ..backends.taskstats import BOUNDS_S, PathStats
from ..backends.tooling import TaskLimitState
from ..base import Segment
from .queues import backend_aliases, get_backend, server_memory

if TYPE_CHECKING:
    from prometheus_client.core import Metric

# `CONTENT_TYPE_LATEST` too, read through `__getattr__` (below).
__all__ = [
    "PathStats",
    "TaskLimitState",
    "exposition",
    "task_limits",
    "task_path_minutes",
    "task_paths",
]

#: The counter `threadmill_tasks_<name>_total` of each of a queue's totals, and what it counts.
COUNTED = {
    "enqueued": "Tasks enqueued",
    "finished": "Tasks finished",
    "failed": "Tasks failed",
    "cancelled": "Tasks cancelled before they ran",
    "abort_requested": "Running tasks asked to abort",
    "aborted": "Runs ended by an abort (TaskCancelled)",
    "timed_out": "Runs that passed their time limit (TaskTimeout), retried or failed",
    "already_stored": "Tasks a retried enqueue found stored already (the reply to an earlier attempt was lost)",
}
#: Counters of a queue's totals that count something other than tasks: name, what it counts.
COUNTED_CALLS = {
    "enqueue_retries": "Enqueue calls sent again after a transient error (a restart, an outage, a failover)",
}


class ThreadmillCollector:
    """Collect queue and worker metrics from every threadmill backend at scrape time."""

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

        tasks = GaugeMetricFamily(
            "threadmill_tasks", "Tasks in a queue's segment.", labels=["backend", "queue", "segment"]
        )
        oldest = GaugeMetricFamily(
            "threadmill_oldest_ready_age_seconds",
            "Age of the queue's oldest ready task (its latency); 0 when none is ready.",
            labels=["backend", "queue"],
        )
        paused = GaugeMetricFamily(
            "threadmill_queue_paused", "1 when the queue is paused, else 0.", labels=["backend", "queue"]
        )
        counters = {
            name: CounterMetricFamily(
                f"threadmill_tasks_{name}", f"{what} since the queue was first used.", labels=["backend", "queue"]
            )
            for name, what in COUNTED.items()
        }
        counters |= {
            name: CounterMetricFamily(
                f"threadmill_{name}", f"{what} since the queue was first used.", labels=["backend", "queue"]
            )
            for name, what in COUNTED_CALLS.items()
        }
        alive = GaugeMetricFamily(
            "threadmill_workers_alive", "Worker processes with a current heartbeat.", labels=["backend"]
        )
        per_worker = {
            "threads": GaugeMetricFamily(
                "threadmill_worker_threads", "Threads of a worker process.", labels=["backend", "worker"]
            ),
            "busy_threads": GaugeMetricFamily(
                "threadmill_worker_busy_threads",
                "Threads of a worker process running a task.",
                labels=["backend", "worker"],
            ),
            "cpu_percent": GaugeMetricFamily(
                "threadmill_worker_cpu_percent",
                "CPU use of a worker process, percent of one core.",
                labels=["backend", "worker"],
            ),
            "rss_bytes": GaugeMetricFamily(
                "threadmill_worker_rss_bytes", "Resident memory of a worker process.", labels=["backend", "worker"]
            ),
        }
        task_runs = CounterMetricFamily(
            "threadmill_task_runs",
            "Attempts of a task path by outcome: successful, failed (a final failure) or retried.",
            labels=["backend", "queue", "task", "outcome"],
        )
        durations = HistogramMetricFamily(
            "threadmill_task_duration_seconds",
            "Run time of a task path's attempts.",
            labels=["backend", "queue", "task"],
        )
        waits = HistogramMetricFamily(
            "threadmill_task_wait_seconds",
            "Queue wait of a task path's first attempts: enqueue (or run_after) to lease.",
            labels=["backend", "queue", "task"],
        )
        memory = {
            "used": GaugeMetricFamily(
                "threadmill_server_used_memory_bytes", "Memory the backend's server uses (INFO used_memory).",
                labels=["backend"],
            ),
            "max": GaugeMetricFamily(
                "threadmill_server_maxmemory_bytes", "The server's maxmemory; 0: no limit.", labels=["backend"]
            ),
            "full": GaugeMetricFamily(
                "threadmill_server_full", "1 while the server is at its maxmemory and refuses enqueues.",
                labels=["backend"],
            ),
        }  # fmt: skip
        for alias in backend_aliases():
            self._queues(alias, tasks, oldest, paused, counters)
            self._workers(alias, alive, per_worker)
            self._task_paths(alias, task_runs, durations, waits)
        for reading in server_memory():
            if reading.used_memory is not None:
                memory["used"].add_metric([reading.alias], reading.used_memory)
            memory["max"].add_metric([reading.alias], reading.maxmemory or 0)
            memory["full"].add_metric([reading.alias], 1.0 if reading.full else 0.0)
        yield from (tasks, oldest, paused, *counters.values(), alive, *per_worker.values(), task_runs, durations, waits)
        yield from memory.values()

    @staticmethod
    def _task_paths(alias, task_runs, durations, waits) -> None:
        for stats in get_backend(alias).task_stats(minutes=None):
            labels = [alias, stats.queue, stats.path]
            for outcome in ("successful", "failed", "retried"):
                task_runs.add_metric([*labels, outcome], getattr(stats, outcome))
            durations.add_metric(labels, _cumulative(stats.run_buckets), stats.run_us / 1e6)
            waits.add_metric(labels, _cumulative(stats.wait_buckets), stats.wait_us / 1e6)

    @staticmethod
    def _queues(alias, tasks, oldest, paused, counters) -> None:
        backend = get_backend(alias)
        stats, totals, pauses = backend.queue_stats(), backend.totals(), backend.paused_queues()
        now = backend.server_time().timestamp()
        ready_since = backend.oldest_ready_enqueued_at(list(stats))
        for queue_name, counts in stats.items():
            for segment in Segment:
                tasks.add_metric([alias, queue_name, segment.value], counts[segment])
            since = ready_since[queue_name]
            oldest.add_metric([alias, queue_name], 0.0 if since is None else max(0.0, now - since.timestamp()))
            paused.add_metric([alias, queue_name], 1.0 if queue_name in pauses else 0.0)
            for name, family in counters.items():
                family.add_metric([alias, queue_name], totals.get(queue_name, {}).get(name, 0))

    @staticmethod
    def _workers(alias, alive, per_worker) -> None:
        documents = get_backend(alias).live_workers()
        alive.add_metric([alias], len(documents))
        for document in documents:
            for field, family in per_worker.items():
                value = document.get(field)
                if isinstance(value, int | float) and not isinstance(value, bool):
                    family.add_metric([alias, str(document["worker"])], value)


def _cumulative(buckets: list[int]) -> list[tuple[str, int]]:
    """Prometheus buckets (upper bound, count at or below it) from per-bucket counts, +Inf last."""
    out, seen = [], 0
    for bound, count in zip((*map(repr, BOUNDS_S), "+Inf"), buckets, strict=True):
        seen += count
        out.append((bound, seen))
    return out


def exposition() -> bytes:
    """Return every backend's metrics in the Prometheus text format, read now."""
    from prometheus_client import CollectorRegistry, generate_latest

    registry = CollectorRegistry(auto_describe=False)
    registry.register(ThreadmillCollector())
    return generate_latest(registry)


def task_paths(alias: str, *, minutes: int | None = 60) -> list[PathStats]:
    """Every task path's counts on every queue of `alias` over the last `minutes` (None: since first use)."""
    return get_backend(alias).task_stats(minutes=minutes)


def task_path_minutes(alias: str, queue_name: str, path: str, *, minutes: int = 60) -> list[tuple[int, PathStats]]:
    """One task path's counts on one queue for each of the last `minutes`, oldest first, as (epoch minute, counts)."""
    return get_backend(alias).task_stats_by_minute(queue_name, path, minutes=minutes)


def task_limits(alias: str) -> dict[str, TaskLimitState]:
    """Every task path of `alias` with a per-task limit (`@task(concurrency=, rate=)`), and its runs leased now."""
    return get_backend(alias).task_limits()


def __getattr__(name: str) -> str:
    # `CONTENT_TYPE_LATEST`, the exposition's media type, comes with prometheus_client (see above).
    if name == "CONTENT_TYPE_LATEST":
        from prometheus_client import CONTENT_TYPE_LATEST

        return CONTENT_TYPE_LATEST
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
