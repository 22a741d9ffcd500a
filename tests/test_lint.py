"""ruff finds nothing and formats nothing differently, with the rules and version `pyproject.toml` pins.

Both run in a subprocess with their cache in a temporary directory, so a test run writes
nothing into the repository.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CHECKED = ["threadmill", "inspector", "tests", "docs", "manage.py"]


def _ruff(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "ruff", *args, "--cache-dir", str(tmp_path), *CHECKED]
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=120)


def test_ruff_check_finds_nothing(tmp_path: Path) -> None:
    run = _ruff(tmp_path, "check", "--output-format", "concise")
    assert run.returncode == 0, (
        f"ruff check found problems (`.venv/bin/ruff check --fix` fixes some):\n{run.stdout}{run.stderr}"
    )


def test_ruff_format_would_change_nothing(tmp_path: Path) -> None:
    run = _ruff(tmp_path, "format", "--check")
    assert run.returncode == 0, (
        f"ruff format would reformat (`.venv/bin/ruff format` does it):\n{run.stdout}{run.stderr}"
    )
