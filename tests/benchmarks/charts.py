"""Charts of the drain, remote-drain, fairness and idle-latency comparisons, rendered from the JSON results.

`python -m tests.benchmarks charts` re-renders them without measuring; a run of `drain`,
`remote`, `fairness` or `idle` renders them after measuring. The PNGs go to docs/images/
for the README.
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
#: The remote drain's bars: local, through the forwarder adding nothing, and remote.
MODE_COLOURS = ("#57606a", "#afb8c1", None)
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


def render_remote(figures: dict[str, Any], path: Path) -> Path:
    """Draw each queue's drain rate local, through the bare forwarder and remote, and the shares kept."""
    queues = figures["queues"]
    names = list(queues)
    modes = list(next(iter(queues.values()))["modes"])
    remote = modes[-1]
    y = list(range(len(names)))
    trips = ", ".join(f"{m} {us:,.0f} µs" for m, us in figures["round_trip_us"].items())
    fig, (rate_ax, share_ax) = figure(
        len(names) * 1.6,
        f"Drain of echo tasks with the worker {figures['delay_ms']:g} ms each way from Valkey "
        f"(median of {figures['repeats']} interleaved runs)",
        f"{machine_note(figures)}; PING round trip {trips}",
    )
    height = 0.8 / len(modes)
    for index, mode in enumerate(modes):
        offsets = [i - 0.4 + height * (index + 0.5) for i in y]
        rates = [queues[n]["modes"][mode]["tasks_per_s"] for n in names]
        colours = [MODE_COLOURS[index] or colour(n) for n in names]
        bars = rate_ax.barh(offsets, rates, height, color=colours, label=mode)
        label_bars(rate_ax, bars, [f"{r:,.0f}" for r in rates])
    rate_ax.set_xscale("log")
    fastest = max(e["modes"][m]["tasks_per_s"] for e in queues.values() for m in modes)
    slowest = min(e["modes"][m]["tasks_per_s"] for e in queues.values() for m in modes)
    rate_ax.set_xlim(slowest / 3, fastest * 5)
    rate_ax.set_xlabel("tasks per second (log scale, higher is better)")
    rate_ax.set_yticks(y, [f"{n}  ({queues[n]['depth']:,} tasks)" for n in names])
    rate_ax.invert_yaxis()
    handles, labels = rate_ax.get_legend_handles_labels()
    rate_ax.legend(handles, [f"{m} (the queue's colour)" if m == remote else m for m in labels],
                   loc="lower left", bbox_to_anchor=(0, 1), ncols=3, fontsize=8, frameon=False)  # fmt: skip
    shares = [queues[n]["paired_shares"][f"{remote} / local"] * 100 for n in names]
    bare = [queues[n]["paired_shares"][f"{modes[1]} / local"] * 100 for n in names]
    bars = share_ax.barh(y, shares, 0.5, color=[colour(n) for n in names])
    share_ax.scatter(bare, y, marker="D", color="#24292f", zorder=3, label="through the forwarder adding 0 ms")
    texts = [f"{s:.0f}% remote · {b:.0f}% at 0 ms" for s, b in zip(shares, bare, strict=True)]
    label_bars(share_ax, bars, texts, bare)
    share_ax.axvline(100, color="#57606a", linewidth=0.8)
    share_ax.set_xlim(0, max(100, *bare, *shares) * 1.6)
    share_ax.set_xlabel("share of the local rate kept, paired by repeat (higher is better)")
    share_ax.legend(loc="lower left", bbox_to_anchor=(0, 1), fontsize=8, frameon=False)
    for ax in (rate_ax, share_ax):
        ax.grid(axis="x", which="major", alpha=0.3)
    fig.savefig(path, dpi=DPI)
    return path


def render_fairness(figures: dict[str, Any], path: Path) -> Path:
    """Draw each queue's makespan against the ideal, and how long its priority task waited."""
    queues = figures["queues"]
    names = list(queues)
    y = list(range(len(names)))
    work = figures["workload"]
    fig, (span_ax, delay_ax) = figure(
        len(names),
        f"Fairness: {work['fast']} tasks of {work['fast_s'] * 1e3:g} ms and {work['slow']} of "
        f"{work['slow_s'] * 1e3:g} ms on {figures['processes']} processes x {figures['threads']} thread, then one "
        f"priority task (median of {figures['repeats']})",
        machine_note(figures),
    )
    spans = [queues[n]["makespan_s"] for n in names]
    high = [max(r["makespan_s"] for r in queues[n]["runs"]) for n in names]
    low = [min(r["makespan_s"] for r in queues[n]["runs"]) for n in names]
    bars = span_ax.barh(
        y, spans, color=[colour(n) for n in names], ecolor="#57606a", capsize=3,
        xerr=[[max(0, s - lo) for s, lo in zip(spans, low, strict=True)],
              [max(0, h - s) for s, h in zip(spans, high, strict=True)]],
    )  # fmt: skip
    ratios = [queues[n]["makespan_ratio"] for n in names]
    label_bars(span_ax, bars, [f"{s:.2f} s · {r:.2f}x" for s, r in zip(spans, ratios, strict=True)], high)
    span_ax.axvline(figures["ideal_s"], color="#cf222e", linestyle="--", linewidth=1,
                    label=f"ideal {figures['ideal_s']:.1f} s (total work / {figures['processes']})")  # fmt: skip
    span_ax.set_xlim(0, max(high) * 1.45)
    span_ax.set_xlabel("first start to last finish, s (lower is better; whiskers: every run)")
    span_ax.set_yticks(y, names)
    span_ax.invert_yaxis()
    span_ax.legend(loc="upper right", fontsize=8)
    delays = [max(queues[n]["urgent_delay_ms"], 0.1) for n in names]
    bars = delay_ax.barh(y, delays, color=[colour(n) for n in names])
    label_bars(delay_ax, bars, [f"{d:,.0f} ms" for d in delays])
    delay_ax.axvline(work["slow_s"] * 1e3, color="#cf222e", linestyle="--", linewidth=1,
                     label=f"one slow task ({work['slow_s'] * 1e3:g} ms)")  # fmt: skip
    delay_ax.set_xscale("log")
    delay_ax.set_xlim(right=max(*delays, work["slow_s"] * 1e3) * 8)
    delay_ax.set_xlabel("priority task: enqueue to start, ms (log scale, lower is better)")
    delay_ax.legend(loc="upper right", fontsize=8)
    for ax in (span_ax, delay_ax):
        ax.grid(axis="x", which="major", alpha=0.3)
    fig.savefig(path, dpi=DPI)
    return path


#: Each chart: the results it reads, how it draws them and the file it writes under docs/images/.
CHARTS = (
    ("drain", render_drain, "bench_drain.png"),
    ("remote", render_remote, "bench_remote.png"),
    ("fairness", render_fairness, "bench_fairness.png"),
    ("idle", render_idle, "bench_idle_latency.png"),
)


def render() -> list[Path]:
    """Render every chart whose JSON results exist, and return the paths written."""
    IMAGES_DIR.mkdir(parents=True, exist_ok=True)
    written = []
    for name, draw, file_name in CHARTS:
        figures = load(name)
        if figures is None:
            print(f"chart {name} skipped: {RESULTS_DIR / name}.json does not exist yet.")
            continue
        path = draw(figures, IMAGES_DIR / file_name)
        print(f"wrote {path}")
        written.append(path)
    return written
