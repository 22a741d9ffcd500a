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


def thread_of(parts: list[str]) -> str:
    """Return `pid thread` of a stack: py-spy nests a child's frames under its parent's process."""
    processes = [p for p in parts if p.startswith("process ")]
    thread = next((p for p in parts if p.startswith("thread (")), "thread ?")
    pid = processes[-1].split(":", 1)[0] if processes else "process ?"
    role = "supervisor" if len(processes) == 1 else "worker process"
    return f"{role} ({pid}) {thread}"


def is_startup(parts: list[str]) -> bool:
    """Return whether a stack is importing modules or setting Django up: fixed cost, not per task."""
    return any(marker in frame for frame in parts for marker in STARTUP_MARKERS)


#: Frames that mark a process's fixed start cost.
STARTUP_MARKERS = ("_find_and_load", "setup (django/__init__.py", "execute_from_command_line", "create_parser")


def summarise(output: Path, depth: int, top: int) -> None:
    """Print samples by thread, then self time by function and inclusive time by threadmill line, in us per task."""
    self_time: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    threads: collections.Counter[str] = collections.Counter()
    total = startup = 0
    for line in output.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        samples, parts = int(count), frames(stack)
        total += samples
        if is_startup(parts):
            startup += samples
            continue
        threads[thread_of(parts)] += samples
        self_time[parts[-1]] += samples
        for frame in set(parts):
            if "threadmill/" in frame and "tests/benchmarks" not in frame:
                inclusive[frame] += samples
    us = 1e6 / SAMPLE_RATE / depth
    print(f"\n{total} GIL-holding samples at {SAMPLE_RATE} Hz over {depth:,} tasks: {total * us:.0f} us per task, "
          f"of which start-up (imports, Django setup) {startup * us:.0f} us")  # fmt: skip
    for title, counter in (
        ("by process and thread, start-up excluded", threads),
        ("self time by function", self_time),
        ("inclusive time by threadmill frame", inclusive),
    ):
        print(f"\n{title} (us per task):")
        for name, samples in counter.most_common(top):
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
