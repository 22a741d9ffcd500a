"""Run the benchmarks: `python -m tests.benchmarks [backend] [drain] [faults] [options]`."""

from __future__ import annotations

import argparse

BENCHMARKS = ("backend", "drain", "faults")
#: What runs when no benchmark is named; the fault table takes minutes of real outages, so only on request.
DEFAULT_BENCHMARKS = ("backend", "drain")


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.benchmarks", description=__doc__)
    parser.add_argument(
        "benchmarks", nargs="*", metavar="backend|drain|faults", help="which to run (default backend and drain)"
    )
    parser.add_argument(
        "--tasks", type=int, default=None, help="tasks per measurement (default 20,000; 2,000 for faults)"
    )
    parser.add_argument("--repeats", type=int, default=None, help="repeats per figure; the median is reported")
    parser.add_argument(
        "--peers",
        default="dramatiq,celery,django-tasks-db,django-tasks-rq",
        help="comma-separated peers to drain beside threadmill (an empty string drains threadmill alone)",
    )
    parser.add_argument(
        "--prefetch",
        default="128",
        help="comma-separated extra --prefetch-count values to drain threadmill with, as diagnostics (default 128)",
    )
    args = parser.parse_args()
    args.benchmarks = args.benchmarks or list(DEFAULT_BENCHMARKS)
    unknown = set(args.benchmarks) - set(BENCHMARKS)
    if unknown:
        parser.error(f"unknown benchmark {', '.join(sorted(unknown))}; choose from {', '.join(BENCHMARKS)}")
    if "backend" in args.benchmarks:
        from . import backend

        backend.run(tasks=args.tasks or 20_000, repeats=args.repeats or 5)
    if "drain" in args.benchmarks:
        from . import drain

        peers = [p for p in args.peers.split(",") if p]
        extra = [int(c) for c in args.prefetch.split(",") if c]
        drain.run(depth=args.tasks or 20_000, repeats=args.repeats or 3, peer_names=peers, extra_prefetch=extra)
    if "faults" in args.benchmarks:
        from . import faults

        faults.run(tasks=args.tasks or faults.DEFAULT_TASKS, repeats=args.repeats or 1)


if __name__ == "__main__":
    main()
