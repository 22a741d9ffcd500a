"""Medians, printed tables and the JSON results file shared by the benchmarks."""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

#: Directory the benchmarks write their JSON figures to.
RESULTS_DIR = Path(__file__).parent / "results"


def median(values: list[float]) -> float:
    """Return the median of repeated measurements."""
    return statistics.median(values)


def spread(values: list[float]) -> str:
    """Return `min..max` of repeated measurements, for the printed table."""
    return f"{min(values):.2f}..{max(values):.2f}"


def machine() -> dict[str, Any]:
    """Return what the figures were measured on."""
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], check=False, capture_output=True, text=True
        ).stdout.strip()
    except OSError:
        commit = ""
    return {
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "commit": commit,
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "platform": platform.platform(),
    }


def write_results(name: str, figures: dict[str, Any]) -> Path:
    """Write `figures` with the machine description to results/<name>.json and return its path."""
    RESULTS_DIR.mkdir(exist_ok=True)
    path = RESULTS_DIR / f"{name}.json"
    path.write_text(json.dumps({"benchmark": name, "machine": machine(), **figures}, indent=2) + "\n")
    return path


def print_table(title: str, header: list[str], rows: list[list[Any]]) -> None:
    """Print a plain aligned table."""
    cells = [header] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    print(f"\n{title}")
    for index, row in enumerate(cells):
        print("  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True))))
        if index == 0:
            print("  ".join("-" * w for w in widths))


def enqueue_cost_args(prog: str, description: str | None) -> argparse.Namespace:
    """Parse `--tasks` and `--repeats` for a small enqueue-cost benchmark (fsync, replicas)."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--tasks", type=int, default=5_000, help="tasks per measurement (default 5,000)")
    parser.add_argument("--repeats", type=int, default=3, help="repeats per figure; the median is reported")
    return parser.parse_args()
