"""Charts of the drain and idle-latency comparisons, rendered from the JSON results.

`python -m tests.benchmarks charts` re-renders them without measuring; a run of `drain`
or `idle` renders them after measuring. The PNGs go to docs/images/ for the README.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .report import RESULTS_DIR

IMAGES_DIR = Path(__file__).resolve().parents[2] / "docs" / "images"
#: Threadmill's bars stand out; the peers share one colour.
THREADMILL_COLOUR = "#1f6feb"
PEER_COLOUR = "#8c959f"
SERVER_COLOUR = "#d4a72c"
DPI = 110


def load(name: str) -> dict[str, Any] | None:
    path = RESULTS_DIR / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def machine_note(figures: dict[str, Any]) -> str:
    """Return one line saying what and where the figures were measured."""
    m = figures["machine"]
    load_average = ", ".join(f"{x:.1f}" for x in m["load_average"])
    return (
        f"{m['cpus']} cores shared with other work (load average {load_average}), {figures['server']}, "
        f"Python {m['python']}, commit {m['commit']}, {m['measured_at'][:10]}"
    )


def colour(name: str) -> str:
    return THREADMILL_COLOUR if name.startswith("threadmill") else PEER_COLOUR


def figure(rows: int, title: str, note: str):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 1.2 + 0.45 * rows), sharey=True, layout="constrained")
    fig.suptitle(title, fontsize=13, fontweight="bold")
    fig.supxlabel(note, fontsize=8, color="#57606a")
    return fig, axes


def label_bars(ax, bars, texts: list[str], right_of: list[float] | None = None) -> None:
    """Write each bar's figure to its right, past `right_of` (a whisker or marker) where given."""
    for index, (bar, text) in enumerate(zip(bars, texts, strict=True)):
        x = max(bar.get_width(), right_of[index]) if right_of else bar.get_width()
        ax.annotate(
            text, (x, bar.get_y() + bar.get_height() / 2), xytext=(6, 0), textcoords="offset points",
            va="center", fontsize=8,
        )  # fmt: skip


def render_drain(figures: dict[str, Any], path: Path) -> Path:
    """Draw tasks per second and CPU per task of every drained queue."""
    queues = {n: e for n, e in figures["queues"].items() if "diagnostic" not in e.get("note", "")}
    names = list(queues)
    y = list(range(len(names)))
    fig, (rate_ax, cpu_ax) = figure(
        len(names),
        f"Drain of echo tasks, results stored (median of {figures['repeats']} interleaved runs)",
        machine_note(figures),
    )
    rates = [queues[n]["tasks_per_s"] for n in names]
    low = [max(0, r - min(x["tasks_per_s"] for x in queues[n]["runs"])) for n, r in zip(names, rates, strict=True)]
    high = [max(0, max(x["tasks_per_s"] for x in queues[n]["runs"]) - r) for n, r in zip(names, rates, strict=True)]
    bars = rate_ax.barh(y, rates, color=[colour(n) for n in names], xerr=[low, high], ecolor="#57606a", capsize=3)
    label_bars(rate_ax, bars, [f"{r:,.0f}" for r in rates], [r + h for r, h in zip(rates, high, strict=True)])
    rate_ax.set_xscale("log")
    rate_ax.set_xlabel("tasks per second (log scale, higher is better; whiskers: slowest and fastest run)")
    rate_ax.set_yticks(y, [f"{n}  ({queues[n]['depth']:,} tasks)" for n in names])
    rate_ax.invert_yaxis()
    height = 0.38
    worker = [queues[n]["cpu_us_per_task"] for n in names]
    # django-tasks-db keeps its tasks in SQLite: the Valkey figure is the idle server, not the queue.
    server = [0 if n.startswith("django-tasks-db") else queues[n]["server_cpu_us_per_task"] for n in names]
    worker_bars = cpu_ax.barh([i - height / 2 for i in y], worker, height, color=[colour(n) for n in names])
    server_bars = cpu_ax.barh([i + height / 2 for i in y], server, height, color=SERVER_COLOUR, label="Valkey")
    label_bars(cpu_ax, worker_bars, [f"{v:,.0f}" for v in worker])
    label_bars(cpu_ax, [b for b, v in zip(server_bars, server, strict=True) if v], [f"{v:,.0f}" for v in server if v])
    cpu_ax.set_xscale("log")
    cpu_ax.set_xlabel("CPU µs per task (log scale, lower is better)")
    cpu_ax.legend(
        handles=[worker_bars[0], server_bars[0]], labels=["worker processes' CPU", "Valkey server's CPU"],
        loc="upper right", fontsize=8,
    )  # fmt: skip
    for ax in (rate_ax, cpu_ax):
        ax.margins(x=0.25)
        ax.grid(axis="x", which="major", alpha=0.3)
    for index, value in enumerate(server):
        if not value:
            cpu_ax.annotate("Valkey: n/a (SQLite)", (cpu_ax.get_xlim()[0], index + height / 2), xytext=(6, 0),
                            textcoords="offset points", va="center", fontsize=8)  # fmt: skip
    fig.savefig(path, dpi=DPI)
    return path


def render_idle(figures: dict[str, Any], path: Path) -> Path:
    """Draw p50, p90 and max idle latency of every queue, and its idle pool's server load."""
    queues, pools = figures["queues"], figures.get("idle_pool", {})
    names = list(queues)
    y = list(range(len(names)))
    fig, (latency_ax, load_ax) = figure(
        len(names),
        f"Idle latency: {figures['samples']} single tasks after 0.3 to 2 s idle, one worker process with one thread",
        machine_note(figures),
    )
    p50 = [queues[n]["p50_ms"] for n in names]
    p90 = [queues[n]["p90_ms"] for n in names]
    worst = [queues[n]["max_ms"] for n in names]
    bars = latency_ax.barh(y, p50, color=[colour(n) for n in names])
    latency_ax.scatter(p90, y, marker="D", color="#24292f", zorder=3, label="p90")
    latency_ax.scatter(worst, y, marker="|", s=200, color="#cf222e", zorder=3, label="max")
    texts = [f"p50 {a:,.1f} · p90 {b:,.1f} · max {c:,.1f}" for a, b, c in zip(p50, p90, worst, strict=True)]
    label_bars(latency_ax, bars, texts, worst)
    latency_ax.set_xscale("log")
    latency_ax.set_xlabel("ms from the enqueue call to the task's first line (log scale, lower is better)")
    latency_ax.set_yticks(y, names)
    latency_ax.invert_yaxis()
    latency_ax.legend(loc="lower right", fontsize=8, title="bar: p50", title_fontsize=8)
    if pools:
        workers = next(iter(pools.values()))["worker_processes"]
        load = [pools.get(n, {}).get("commands_per_s", 0) for n in names]
        load_bars = load_ax.barh(y, load, color=[colour(n) for n in names])
        label_bars(load_ax, load_bars, [f"{v:,.1f}" for v in load])
        load_ax.set_xlabel(f"Valkey commands per second with {workers} idle worker processes (lower is better)")
    latency_ax.set_xlim(right=max(worst) * 300)
    for ax in (latency_ax, load_ax):
        ax.margins(x=0.2)
        ax.grid(axis="x", which="major", alpha=0.3)
    fig.savefig(path, dpi=DPI)
    return path


def render() -> list[Path]:
    """Render every chart whose JSON results exist, and return the paths written."""
    IMAGES_DIR.mkdir(parents=True, exist_ok=True)
    written = []
    for name, draw in (("drain", render_drain), ("idle", render_idle)):
        figures = load(name)
        if figures is None:
            print(f"chart {name} skipped: {RESULTS_DIR / name}.json does not exist yet.")
            continue
        path = draw(figures, IMAGES_DIR / f"bench_{'idle_latency' if name == 'idle' else name}.png")
        print(f"wrote {path}")
        written.append(path)
    return written
