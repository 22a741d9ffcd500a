"""Run the benchmarks: `python -m tests.benchmarks [NAME ...]`, each NAME a benchmark listed below or `charts`.

With no name it runs every benchmark but `faults`, `cluster`, `integrations`, `memory`, `backlog` and `workflows`, then
renders the charts. `charts` alone re-renders the charts from the JSON results without measuring anything.
"""

from __future__ import annotations

import argparse
import signal

BENCHMARKS = (
    "backend", "drain", "remote", "fairness", "idle", "deferred", "enqueue", "memory", "faults", "cluster",
    "integrations", "start", "backlog", "workflows",
)  # fmt: skip
#: What runs when no benchmark is named; the fault table takes minutes of real outages and the
#: cluster drain starts a cluster of its own, so both only on request. The remote drain and the
#: fairness rows take about three minutes each at the default repeats, so they stay in. The memory
#: table changes only with the stored layout, so it too runs when named.
DEFAULT_BENCHMARKS = ("backend", "drain", "remote", "fairness", "idle", "deferred", "enqueue", "start", "charts")
#: Peers each benchmark knows; --peers picks among them and each benchmark takes the ones it knows.
KNOWN_PEERS = {
    "drain": ("dramatiq", "celery", "django-tasks-db", "django-tasks-rq"),
    "remote": ("dramatiq", "celery"),
    "fairness": ("celery", "dramatiq"),
    "idle": ("celery", "dramatiq", "huey", "rq"),
    "deferred": ("celery", "dramatiq", "huey", "rq"),
    "enqueue": ("dramatiq", "celery", "huey", "rq"),
    "memory": ("dramatiq", "celery", "rq"),
    "start": ("dramatiq", "rq", "celery", "huey"),
    "workflows": ("celery", "dramatiq"),
}


def stop_on_sigterm() -> None:
    """Turn SIGTERM into KeyboardInterrupt, so every `finally` stops the processes a benchmark started."""

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tests.benchmarks", description=__doc__)
    parser.add_argument(
        "benchmarks", nargs="*", metavar="|".join([*BENCHMARKS, "charts"]), help="which to run (default all)"
    )
    parser.add_argument(
        "--tasks",
        type=int,
        default=None,
        help="tasks per backend, drain, remote, enqueue and memory measurement (default 20,000; 10,000 for remote, "
        "where dramatiq's are capped at 5,000 and celery's at 2,500; 2,000 for faults)",
    )
    parser.add_argument("--repeats", type=int, default=None, help="repeats per figure; the median is reported")
    parser.add_argument(
        "--peers",
        default=None,
        help="comma-separated peers to measure beside threadmill, each benchmark taking those it knows "
        "(default: drain dramatiq,celery,django-tasks-db,django-tasks-rq; idle and deferred celery,dramatiq,huey,rq; "
        "start dramatiq,rq,celery,huey; enqueue, remote and fairness dramatiq,celery; an empty string measures "
        "threadmill alone)",
    )
    parser.add_argument(
        "--prefetch",
        default="128",
        help="comma-separated extra --prefetch-count values to drain threadmill with, as diagnostics (default 128)",
    )
    parser.add_argument(
        "--order",
        choices=("interleaved", "fast-first"),
        default="interleaved",
        help="fairness: ten fast tasks then one slow, repeated (default), or every fast one first, a diagnostic "
        "written to results/fairness-fast-first.json",
    )
    parser.add_argument("--samples", type=int, default=30, help="probe tasks per queue for idle and deferred")
    parser.add_argument("--seed", type=int, default=9, help="seed of the idle gaps and deferred leads")
    parser.add_argument(
        "--pool-workers", type=int, default=10, help="worker processes of the idle pool measured at rest (0 skips it)"
    )
    parser.add_argument("--batch", type=int, default=100, help="tasks per enqueue_many call (default 100)")
    parser.add_argument(
        "--million",
        action="store_true",
        help="memory: also enqueue 1,000,000 echo tasks with enqueue_many and report the server's memory",
    )
    parser.add_argument(
        "--backlog",
        type=int,
        default=None,
        help="backlog: tasks queued, and tasks finished, beside the measured work (default 1,000,000)",
    )
    parser.add_argument(
        "--same-queue",
        action="store_true",
        help="backlog: queue the backlog in the drained queue, ahead of its tasks (default: in another queue)",
    )
    parser.add_argument(
        "--fault", default=None, help="faults: only the rows whose name contains this text (default every row)"
    )
    parser.add_argument(
        "--against", default=None, help="start: also time threadmill at this older commit, from a temporary worktree"
    )
    parser.add_argument(
        "--partitions",
        type=int,
        nargs="+",
        default=[1, 6],
        help="the backend option `partitions` settings the cluster drain compares (default 1 6)",
    )
    args = parser.parse_args()
    everything = not args.benchmarks
    args.benchmarks = args.benchmarks or list(DEFAULT_BENCHMARKS)
    unknown = set(args.benchmarks) - {*BENCHMARKS, "charts"}
    if unknown:
        parser.error(f"unknown benchmark {', '.join(sorted(unknown))}; choose from {', '.join(BENCHMARKS)} or charts")
    if args.peers is not None:
        args.peers = [p for p in args.peers.split(",") if p]
        known = {name for names in KNOWN_PEERS.values() for name in names}
        strangers = set(args.peers) - known
        if strangers:
            parser.error(f"unknown peer {', '.join(sorted(strangers))}; choose from {', '.join(sorted(known))}")
    # Charts follow any measurement of what they plot.
    charted = {"drain", "remote", "fairness", "idle"}
    if not everything and charted & set(args.benchmarks) and "charts" not in args.benchmarks:
        args.benchmarks.append("charts")
    return args


def peers_for(benchmark: str, chosen: list[str] | None) -> list[str] | None:
    """Return the peers of `chosen` that `benchmark` knows, or None for its default."""
    return None if chosen is None else [p for p in chosen if p in KNOWN_PEERS[benchmark]]


def main() -> None:
    args = parse()
    stop_on_sigterm()
    if "backend" in args.benchmarks:
        from . import backend

        backend.run(tasks=args.tasks or 20_000, repeats=args.repeats or 5)
    if "drain" in args.benchmarks:
        from . import drain

        extra = [int(c) for c in args.prefetch.split(",") if c]
        drain.run(
            depth=args.tasks or 20_000,
            repeats=args.repeats or 3,
            peer_names=peers_for("drain", args.peers),
            extra_prefetch=extra,
        )
    if "integrations" in args.benchmarks:
        from . import integrations

        integrations.run(depth=args.tasks or 20_000, repeats=args.repeats or 5)
    if "remote" in args.benchmarks:
        from . import remote

        remote.run(
            depth=args.tasks or remote.DEFAULT_DEPTH,
            repeats=args.repeats or 3,
            peer_names=peers_for("remote", args.peers),
        )
    if "fairness" in args.benchmarks:
        from . import fairness

        fairness.run(repeats=args.repeats or 3, peer_names=peers_for("fairness", args.peers), order=args.order)
    if "idle" in args.benchmarks:
        from . import latency

        latency.run_idle(peers_for("idle", args.peers), args.samples, args.seed, args.pool_workers)
    if "deferred" in args.benchmarks:
        from . import latency

        latency.run_deferred(peers_for("deferred", args.peers), args.samples, args.seed)
    if "enqueue" in args.benchmarks:
        from . import enqueue

        enqueue.run(
            tasks=args.tasks or 20_000,
            repeats=args.repeats or 3,
            batch=args.batch,
            peer_names=peers_for("enqueue", args.peers),
        )
    if "start" in args.benchmarks:
        from . import start

        start.run(
            repeats=args.repeats or start.DEFAULT_REPEATS,
            peer_names=peers_for("start", args.peers),
            against=args.against,
        )
    if "workflows" in args.benchmarks:
        from . import workflows

        workflows.run(repeats=args.repeats or 3, peer_names=peers_for("workflows", args.peers))
    if "memory" in args.benchmarks:
        from . import memory

        memory.run(
            tasks=args.tasks or memory.DEFAULT_TASKS,
            repeats=1 if args.repeats is None else args.repeats,
            peer_names=peers_for("memory", args.peers),
            million=args.million,
        )
    if "backlog" in args.benchmarks:
        from . import backlog

        backlog.run(
            tasks=args.tasks or backlog.DEFAULT_TASKS,
            backlog=args.backlog or backlog.DEFAULT_BACKLOG,
            repeats=args.repeats or 3,
            same_queue=args.same_queue,
        )
    if "cluster" in args.benchmarks:
        from . import cluster

        cluster.run(depth=args.tasks or 20_000, repeats=args.repeats or 3, partitions=tuple(args.partitions))
    if "faults" in args.benchmarks:
        from . import faults

        faults.run(tasks=args.tasks or faults.DEFAULT_TASKS, repeats=args.repeats or 1, only=args.fault)
    if "charts" in args.benchmarks:
        from . import charts

        charts.render()


if __name__ == "__main__":
    main()
