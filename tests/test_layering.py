"""The core library depends on no console code: the dependency runs from inspector to threadmill only."""

from __future__ import annotations

import ast
from pathlib import Path

import threadmill


def test_the_core_library_never_imports_the_console():
    offenders = []
    for path in Path(threadmill.__file__).parent.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            offenders += [f"{path.name}: {name}" for name in names if name.split(".")[0] == "inspector"]
    assert offenders == []
