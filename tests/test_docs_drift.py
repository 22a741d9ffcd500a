"""Nothing can drift: what the code reads, counts and shows is what the docs say (issue 31).

Each test reads the code's side from the code itself (its syntax tree, the real metrics
collector against the session's Valkey, the templates) and the docs' side from the built site
(the `site` fixture of tests/conftest.py, built once per session) or the docs' sources:
the settings and environment variables the packages read, the metric families the collector
yields, every internal link and anchor of the built pages, every page reachable from the index,
no message pointing at the README for what moved to the site, and screenshots remade when the
templates or stylesheet their pages are drawn from change.
"""

from __future__ import annotations

import ast
import html
import re
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

from tests.benchmarks.charts import CHARTS
from tests.inspector import screenshots

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PACKAGES = (ROOT / "threadmill", ROOT / "inspector")
#: The console's own files besides its Python: what it shows a user comes from these too.
CONSOLE_FILES = (ROOT / "templates", ROOT / "static")
#: A Django setting of our own (Django's own settings are Django's to document).
OWN_SETTING = re.compile(r"THREADMILL_\w+")
#: Names read but documented nowhere on purpose, by prefix, with the reason.
UNDOCUMENTED = {
    "THREADMILL_TEST_": "the test suite's own switches (tests/settings.py), never read by a deployment",
}
#: Names the packages are known to read: the scan must find at least these, or it is broken.
KNOWN_READS = {
    "REDIS_URL",
    "THREADMILL_ADMIN_PASSWORD",
    "THREADMILL_ADMIN_USER",
    "THREADMILL_DB",
    "THREADMILL_HOME",
    "THREADMILL_DEMO_WORKLOAD",
    "THREADMILL_METRICS_TOKEN",
}
#: A pointer at the README; the guide is the site now.
README_REFERENCE = re.compile(r"\bREADME\b", re.IGNORECASE)
#: Files that may still name the README, with the reason (none need to today).
README_ALLOWED: dict[str, str] = {}
#: A documented metric name (a counter with its `_total`, a histogram by its family name).
METRIC_NAME = re.compile(r"\bthreadmill_[a-z0-9_]+\b")


def python_files() -> Iterator[Path]:
    for package in PACKAGES:
        yield from sorted(package.rglob("*.py"))


def _is_environ(node: ast.expr) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == "environ") or (
        isinstance(node, ast.Name) and node.id == "environ"
    )


def _is_settings(node: ast.expr) -> bool:
    return isinstance(node, ast.Name) and node.id == "settings"


def _name(node: ast.expr) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _read(node: ast.AST) -> tuple[str, ast.expr] | None:
    """Return (what is read: environment or setting, the name's expression) when `node` reads one."""
    if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) and _is_environ(node.value):
        return "environment", node.slice
    if (
        isinstance(node, ast.Compare)
        and isinstance(node.ops[0], ast.In | ast.NotIn)
        and _is_environ(node.comparators[0])
    ):
        return "environment", node.left
    if not isinstance(node, ast.Call) or not node.args:
        return None
    func = node.func
    if isinstance(func, ast.Attribute) and func.attr == "get" and _is_environ(func.value):
        return "environment", node.args[0]
    if (isinstance(func, ast.Attribute) and func.attr == "getenv") or (
        isinstance(func, ast.Name) and func.id == "getenv"
    ):
        return "environment", node.args[0]
    if isinstance(func, ast.Name) and func.id == "getattr" and len(node.args) > 1 and _is_settings(node.args[0]):
        return "setting", node.args[1]
    return None


def reads(path: Path) -> Iterator[tuple[str, str | None, int]]:
    """Yield each environment variable and setting `path` reads: (kind, name or None when computed, line)."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load) and _is_settings(node.value):
            yield "setting", node.attr, node.lineno
        elif found := _read(node):
            kind, name = found
            yield kind, _name(name), node.lineno


def code_reads() -> dict[str, list[str]]:
    """Every environment variable, and every setting of our own, the packages read: name -> where."""
    found: dict[str, list[str]] = {}
    for path in python_files():
        for kind, name, line in reads(path):
            where = f"{path.relative_to(ROOT)}:{line}"
            if name is None:
                found.setdefault(f"a computed {kind} name", []).append(where)
            elif kind == "environment" or OWN_SETTING.fullmatch(name):
                found.setdefault(name, []).append(where)
    return found


class _Page(HTMLParser):
    """The ids of a built page, and the local targets of its links (`href`, `src`) and of its article's."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.ids: set[str] = set()
        self.targets: list[str] = []
        self.article_links: list[str] = []
        self._in_article = False  # inside furo's <article id="furo-main-content">: the page's own text
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        if found.get("id"):
            self.ids.add(str(found["id"]))
        if tag == "article" and found.get("id") == "furo-main-content":
            self._in_article = True
        for attribute in ("href", "src"):
            target = found.get(attribute)
            if target is not None and not (urlsplit(target).scheme or target.startswith("//")):
                self.targets.append(target)
                if tag == "a" and self._in_article:
                    self.article_links.append(target)

    def handle_endtag(self, tag: str) -> None:
        if tag == "article":
            self._in_article = False


@pytest.fixture(scope="module")
def pages(site: Path) -> dict[Path, _Page]:
    return {path: _Page(path.read_text()) for path in sorted(site.rglob("*.html"))}


def resolve(page: Path, target: str) -> tuple[Path, str]:
    """Return the file and the fragment a local link of `page` points at."""
    parts = urlsplit(target)
    return ((page.parent / unquote(parts.path)).resolve() if parts.path else page), unquote(parts.fragment)


def text_of(path: Path) -> str:
    return html.unescape(re.sub(r"<[^>]+>", " ", path.read_text()))


@pytest.fixture(scope="module")
def reads_of_the_code() -> dict[str, list[str]]:
    return code_reads()


def test_the_scan_finds_the_reads_the_packages_are_known_to_make(reads_of_the_code):
    assert KNOWN_READS - set(reads_of_the_code) == set()


def test_every_setting_and_environment_variable_the_code_reads_is_in_the_settings_reference(
    site, pages, reads_of_the_code
):
    settings_page = (site / "reference" / "settings.html").resolve()
    linked = {resolve(settings_page, t)[0] for t in pages[settings_page].article_links}
    text = " ".join(text_of(p) for p in {settings_page, *linked} if p.suffix == ".html")
    missing = {
        name: where
        for name, where in reads_of_the_code.items()
        if not name.startswith(tuple(UNDOCUMENTED)) and not re.search(rf"\b{re.escape(name)}\b", text)
    }
    assert missing == {}, "document these in docs/reference/settings.md (or a page it links to)"


def collected_names() -> dict[str, int]:
    """Run the real collector: each family's exposed name (a counter's with `_total`) -> its samples."""
    from threadmill.api.metrics import ThreadmillCollector

    return {
        family.name + ("_total" if family.type == "counter" else ""): len(family.samples)
        for family in ThreadmillCollector().collect()
    }


def test_the_metrics_reference_names_exactly_the_families_the_collector_yields():
    from django.tasks import task_backends

    from tests.tasks import add

    backend = task_backends["default"]
    add.enqueue(1, 2)
    # What a worker stores as it runs: its heartbeat and its task paths' counts.
    document = {"worker": "box:7", "threads": 4, "busy_threads": 1, "cpu_percent": 3.5, "rss_bytes": 10_000_000}
    backend.heartbeat("box:7", document, publish=False)
    backend.record_task_stats({"default": {add.module_path: {"runs": 1, "successful": 1, "run_us": 900, "run_b2": 1}}})
    collected = collected_names()
    assert [name for name, samples in collected.items() if not samples] == []  # every family was produced
    documented = set(METRIC_NAME.findall((DOCS / "reference" / "metrics.md").read_text()))
    assert {"missing from the page": set(collected) - documented, "not collected": documented - set(collected)} == {
        "missing from the page": set(),
        "not collected": set(),
    }


def test_every_local_link_and_anchor_of_the_built_site_resolves(site, pages):
    broken = []
    for page, parsed in pages.items():
        for target in parsed.targets:
            path, fragment = resolve(page, target)
            if not path.exists() or (fragment and path.suffix == ".html" and fragment not in pages[path].ids):
                broken.append(f"{page.relative_to(site)}: {target}")
    assert broken == []


def toctree_entries(page: Path) -> list[Path]:
    """Return the pages a source page's toctrees list."""
    entries = []
    for block in re.findall(r"(?ms)^```\{toctree\}\n(.*?)^```", page.read_text()):
        for line in block.splitlines():
            line = line.strip()
            if line and not line.startswith(":"):
                target = re.sub(r"^.*<(.+)>$", r"\1", line)  # `Title <path>`
                entries.append((DOCS / target).with_suffix(".md") if "/" in target else page.parent / f"{target}.md")
    return entries


def test_every_page_is_reachable_from_the_index_toctree():
    reached, todo = set(), [DOCS / "index.md"]
    while todo:
        page = todo.pop()
        if page not in reached:
            reached.add(page)
            todo += toctree_entries(page)
    assert sorted(str(p.relative_to(DOCS)) for p in set(DOCS.rglob("*.md")) - reached) == []
    assert sorted(str(p.relative_to(DOCS)) for p in reached if not p.exists()) == []


def console_and_package_files() -> Iterator[Path]:
    yield from python_files()
    for folder in CONSOLE_FILES:
        yield from sorted(p for p in folder.rglob("*") if p.suffix in {".html", ".js", ".css", ".txt"})


def test_no_message_or_docstring_sends_users_to_the_readme():
    found = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in console_and_package_files()
        if str(path.relative_to(ROOT)) not in README_ALLOWED
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if README_REFERENCE.search(line)
    ]
    assert found == [], "point these at the docs page (docs/...) that has the text now"


def test_every_picture_in_docs_images_is_a_known_screenshot_or_benchmark_chart():
    pictures = {p.name for p in (DOCS / "images").glob("*.png")}
    known = {f"{name}.png" for name in screenshots.PAGES} | {file_name for _, _, file_name in CHARTS}
    assert {"unknown": pictures - known, "missing": known - pictures} == {"unknown": set(), "missing": set()}


def test_every_screenshot_was_made_from_the_templates_and_css_as_they_are():
    saved = screenshots.recorded(DOCS / "images")
    stale = [
        f"docs/images/{name}.png ({', '.join(str(p.relative_to(ROOT)) for p in screenshots.made_from(name))})"
        for name in screenshots.PAGES
        if saved.get(f"{name}.png") != screenshots.fingerprint(name)
    ]
    assert not stale, f"Remake the screenshots with `{screenshots.COMMAND}`; changed since:\n" + "\n".join(stale)


def test_the_development_guide_gives_the_screenshot_command_and_it_runs_every_test_that_shoots():
    guide = re.sub(r"\s*\\\n\s*", " ", (DOCS / "how-to" / "development.md").read_text())
    assert f"\n{screenshots.COMMAND}\n" in guide
    shooting = {
        str(path.relative_to(ROOT))
        for path in sorted((ROOT / "tests" / "inspector").glob("test_browser*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "shot"
    }
    assert shooting == set(re.findall(r"tests/\S+\.py", screenshots.COMMAND))
