"""Workflow benchmark: a chain's step-to-step delay, and a fan-out/fan-in beside a plain drain, celery and dramatiq.

Every row runs against the same Valkey in the same run, its repeats interleaved, so a noisy
neighbour hits them alike. Each step returns when it started and ended (`time.time()`, this
machine's clock), stored as its result by every system; each join pushes its own start time on a
list (`graph_stamps`), which the driver blocks on. From those:

- **chain**: 1,000 steps enqueued as one workflow on an idle `-w 1 -t 1` pool (started and warmed
  beforehand, not `--exit-empty`): the delay from each step's end to the next step's start, which
  holds the step's acknowledgement (the release happens there), the next acquire and its start;
- **fan-in** rows, each from a filled queue drained by a pool started after the fill: the enqueue
  call's time (`graph_fill`), the makespan from the first step's start to the join's start, and the
  join delay from the last step's end to the join's start; for threadmill also from the last step's
  acknowledgement (the issue's definition: its finished segment's score, the server's clock in the
  acknowledge script that released the join) to the join's start. threadmill's pool is the drain
  benchmark's (`--exit-empty -w 1 -t 1`); celery's and dramatiq's are their drain rows' pools. The
  `plain` row drains the same number of independent steps (no workflow) as the baseline of the
  makespan ratio, paired by repeat.

The fan-in is `MAX_TASKS` tasks in all: threadmill's `fan` row is a root, 9,998 steps and a join
(the root's acknowledgement releases 9,998 children, past one call's budget); the `group` rows
are 9,999 steps and a join, the shape celery's chord and dramatiq's group with a completion
callback have.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from threadmill.workflows import MAX_TASKS

from . import peers, report
from .drain import PEER_PREFETCH, ROOT, Context, stop, threadmill_worker
from .graph_stamps import JOINS_KEY
from .server import server_version, valkey

#: Steps of the chain.
CHAIN_STEPS = 1_000
#: Steps between the root and the join of threadmill's fan row (root + steps + join = MAX_TASKS).
FAN_WIDTH = MAX_TASKS - 2
#: Steps before the join of the group rows (steps + join = MAX_TASKS).
GROUP_WIDTH = MAX_TASKS - 1
#: Independent steps of the plain drain, the makespan's baseline.
PLAIN_WIDTH = MAX_TASKS
#: Longest a row may take from its pool's start to its join, seconds.
ROW_TIMEOUT_S = 300.0
#: The pools: threadmill's drain pool, and the drain benchmark's celery and dramatiq pools on the graph apps.
POOLS = {
    "threadmill": threadmill_worker(1, 1),
    "celery": (
        "-m celery -A tests.benchmarks.peers.celery_graph_app worker -P solo -c 1 -Q default"
        f" --prefetch-multiplier={PEER_PREFETCH} --without-gossip --without-mingle --without-heartbeat -l WARNING"
    ).split(),
    "dramatiq": ["-m", "dramatiq", "tests.benchmarks.peers.dramatiq_graph_app", "-p", "1", "-t", "1", "-Q", "default"],
}
#: The fan-in rows: (row name, system, shape, steps before the join).
ROWS = (
    ("threadmill plain drain", "threadmill", "plain", PLAIN_WIDTH),
    ("threadmill fan-out/fan-in", "threadmill", "fan", FAN_WIDTH),
    ("threadmill group + join", "threadmill", "group", GROUP_WIDTH),
    ("celery chord", "celery", "group", GROUP_WIDTH),
    ("dramatiq group + completion callback", "dramatiq", "group", GROUP_WIDTH),
)
#: Settings module of threadmill's pool and filler (the drain benchmark's).
SETTINGS = "tests.settings"


def _backend(ctx: Context):
    """The threadmill backend on the benchmark's server, read in this process."""
    os.environ["THREADMILL_TEST_REDIS_URL"] = ctx.server.url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", SETTINGS)
    import django

    django.setup()
    from django.tasks import task_backends

    return task_backends["default"]


def fill(ctx: Context, system: str, shape: str, width: int) -> dict[str, Any]:
    env = ctx.env(SETTINGS if system == "threadmill" else None, {})
    command = [sys.executable, "-m", "tests.benchmarks.graph_fill", system, shape, str(width)]
    done = subprocess.run(command, cwd=ROOT, env=env, check=True, capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def start_pool(ctx: Context, system: str, log_path: Path) -> subprocess.Popen:
    env = ctx.env(SETTINGS if system == "threadmill" else None, {"dramatiq_queue_prefetch": str(PEER_PREFETCH)})
    with open(log_path, "w") as log:
        return subprocess.Popen(
            [sys.executable, *POOLS[system]], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip


def wait_for_join(ctx: Context, process: subprocess.Popen, log_path: Path) -> float:
    """Block until a join records its start; return it (epoch seconds)."""
    stamps = ctx.db(peers.PROBE_DB)
    deadline = time.monotonic() + ROW_TIMEOUT_S
    while time.monotonic() < deadline:
        popped = stamps.blpop([JOINS_KEY], timeout=1)
        if popped:
            return float(popped[1])
        if process.poll() is not None:
            raise RuntimeError(f"the pool exited with {process.returncode} before the join ran; see {log_path}")
    raise RuntimeError(f"no join ran within {ROW_TIMEOUT_S:g} s; see {log_path}")


def threadmill_spans(ctx: Context, workflow_id: str | None) -> list[list[float]]:
    """The stored [start, end] of every step (every task but the join) of a workflow, or of every task."""
    backend = _backend(ctx)
    if workflow_id is not None:
        tasks = backend.get_workflow(workflow_id).tasks
        return [r.return_value for name, r in tasks.items() if name != "join"]
    ids = [i.decode() for i in ctx.client.zrange(backend.keys.segment("default", "successful"), 0, -1)]
    return [backend.get_result(task_id).return_value for task_id in ids]


def threadmill_last_acknowledgement(ctx: Context, workflow_id: str) -> float:
    """When the last step (every task but the join) of a workflow was acknowledged, by the server's clock."""
    backend = _backend(ctx)
    join_id = backend.get_workflow(workflow_id).tasks["join"].id
    finished = ctx.client.zrange(backend.keys.segment("default", "successful"), 0, -1, withscores=True)
    return max(score for task_id, score in finished if task_id.decode() != join_id)


def celery_spans(ctx: Context) -> list[list[float]]:
    results = ctx.db(peers.CELERY_RESULTS_DB)
    spans = []
    for key in results.scan_iter(match="celery-task-meta-*", count=1000):
        value = json.loads(results.get(key))["result"]
        if isinstance(value, list):
            spans.append(value)
    return spans


def dramatiq_spans(ctx: Context) -> list[list[float]]:
    results = ctx.db(peers.DRAMATIQ_RESULTS_DB)
    spans = []
    for key in results.scan_iter(count=1000):
        value = json.loads(results.lindex(key, 0))
        if isinstance(value, list):
            spans.append(value)
    return spans


def run_fan_in(ctx: Context, name: str, system: str, shape: str, width: int) -> dict[str, Any]:
    """Fill, drain and read one fan-in row (or the plain drain); return its figures."""
    ctx.client.flushall()
    filled = fill(ctx, system, shape, width)
    log_path = ctx.scratch / f"{name.replace(' ', '_').replace('/', '-')}.log"
    process = start_pool(ctx, system, log_path)
    try:
        if shape == "plain":
            process.wait(ROW_TIMEOUT_S)
            join_start = None
        else:
            join_start = wait_for_join(ctx, process, log_path)
            if system == "threadmill":
                process.wait(ROW_TIMEOUT_S)  # --exit-empty: it exits once the join ran
    finally:
        stop(process)
    if system == "threadmill" and process.returncode != 0:
        raise RuntimeError(f"{name}: the pool exited with {process.returncode}; see {log_path}")
    spans = {"threadmill": lambda: threadmill_spans(ctx, filled["workflow"]), "celery": lambda: celery_spans(ctx),
             "dramatiq": lambda: dramatiq_spans(ctx)}[system]()  # fmt: skip
    expected = width + (1 if shape == "fan" else 0)
    if len(spans) != expected:
        raise RuntimeError(f"{name}: {len(spans)} step results stored, not {expected}; see {log_path}")
    first_start = min(s[0] for s in spans)
    last_end = max(s[1] for s in spans)
    figures = {"enqueue_s": filled["enqueue_s"], "steps": len(spans)}
    if join_start is None:
        figures["makespan_s"] = last_end - first_start
    else:
        figures["makespan_s"] = join_start - first_start
        figures["join_delay_ms"] = (join_start - last_end) * 1000
        if system == "threadmill":
            last_ack = threadmill_last_acknowledgement(ctx, filled["workflow"])
            figures["join_delay_from_ack_ms"] = (join_start - last_ack) * 1000
    return figures


def run_chain(ctx: Context, steps: int) -> dict[str, Any]:
    """Run a chain of `steps` on an idle threadmill pool; return the step-to-step delays (ms)."""
    ctx.client.flushall()
    backend = _backend(ctx)
    log_path = ctx.scratch / "chain.log"
    command = [arg for arg in threadmill_worker(1, 1) if arg != "--exit-empty"]
    env = ctx.env(SETTINGS, {})
    with open(log_path, "w") as log:
        process = subprocess.Popen(
            [sys.executable, *command], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
    try:
        # Warm the pool (started, scripts loaded, one task run), then leave it idle on its wake lists.
        warm = fill(ctx, "threadmill", "chain", 2)
        deadline = time.monotonic() + ROW_TIMEOUT_S
        while backend.get_workflow(warm["workflow"]).status.name != "SUCCESSFUL":
            if time.monotonic() > deadline or process.poll() is not None:
                raise RuntimeError(f"the chain's pool did not warm up; see {log_path}")
            time.sleep(0.05)
        time.sleep(1.0)  # idle: its fetcher back on the wake lists (a benchmark's pause, not a test's sync)
        filled = fill(ctx, "threadmill", "chain", steps)
        while backend.get_workflow(filled["workflow"]).status.name != "SUCCESSFUL":
            if time.monotonic() > deadline or process.poll() is not None:
                raise RuntimeError(f"the chain did not finish; see {log_path}")
            time.sleep(0.05)
    finally:
        stop(process)
    tasks = backend.get_workflow(filled["workflow"]).tasks
    spans = [r.return_value for r in tasks.values()]  # in node order: the chain's order
    gaps = sorted((spans[i + 1][0] - spans[i][1]) * 1000 for i in range(len(spans) - 1))
    return {
        "enqueue_s": filled["enqueue_s"],
        "p50_ms": percentile(gaps, 0.5),
        "p90_ms": percentile(gaps, 0.9),
        "max_ms": gaps[-1],
        "chain_s": spans[-1][1] - spans[0][0],
    }


def percentile(ordered: list[float], q: float) -> float:
    """The `q` quantile of sorted values, nearest rank."""
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run(repeats: int = 3, peer_names: list[str] | None = None) -> dict[str, Any]:
    """Run the chain and the fan-in rows `repeats` times, interleaved; print and write the medians."""
    peer_names = ["celery", "dramatiq"] if peer_names is None else peer_names
    rows = [row for row in ROWS if row[1] == "threadmill" or row[1] in peer_names]
    scratch = Path(tempfile.mkdtemp(prefix="threadmill-workflows-"))
    runs: dict[str, list[dict[str, Any]]] = {"chain": [], **{row[0]: [] for row in rows}}
    loads = []
    with valkey() as server:
        ctx = Context(server, scratch)
        for repeat in range(repeats):
            loads.append(round(os.getloadavg()[0], 2))
            runs["chain"].append(run_chain(ctx, CHAIN_STEPS))
            print(f"[{repeat + 1}/{repeats}] chain: {runs['chain'][-1]}", flush=True)
            for name, system, shape, width in rows:
                runs[name].append(run_fan_in(ctx, name, system, shape, width))
                print(f"[{repeat + 1}/{repeats}] {name}: {runs[name][-1]}", flush=True)
        version = server_version(ctx.client)
    add_paired_makespan(runs)
    figures = {
        "server": version,
        "repeats": repeats,
        "load_average_at_each_repeat": loads,
        "chain": {
            "steps": CHAIN_STEPS,
            "pool": " ".join(c for c in POOLS["threadmill"] if c != "--exit-empty"),
            **summarise(runs["chain"]),
        },
        "fan_in": {
            name: {
                "system": system,
                "shape": shape,
                "steps": width,
                "pool": " ".join(POOLS[system]),
                **summarise(runs[name]),
            }
            for name, system, shape, width in rows
        },
    }
    print_tables(figures)
    print(f"\nwrote {report.write_results('workflows', figures)}")
    return figures


def add_paired_makespan(runs: dict[str, list[dict[str, Any]]]) -> None:
    """Add each fan-in run's makespan over the plain drain's of the same repeat (the same moment's load)."""
    base = runs.get("threadmill plain drain")
    if not base:
        return
    for name, entries in runs.items():
        if name == "chain":
            continue
        for entry, plain in zip(entries, base, strict=True):
            entry["makespan_vs_plain"] = entry["makespan_s"] / plain["makespan_s"]


def summarise(entries: list[dict[str, Any]]) -> dict[str, Any]:
    medians = {}
    for key in entries[0]:
        values = [e[key] for e in entries if isinstance(e.get(key), float | int)]
        if values:
            medians[key] = round(report.median(values), 4)
            medians[f"{key}_range"] = [round(min(values), 4), round(max(values), 4)]
    return {**medians, "runs": entries}


def print_tables(figures: dict[str, Any]) -> None:
    chain = figures["chain"]
    report.print_table(
        f"chain of {chain['steps']:,} steps, idle -w 1 -t 1 pool ({figures['server']}, median of {figures['repeats']})",
        ["p50 ms", "p90 ms", "max ms", "p50 runs", "whole chain s"],
        [[f"{chain['p50_ms']:.2f}", f"{chain['p90_ms']:.2f}", f"{chain['max_ms']:.1f}",
          "..".join(f"{v:.2f}" for v in chain["p50_ms_range"]), f"{chain['chain_s']:.2f}"]],
    )  # fmt: skip
    rows = []
    for name, entry in figures["fan_in"].items():
        delay = f"{entry['join_delay_ms']:.1f}" if "join_delay_ms" in entry else "-"
        delay_range = "..".join(f"{v:.1f}" for v in entry["join_delay_ms_range"]) if "join_delay_ms" in entry else "-"
        from_ack = f"{entry['join_delay_from_ack_ms']:.1f}" if "join_delay_from_ack_ms" in entry else "-"
        rows.append([
            name, f"{entry['steps']:,}", f"{entry['enqueue_s']:.2f}", f"{entry['makespan_s']:.2f}",
            "..".join(f"{v:.2f}" for v in entry["makespan_s_range"]), f"{entry.get('makespan_vs_plain', 0):.2f}x",
            delay, delay_range, from_ack,
        ])  # fmt: skip
    report.print_table(
        f"fan-out/fan-in, {MAX_TASKS:,} tasks ({figures['server']}, median of {figures['repeats']}, "
        f"load {figures['load_average_at_each_repeat']})",
        [
            "row",
            "steps",
            "enqueue s",
            "makespan s",
            "runs",
            "vs plain (paired)",
            "join delay ms",
            "runs",
            "from ack ms",
        ],
        rows,
    )
