"""The house plan, checked on the import graph: every import counts, at import time, in a function or for type checkers.

The core's floors, from the ground up: the task's own nouns and pure rules (`GROUND_FLOOR`),
the optional integrations and the embedded server, `backends/`, `worker/` (with `testing/`,
which runs a worker in a test's process), `api/`, then `cli/` and the management command. A
module imports its own floor and the ones below, never one above, and the graph has no cycle. The console (`inspector/`) reaches the core only through
`threadmill.api` and the ground floor; the core never imports the console. Each concern of the
tooling API has its backend half in a module of the same name.
"""

from __future__ import annotations

import ast
from pathlib import Path

import inspector
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


def imports(path: Path, *, at_import_time: bool = False, at_run_time: bool = False) -> set[str]:
    """Return the modules the file at `path` imports; at import time: not in functions, not for type checkers;
    at run time: not for type checkers."""

    def walk(nodes: list[ast.AST]) -> set[str]:
        found: set[str] = set()
        for node in nodes:
            if isinstance(node, ast.Import | ast.ImportFrom):
                found.update(imported(path, node))
            elif at_import_time and isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue  # runs when called, not when imported
            elif (
                (at_import_time or at_run_time)
                and isinstance(node, ast.If)
                and "TYPE_CHECKING" in ast.unparse(node.test)
            ):
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


#: The floor of each part of the core, by the first name under `threadmill`; a module not named is ground floor.
FLOORS = {
    "integrations": 1, "embedded": 1, "backends": 2, "worker": 3, "testing": 3, "api": 4, "cli": 5, "management": 5,
    "apps": 5,
}  # fmt: skip
#: The modules of the ground floor: what a task is, and the pure rules about it.
GROUND_FLOOR = {
    "threadmill",
    "threadmill.aborts",
    "threadmill.attempts",
    "threadmill.base",
    "threadmill.error_reports",
    "threadmill.exceptions",
    "threadmill.exit_codes",
    "threadmill.identity",
    "threadmill.lifeline",
    "threadmill.limits",
    "threadmill.outcome",
    "threadmill.progress",
    "threadmill.redaction",
    "threadmill.running_workflow",
    "threadmill.retry",
    "threadmill.schedules",
    "threadmill.unique",
    # Building a workflow graph and its checks; it reaches the server only through the backend object.
    "threadmill.workflows",
}
#: Longest a module grows before its top must say why it is longer, lines.
MODULE_LINES_LIMIT = 500


def floor_of(module: str) -> int:
    parts = module.split(".")
    return FLOORS.get(parts[1], 0) if len(parts) > 1 else 0


def core_graph() -> dict[str, set[str]]:
    """Return each core module's imports of other core modules, every import counted."""
    modules = {module_name(path): path for path in ROOT.rglob("*.py")}
    return {name: imports(path) & set(modules) - {name} for name, path in modules.items()}


def test_the_ground_floor_is_every_top_level_module():
    top_level = {module_name(path) for path in ROOT.glob("*.py")} - {"threadmill.apps", "threadmill.embedded"}
    assert top_level == GROUND_FLOOR


def test_no_import_runs_back_up_a_floor():
    graph = core_graph()
    upward = [f"{name} -> {dependency}" for name in sorted(graph) for dependency in sorted(graph[name])]
    assert [edge for edge in upward if floor_of(edge.split(" -> ")[1]) > floor_of(edge.split(" -> ")[0])] == []


def test_the_console_reaches_the_core_through_the_tooling_api_and_the_ground_floor():
    console = Path(inspector.__file__).parent
    offenders = []
    for path in console.rglob("*.py"):
        # The runnable site around the console starts the embedded server.
        allowed = GROUND_FLOOR | {"threadmill.api"} | ({"threadmill.embedded"} if "site" in path.parts else set())
        for name in imports(path):
            if name.split(".")[0] == "threadmill" and not any(name == a or name.startswith(a + ".") for a in allowed):
                offenders.append(f"{path.relative_to(console.parent)}: {name}")
    # `from threadmill import api` names `threadmill` too; the ground floor's package is allowed by name only.
    assert [o for o in offenders if not o.endswith(": threadmill")] == []


def test_the_command_line_operates_through_the_tooling_api():
    # The worker subcommand hands its supervisor the backend object that `common.threadmill_backend` returns.
    offenders = []
    for path in (ROOT / "cli").glob("*.py"):
        offenders += [
            f"{path.name}: {name}" for name in imports(path, at_run_time=True) if name.startswith("threadmill.backends")
        ]
    assert offenders == []


def test_a_long_module_says_at_its_top_why_it_is_long():
    roots = [ROOT, Path(inspector.__file__).parent]
    long = [
        path for root in roots for path in root.rglob("*.py") if len(path.read_text().splitlines()) > MODULE_LINES_LIMIT
    ]
    long += [
        path
        for path in (ROOT / "backends" / "lua").rglob("*.lua")
        if len(path.read_text().splitlines()) > MODULE_LINES_LIMIT
    ]
    unexplained = [str(path.name) for path in long if "Longer than 500 lines:" not in path.read_text()[:3000]]
    assert unexplained == []


def test_the_core_library_imports_without_a_cycle():
    graph = core_graph()
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
