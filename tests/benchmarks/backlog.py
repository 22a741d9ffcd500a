"""Backlog benchmark: the cost of work beside a large history, against an empty server (issue #30).

Three Valkeys, one per state: empty; B tasks queued (ready, in the `reports` queue, which the drain does not
read; with `--same-queue`, in `default`, ahead of the drain's tasks); those plus B finished tasks kept in
`default`, the queue the drain works. Each repeat, in a process of its own, enqueues N echo tasks one
`enqueue` call each (the default path, timed), times the first and last page of the deepest ready segment,
drains N with the default pool (`-w 1 -t 1`, the rate between the first and the last observed result, as the
drain benchmark reads it), times the overview, the task list and the work queue's successful segment with
Django's test Client, and one pass of the broker's duties (`RedisBroker.run_once`), then deletes what the
drain finished, so every repeat of a state starts from the same data. Repeats go round the states in turn, so
a busy neighbour slows each alike; each figure is the median of its repeats and its cost ratio is the state's
cost over the empty server's (a rate's cost is its inverse; above 1 is slower). The queued tasks are stored by
`enqueue_many`; the finished ones are copies of one real finished task (enqueued and drained by a worker): its
hash with the id replaced, and its entry in the successful segment, the copies finished evenly over the last
day, each hash's TTL shortened by its age.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from . import report
from .drain import ROOT, Context, stop, threadmill_worker
from .server import server_version, valkey

#: Tasks enqueued and drained per repeat unless told otherwise.
DEFAULT_TASKS = 20_000
#: Tasks queued, and tasks finished, beside the work unless told otherwise.
DEFAULT_BACKLOG = 1_000_000
#: The queue the backlog waits in when it is not the drain's (one of the test settings' QUEUES).
BACKLOG_QUEUE = "reports"
#: The queue the drain works and the finished tasks are kept in.
WORK_QUEUE = "default"
#: Tasks per `enqueue_many` call of the backlog's fill.
FILL_CALL = 10_000
#: Finished copies per pipeline of the fill.
COPY_BATCH = 5_000
#: How long before its expiry the oldest finished copy stands, seconds: a run's first ten minutes
#: trim nothing, and later ones trim the copies as they expire, at the pace a day of them would.
EXPIRY_MARGIN_S = 600
#: Requests timed per console page, and broker passes per repeat; the median is kept.
PAGE_REQUESTS = 20
PASSES = 5
#: Seconds between two reads of the drain's finished count.
POLL_S = 0.01
SETTINGS = "tests.settings"
#: The console pages timed once the tasks are enqueued: the deepest ready segment's first and last page.
READY_PAGES = ("ready segment, first page", "ready segment, last page")
#: The console pages timed once the tasks are drained, by name.
PAGES = {
    "overview": "/threadmill/",
    "task list": "/threadmill/tasks/",
    "successful segment, first page": f"/threadmill/default/{WORK_QUEUE}/successful/?page=1",
}
#: Rows of a console segment page.
PAGE_ROWS = 50
#: Rates (tasks per second: cost is the inverse) and times (ms: cost is the time itself).
RATES = ("enqueue_per_s", "drain_per_s")
#: A state's entries that are not measured figures.
NOT_FIGURES = ("fill_queued_s", "fill_finished_s", "used_memory_mb", "runs")


# -- the states ---------------------------------------------------------------------------


def fill_queued(queue_name: str, count: int) -> float:
    """Store `count` ready echo tasks in `queue_name` with `enqueue_many`; return the seconds it took."""
    from tests.tasks import echo

    task = echo.using(queue_name=queue_name)
    started = time.perf_counter()
    for offset in range(0, count, FILL_CALL):
        task.enqueue_many([((i,), {}) for i in range(offset, min(count, offset + FILL_CALL))])
    return time.perf_counter() - started


def finished_template(ctx: Context) -> dict[str, Any]:
    """Enqueue one echo task, drain it with a worker, and return its stored shape (then forget it)."""
    from django.tasks import task_backends

    from tests.tasks import echo

    keys = task_backends["default"].keys
    since = time.time()
    task_id = echo.using(queue_name=WORK_QUEUE).enqueue("finished").id
    drain_all(ctx)
    successful = keys.segment(WORK_QUEUE, "successful")
    template = {"id": task_id, "fields": ctx.client.hgetall(keys.task(task_id))}
    template.update(ttl_ms=ctx.client.pttl(keys.task(task_id)), score=ctx.client.zscore(successful, task_id))
    forget_finished_since(ctx, since)
    return template


def fill_finished(ctx: Context, template: dict[str, Any], count: int) -> float:
    """Store `count` copies of a real finished task in the work queue; return the seconds it took.

    The copies finished evenly over the last day, each hash's TTL shortened by its age, as
    tasks finished at that pace would stand under the default `result_ttl`.
    """
    from django.tasks import task_backends

    keys = task_backends["default"].keys
    successful = keys.segment(WORK_QUEUE, "successful")
    old, ttl_ms, newest = template["id"].encode(), template["ttl_ms"], template["score"]
    spacing_s = (ttl_ms / 1000 - EXPIRY_MARGIN_S) / count
    started = time.perf_counter()
    for offset in range(0, count, COPY_BATCH):
        pipe = ctx.client.pipeline(transaction=False)
        for i in range(offset, min(count, offset + COPY_BATCH)):
            # An id of the template's length and shape, unique per copy.
            new = f"{template['id'][:24]}{i:012x}"
            fields = {k: v.replace(old, new.encode()) for k, v in template["fields"].items()}
            age_s = (i + 1) * spacing_s
            pipe.hset(keys.task(new), mapping=fields)
            pipe.pexpire(keys.task(new), int(ttl_ms - age_s * 1000))
            pipe.zadd(successful, {new: newest - age_s})
        pipe.execute()
    return time.perf_counter() - started


def drain_all(ctx: Context) -> None:
    """Run the default pool over the work queue until it is empty (it exits by itself)."""
    command = [sys.executable, *threadmill_worker()]
    subprocess.run(command, cwd=ROOT, env=ctx.env(SETTINGS, {}), check=True, capture_output=True, timeout=600)


# -- one repeat ---------------------------------------------------------------------------


def enqueue(tasks: int) -> float:
    """Enqueue `tasks` echo tasks in the work queue, one call each; return tasks per second."""
    from tests.tasks import echo

    task = echo.using(queue_name=WORK_QUEUE)
    started = time.perf_counter()
    for i in range(tasks):
        task.enqueue(i)
    return tasks / (time.perf_counter() - started)


def finished_since(ctx: Context, since: float) -> int:
    """Return how many tasks of the work queue finished after `since` (epoch seconds).

    A count of the whole segment would fall as the trimmer drops the oldest finished copies.
    """
    from threadmill.backends.keys import KeySchema

    return ctx.client.zcount(KeySchema("default").segment(WORK_QUEUE, "successful"), since, "+inf")


def drain(ctx: Context, tasks: int, log_path: Path) -> float:
    """Run the default pool until `tasks` tasks of the work queue finished, stop it; return tasks per second."""
    since = time.time()
    with open(log_path, "w") as log:
        started = time.perf_counter()
        process = subprocess.Popen(
            [sys.executable, *threadmill_worker()], cwd=ROOT, env=ctx.env(SETTINGS, {}), stdout=log,
            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        try:
            first = None
            deadline = started + tasks / 100 + 120
            while (done := finished_since(ctx, since)) < tasks:
                now = time.perf_counter()
                if done and first is None:
                    first = (done, now)
                if now > deadline or (process.poll() is not None and finished_since(ctx, since) < tasks):
                    raise RuntimeError(f"The drain finished {done} of {tasks} tasks; see {log_path}")
                time.sleep(POLL_S)
            last = (done, time.perf_counter())
        finally:
            stop(process)
    if first is None:
        raise RuntimeError(f"The drain finished its {tasks} tasks before the first reading; see {log_path}")
    return (last[0] - first[0]) / (last[1] - first[1])


def time_page(client: Any, path: str) -> float:
    """Return the median milliseconds of `PAGE_REQUESTS` requests of one console page."""
    samples = []
    for _ in range(PAGE_REQUESTS):
        started = time.perf_counter()
        response = client.get(path)
        samples.append((time.perf_counter() - started) * 1000)
        if response.status_code != 200:
            raise RuntimeError(f"{path} answered {response.status_code}.")
    return report.median(samples)


def ready_page_times(ctx: Context, client: Any) -> dict[str, float]:
    """Time the first and last page of the deepest ready segment (the backlog's, or the work queue's when empty)."""
    from threadmill.backends.keys import KeySchema

    depths = {q: ctx.client.zcard(KeySchema("default").segment(q, "ready")) for q in (WORK_QUEUE, BACKLOG_QUEUE)}
    queue_name = max(depths, key=lambda q: depths[q])
    last = -(-depths[queue_name] // PAGE_ROWS)
    path = f"/threadmill/default/{queue_name}/ready/?page="
    return dict(zip(READY_PAGES, (time_page(client, f"{path}1"), time_page(client, f"{path}{last}")), strict=True))


def pass_time() -> float:
    """Return the median milliseconds of one broker pass over every queue."""
    from django.tasks import task_backends

    from threadmill.backends.broker import RedisBroker

    broker = RedisBroker(task_backends["default"])
    samples = []
    for _ in range(PASSES):
        started = time.perf_counter()
        broker.run_once()
        samples.append((time.perf_counter() - started) * 1000)
    return report.median(samples)


def forget_finished_since(ctx: Context, since: float) -> None:
    """Delete the tasks of the work queue that finished after `since` (epoch seconds) and their segment entries."""
    from django.tasks import task_backends

    keys = task_backends["default"].keys
    successful = keys.segment(WORK_QUEUE, "successful")
    ids = [i.decode() for i in ctx.client.zrangebyscore(successful, since, "+inf")]
    for offset in range(0, len(ids), COPY_BATCH):
        batch = ids[offset : offset + COPY_BATCH]
        pipe = ctx.client.pipeline(transaction=False)
        pipe.delete(*[keys.task(i) for i in batch])
        pipe.zrem(successful, *batch)
        pipe.execute()


def repeat(ctx: Context, client: Any, tasks: int, tag: str) -> dict[str, Any]:
    """Enqueue and drain `tasks`, time the pages and a pass, then remove what the drain finished."""
    since = time.time()
    figures: dict[str, Any] = {"enqueue_per_s": enqueue(tasks)}
    pages = ready_page_times(ctx, client)
    figures["drain_per_s"] = drain(ctx, tasks, ctx.scratch / f"drain-{tag}.log")
    pages.update({name: time_page(client, path) for name, path in PAGES.items()})
    figures["pages_ms"] = pages
    figures["broker_pass_ms"] = pass_time()
    forget_finished_since(ctx, since)
    return figures


# -- the run ------------------------------------------------------------------------------


def console_client() -> Any:
    """Return a test Client logged in as a staff user of a fresh in-memory database."""
    from django.conf import settings
    from django.contrib.auth.models import User
    from django.core.management import call_command
    from django.test import Client

    settings.ALLOWED_HOSTS = [*settings.ALLOWED_HOSTS, "testserver"]
    call_command("migrate", verbosity=0)
    client = Client()
    client.force_login(User.objects.create_user("bench", password="pw", is_staff=True))
    return client


#: The states measured, each on a server of its own: (name, with the backlog queued, with it finished).
STATES = (("empty", False, False), ("queued", True, False), ("queued + finished", True, True))


def child_context() -> Context:
    """Return the context of a measuring process: the server its parent names in the environment."""
    url = os.environ["THREADMILL_TEST_REDIS_URL"]
    server = SimpleNamespace(url=url, port=int(url.rsplit(":", 1)[1].split("/")[0]))
    return Context(server, Path(os.environ["BENCH_SCRATCH"]))


def prepare(tasks: int, backlog: int, backlog_queue: str, queued: bool, finished: bool) -> dict[str, float]:
    """In a measuring process: warm the server up, then store its state's backlog; return the fill's seconds."""
    ctx = child_context()
    # Unmeasured: the scripts load, the first keys exist.
    repeat(ctx, console_client(), min(tasks, 1_000), "warm-up")
    template = finished_template(ctx)
    queued_s = fill_queued(backlog_queue, backlog) if queued else 0.0
    finished_s = fill_finished(ctx, template, backlog) if finished else 0.0
    return {"fill_queued_s": round(queued_s, 1), "fill_finished_s": round(finished_s, 1)}


def measure_in_process(ctx: Context, *arguments: Any) -> dict[str, Any]:
    """Run `python -m tests.benchmarks.backlog ARGUMENTS...` against `ctx`'s server; return the JSON it prints."""
    command = [sys.executable, "-m", "tests.benchmarks.backlog", *map(str, arguments)]
    env = ctx.env(SETTINGS, {"BENCH_SCRATCH": str(ctx.scratch)})
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command[3:])} failed: {done.stderr.strip()[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def run(
    tasks: int = DEFAULT_TASKS, backlog: int = DEFAULT_BACKLOG, repeats: int = 3, same_queue: bool = False
) -> dict[str, Any]:
    """Measure every state `repeats` times, interleaved, and print and write the medians and their cost ratios."""
    backlog_queue = WORK_QUEUE if same_queue else BACKLOG_QUEUE
    scratch = Path(tempfile.mkdtemp(prefix="threadmill-backlog-"))
    states: dict[str, Any] = {}
    with contextlib.ExitStack() as stack:
        contexts = {name: Context(stack.enter_context(valkey()), scratch) for name, _, _ in STATES}
        for name, queued, finished in STATES:
            filled = measure_in_process(contexts[name], "prepare", tasks, backlog, backlog_queue, queued, finished)
            filled["used_memory_mb"] = round(contexts[name].client.info("memory")["used_memory"] / 2**20, 1)
            states[name] = {**filled, "runs": []}
            print(f"{name}: {filled}", flush=True)
        # Interleaved, so a busy neighbour slows every state alike.
        for n in range(repeats):
            for name, _, _ in STATES:
                tag = f"{name.replace(' ', '')}-{n}"
                states[name]["runs"].append(measure_in_process(contexts[name], "repeat", tasks, tag))
                print(f"  [{n + 1}/{repeats}] {name}: {flat(states[name]['runs'][-1])}", flush=True)
        version = server_version(contexts["empty"].client)
    # Kept when a step fails, since the workers' logs there say why.
    shutil.rmtree(scratch, ignore_errors=True)
    for state in states.values():
        state.update(medians(state["runs"]))
    name = "backlog-same-queue" if same_queue else "backlog"
    figures = {
        "server": version, "tasks": tasks, "backlog": backlog, "repeats": repeats, "backlog_queue": backlog_queue,
        "method": __doc__.split("\n\n")[1].replace("\n", " "), "states": add_ratios(states),
    }  # fmt: skip
    print_backlog(figures)
    print(f"\nwrote {report.write_results(name, figures)}")
    return figures


def flat(figures: dict[str, Any]) -> dict[str, float]:
    """Return a repeat's figures as one level, `pages_ms` spread into one entry per page."""
    out = {k: v for k, v in figures.items() if k != "pages_ms"}
    out.update({f"{page} ms": ms for page, ms in figures.get("pages_ms", {}).items()})
    return {k: round(v, 2) for k, v in out.items()}


def medians(runs: list[dict[str, Any]]) -> dict[str, float]:
    flats = [flat(r) for r in runs]
    return {k: round(report.median([f[k] for f in flats]), 2) for k in flats[0]}


def cost(name: str, state: float, empty: float) -> float:
    """Return a figure's cost beside the backlog over the empty server's (a rate's cost is its inverse)."""
    return empty / state if name in RATES else state / empty


def add_ratios(states: dict[str, Any]) -> dict[str, Any]:
    """Add each state's cost ratio per figure: of the medians, and the median of each repeat's own ratio.

    The paired ratio compares the states within one round of repeats, which a neighbour's load
    swings alike, so it holds up better than the ratio of medians on a busy machine.
    """
    empty = states["empty"]
    names = [k for k in empty if k not in (*NOT_FIGURES, "cost_ratio", "paired_cost_ratio")]
    empty_runs = [flat(r) for r in empty["runs"]]
    for state in states.values():
        state["cost_ratio"] = {k: round(cost(k, state[k], empty[k]), 2) for k in names}
        pairs = list(zip((flat(r) for r in state["runs"]), empty_runs, strict=True))
        state["paired_cost_ratio"] = {
            k: round(report.median([cost(k, s[k], e[k]) for s, e in pairs]), 2) for k in names
        }
    return states


def print_backlog(figures: dict[str, Any]) -> None:
    states = figures["states"]
    names = list(states["empty"]["cost_ratio"])
    loaded = [s for s in states if s != "empty"]
    header = ["figure", *states, *[f"{s} / empty (paired)" for s in loaded]]
    rows = [
        [
            n,
            *[f"{states[s][n]:,.2f}" for s in states],
            *[f"{states[s]['cost_ratio'][n]:.2f}x ({states[s]['paired_cost_ratio'][n]:.2f}x)" for s in loaded],
        ]
        for n in names
    ]
    report.print_table(
        f"backlog of {figures['backlog']:,} in {figures['backlog_queue']}, {figures['tasks']:,} tasks a repeat, "
        f"{figures['server']}, median of {figures['repeats']}",
        header,
        rows,
    )


def _main() -> None:
    """One step in a measuring process: `prepare TASKS BACKLOG QUEUE QUEUED FINISHED` or `repeat TASKS TAG`."""
    import django

    django.setup()
    step, tasks = sys.argv[1], int(sys.argv[2])
    if step == "prepare":
        queued, finished = (sys.argv[i] == "True" for i in (5, 6))
        print(json.dumps(prepare(tasks, int(sys.argv[3]), sys.argv[4], queued, finished)))
    else:
        print(json.dumps(repeat(child_context(), console_client(), tasks, sys.argv[3])))


if __name__ == "__main__":
    _main()
