"""Integrations benchmark: the drain with OpenTelemetry and Sentry absent, installed, and set up.

Each row is the drain benchmark's one-process, one-thread echo drain, its repeats interleaved
with the others' and its ratios paired with the "without" row of the same repeat:

- without: `opentelemetry` and `sentry_sdk` shadowed (PYTHONPATH) by packages whose import
  fails, for the filler and the worker: exactly what the import guards see when not installed;
- opentelemetry-api installed: the API importable, no SDK set up, so every span is a no-op;
- opentelemetry SDK: every span sampled, batched to an exporter that drops them;
- sentry-sdk: initialised with a transport that drops everything, errors only;
- sentry-sdk, every run traced: the same with `traces_sample_rate` 1, a transaction per task.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

from . import report
from .drain import Context, QueueUnderTest, add_paired_ratios, drain_interleaved, summarise, threadmill_queue
from .server import valkey

#: The row the others are paired with.
BASELINE = "without"
#: Each row: its name, the packages shadowed, the tool set up (BENCH_INTEGRATION).
ROWS = (
    (BASELINE, ("opentelemetry", "sentry_sdk"), ""),
    ("opentelemetry-api installed", ("sentry_sdk",), ""),
    ("opentelemetry SDK", ("sentry_sdk",), "otel-sdk"),
    ("sentry-sdk", ("opentelemetry",), "sentry"),
    ("sentry-sdk, every run traced", ("opentelemetry",), "sentry-traced"),
)


def shadowing(scratch: Path, packages: tuple[str, ...]) -> str:
    """Return a directory whose packages named `packages` fail to import, for PYTHONPATH."""
    where = scratch / f"shadow-{'-'.join(packages)}"
    for name in packages:
        (where / name).mkdir(parents=True, exist_ok=True)
        (where / name / "__init__.py").write_text(f'raise ImportError("{name} is shadowed by the benchmark")\n')
    return str(where)


def queues(scratch: Path, depth: int) -> list[QueueUnderTest]:
    rows = []
    for name, shadowed, integration in ROWS:
        env = {"PYTHONPATH": shadowing(scratch, shadowed), "BENCH_INTEGRATION": integration}
        row = threadmill_queue(name, [], "default prefetch", depth, extra_env=env)
        rows.append(replace(row, settings="tests.benchmarks.integration_settings"))
    return rows


def run(depth: int = 20_000, repeats: int = 5) -> dict[str, Any]:
    """Drain every row `repeats` times, interleaved, and print and write the medians and paired ratios."""
    scratch = Path(tempfile.mkdtemp(prefix="threadmill-integrations-"))
    rows = queues(scratch, depth)
    runs: dict[str, list[dict[str, float]]] = {q.name: [] for q in rows}
    with valkey() as server:
        drain_interleaved(Context(server, scratch), rows, repeats, runs)
    shutil.rmtree(scratch, ignore_errors=True)
    results = add_paired_ratios({q.name: summarise(q, runs[q.name]) for q in rows}, baseline=BASELINE)
    figures = {"repeats": repeats, "queues": results}
    report.print_table(
        f"drain with and without the integrations, 1 process x 1 thread, echo task (median of {repeats})",
        ["row", "tasks/s", "worker us CPU/task", "server us CPU/task", "tasks/s vs without (paired)",
         "CPU vs without (paired)"],
        [[name, f"{e['tasks_per_s']:,.0f}", f"{e['cpu_us_per_task']:.1f}", f"{e['server_cpu_us_per_task']:.1f}",
          f"{e['paired_tasks_per_s_ratio']:.3f}x", f"{e['paired_cpu_ratio']:.3f}x"] for name, e in results.items()],
    )  # fmt: skip
    print(f"\nwrote {report.write_results('integrations', figures)}")
    return figures
