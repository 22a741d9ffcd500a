"""The layers' dependencies: the console on the core, never back; the tooling API on the backend, never back.

Within the core, modules import one another without a cycle (imports for type checkers
aside), and each concern of the tooling API has its backend half in a module of the same name.
"""

from __future__ import annotations

import ast
from pathlib import Path

import threadmill

ROOT = Path(threadmill.__file__).parent


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(path: Path, node: ast.Import | ast.ImportFrom) -> list[str]:
    """Return the absolute names an import statement of the file at `path` imports, relative ones resolved."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
    module = (base + "." + node.module if node.module else base) if node.level else node.module or ""
    return [module] + [f"{module}.{alias.name}" for alias in node.names]


def imports(path: Path, *, at_import_time: bool = False) -> set[str]:
    """Return the modules the file at `path` imports; at import time: not in functions, not for type checkers."""

    def walk(nodes: list[ast.AST]) -> set[str]:
        found: set[str] = set()
        for node in nodes:
            if isinstance(node, ast.Import | ast.ImportFrom):
                found.update(imported(path, node))
            elif at_import_time and isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue  # runs when called, not when imported
            elif at_import_time and isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                found |= walk(node.orelse)
            else:
                found |= walk(list(ast.iter_child_nodes(node)))
        return found

    return walk(ast.parse(path.read_text(), str(path)).body)


def test_the_core_library_never_imports_the_console():
    offenders = []
    for path in ROOT.rglob("*.py"):
        offenders += [f"{path.name}: {name}" for name in imports(path) if name.split(".")[0] == "inspector"]
    assert offenders == []


def test_the_backend_never_imports_the_tooling_api():
    offenders = []
    for path in (ROOT / "backends").rglob("*.py"):
        offenders += [f"{module_name(path)}: {name}" for name in imports(path) if name.startswith("threadmill.api")]
    assert offenders == []


def test_the_core_library_imports_without_a_cycle():
    modules = {module_name(path): path for path in ROOT.rglob("*.py")}
    graph = {name: imports(path, at_import_time=True) & set(modules) - {name} for name, path in modules.items()}
    done: set[str] = set()

    def cycle_from(name: str, trail: list[str]) -> list[str]:
        if name in trail:
            return trail[trail.index(name) :] + [name]
        if name in done:
            return []
        for dependency in sorted(graph[name]):
            if found := cycle_from(dependency, [*trail, name]):
                return found
        done.add(name)
        return []

    assert [found for name in sorted(graph) if (found := cycle_from(name, []))] == []


def test_each_concern_of_the_tooling_api_has_its_backend_half_of_the_same_name():
    api = {path.stem for path in (ROOT / "api").glob("*.py")} - {"__init__"}
    backend = {path.stem for path in (ROOT / "backends" / "tooling").glob("*.py")} - {"__init__", "host"}
    assert api == backend


def imports_outside_type_checking(path: Path) -> set[str]:
    """Return the modules the file at `path` imports anywhere but in an `if TYPE_CHECKING:` block."""

    def walk(nodes: list[ast.AST]) -> set[str]:
        found: set[str] = set()
        for node in nodes:
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                found |= walk(node.orelse)
            elif isinstance(node, ast.Import | ast.ImportFrom):
                found.update(imported(path, node))
            else:
                found |= walk(list(ast.iter_child_nodes(node)))
        return found

    return walk(ast.parse(path.read_text(), str(path)).body)


def test_the_broker_reads_the_backend_only_for_type_checkers_and_the_backend_never_imports_it():
    broker = ROOT / "backends" / "broker"
    offenders = []
    for path in (ROOT / "backends").rglob("*.py"):
        if broker in path.parents:
            names = {
                name for name in imports_outside_type_checking(path) if name.startswith("threadmill.backends.redis")
            }
        else:
            names = {name for name in imports(path) if name.startswith("threadmill.backends.broker")}
        offenders += [f"{module_name(path)}: {name}" for name in sorted(names)]
    assert offenders == []
