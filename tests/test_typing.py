"""The type checker finds nothing in `threadmill/` and `inspector/` at the strictness `pyproject.toml` sets.

mypy runs in a subprocess with the settings of `[tool.mypy]` and its cache in a temporary
directory, so a test run writes nothing into the repository (a cold run takes about 10 s).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_mypy_finds_no_errors_in_either_package(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "mypy", "--config-file", "pyproject.toml", "--cache-dir", str(tmp_path)]
    run = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=120)
    report = run.stdout + run.stderr
    assert run.returncode == 0, f"mypy found errors (`.venv/bin/python -m mypy` lists them too):\n{report}"
    assert "Success: no issues found" in report
