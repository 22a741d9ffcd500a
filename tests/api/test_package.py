"""The tooling API's package imports each concern at its first use, and still names every concern and export."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import threadmill.api
from tests.worker.conftest import ROOT, worker_env

#: Runs in a fresh interpreter, so nothing is imported yet: prints what a bare import loaded, then reaches
#: every concern module and every name of `__all__` through the package's attributes.
FRESH = """
import sys, django
django.setup()
import threadmill.api as api
print(sorted(name for name in sys.modules if name.startswith("threadmill.api.")))
for name in [*sys.argv[1:], *api.__all__]:
    getattr(api, name)
print("ok")
"""


def test_a_bare_import_loads_no_concern_and_every_concern_and_export_is_an_attribute():
    concerns = sorted(
        path.stem for path in Path(threadmill.api.__file__).parent.glob("*.py") if path.stem != "__init__"
    )
    command = [sys.executable, "-c", FRESH, *concerns]
    done = subprocess.run(command, cwd=ROOT, env=worker_env(), capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    loaded, last = done.stdout.splitlines()
    assert loaded == "[]"
    assert last == "ok"


def test_the_lazy_names_are_the_names_type_checkers_see():
    # Two lists of one set of names: the imports under TYPE_CHECKING and `_LAZY_NAMES`. A name in one
    # only is either unchecked or an AttributeError at its first use.
    import ast

    tree = ast.parse(Path(threadmill.api.__file__).read_text())
    block = next(node for node in tree.body if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING")
    seen = {
        alias.name: "." * node.level + (node.module or "")
        for node in block.body
        if isinstance(node, ast.ImportFrom) and node.module
        for alias in node.names
    }
    assert seen == threadmill.api._LAZY_NAMES
