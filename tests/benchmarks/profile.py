"""Profile a threadmill drain with py-spy: `python -m tests.benchmarks.profile [worker flags]`.

Enqueues the echo tasks on a throwaway Valkey, runs `manage.py threadmill worker
--exit-empty -w 1 -t 1` under `py-spy record --subprocesses`, and prints where the
worker's on-CPU samples go, as microseconds per task: by function (self time) and by
line of threadmill code on the stack (inclusive time). Extra arguments go to the worker,
such as `--prefetch-count 1`.
"""

from __future__ import annotations

import argparse
import collections
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from .drain import ROOT, Context, threadmill_finished
from .server import valkey

#: py-spy samples per second; its default, which adds little load to the worker.
SAMPLE_RATE = 100


def record(depth: int, worker_flags: list[str], output: Path) -> None:
    """Run one drain under py-spy, writing its collapsed stacks to `output`."""
    scratch = Path(tempfile.mkdtemp(prefix="threadmill-profile-"))
    with valkey() as server:
        ctx = Context(server, scratch)
        env = ctx.env("tests.settings", {})
        enqueue = [sys.executable, "-m", "tests.benchmarks.enqueue", "threadmill", str(depth)]
        subprocess.run(enqueue, cwd=ROOT, env=env, check=True)
        worker = [sys.executable, "manage.py", "threadmill", "worker", "--exit-empty", "-w", "1", "-t", "1",
                  "-q", "default", *worker_flags]  # fmt: skip
        spy = [shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy"), "record", "--subprocesses",
               "--threads", "--gil", "--format", "raw", "--rate", str(SAMPLE_RATE), "--output", str(output), "--", *worker]  # fmt: skip
        subprocess.run(spy, cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        finished = threadmill_finished(ctx)
        if finished != depth:
            raise RuntimeError(f"the profiled drain finished {finished} of {depth} tasks")
    shutil.rmtree(scratch, ignore_errors=True)


def frames(stack: str) -> list[str]:
    """Return a collapsed stack's frames, outermost first, each as `function (file:line)`."""
    return [frame.strip() for frame in stack.split(";")]


def summarise(output: Path, depth: int, top: int) -> None:
    """Print self time by function and inclusive time by threadmill line, in us per task."""
    self_time: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    threads: collections.Counter[str] = collections.Counter()
    total = 0
    for line in output.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        samples = int(count)
        parts = frames(stack)
        total += samples
        threads[parts[1] if len(parts) > 1 and parts[0].startswith("process") else parts[0]] += samples
        self_time[parts[-1]] += samples
        for frame in set(parts):
            if "threadmill/" in frame and "tests/benchmarks" not in frame:
                inclusive[frame] += samples
    us = 1e6 / SAMPLE_RATE / depth
    print(f"\n{total} on-CPU samples at {SAMPLE_RATE} Hz over {depth:,} tasks: {total * us:.0f} us per task")
    print("\nby thread (us per task):")
    for name, samples in threads.most_common(top):
        print(f"  {samples * us:8.1f}  {name}")
    print("\nself time by function (us per task):")
    for name, samples in self_time.most_common(top):
        print(f"  {samples * us:8.1f}  {name}")
    print("\ninclusive time by threadmill frame (us per task):")
    for name, samples in inclusive.most_common(top):
        print(f"  {samples * us:8.1f}  {name}")


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.benchmarks.profile", description=__doc__)
    parser.add_argument("--tasks", type=int, default=20_000)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--output", type=Path, default=Path(tempfile.gettempdir()) / "threadmill-drain.pyspy")
    args, worker_flags = parser.parse_known_args()
    record(args.tasks, worker_flags, args.output)
    summarise(args.output, args.tasks, args.top)
    print(f"\ncollapsed stacks: {args.output}")


if __name__ == "__main__":
    main()
