"""The documentation site builds without a warning and names what the code has, so it cannot drift.

The build is the README's: `python -m sphinx -W --keep-going -b html docs OUT`, into a
temporary folder (a test run writes nothing into the tree), offline. Warnings fail it, which
covers a page left out of every toctree, a broken internal link or anchor, and a missing image.
The build is the `site` fixture of tests/conftest.py, once per session, shared with tests/test_docs_drift.py.
The README is the landing page: short, its intro and quick start the site's own text (included),
its links and pictures pointing at files that exist, and every picture in docs/images shown.
"""

from __future__ import annotations

import dataclasses
import html
import inspect
import re
import sys
from pathlib import Path

import pytest

import threadmill
from threadmill import api, exceptions, retry, testing
from threadmill.backends.options import BackendOptions
from threadmill.cli import SUBCOMMANDS

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
#: The README is a landing page; the guide is the site (issue 31).
README_MAX_LINES = 300
#: A Markdown link or picture: `[text](target)` / `![alt](target)`.
LINK = re.compile(r"(!?)\[[^\]]*\]\(([^)\s]+)\)")
sys.path.insert(0, str(ROOT / "docs" / "_ext"))

from threadmill_docs import command_parser, option_docs


def page_text(site: Path, page: str) -> str:
    text = re.sub(r"<[^>]+>", " ", (site / page).read_text())
    return html.unescape(re.sub(r"\s+", " ", text))


def test_the_settings_reference_names_every_option_field(site):
    text = page_text(site, "reference/settings.html")
    assert [f.name for f in dataclasses.fields(BackendOptions) if f.name not in text] == []


def test_every_option_field_has_a_description_in_the_code():
    documented = option_docs()
    assert [f.name for f in dataclasses.fields(BackendOptions) if not documented.get(f.name)] == []


def test_the_command_line_reference_names_every_subcommand_and_long_option(site):
    text = page_text(site, "reference/cli.html")
    subparsers = next(a for a in command_parser()._actions if a.dest == "subcommand")
    missing = [name for name in SUBCOMMANDS if name not in text]
    for name, parser in subparsers.choices.items():
        for action in parser._actions:
            longs = [o for o in action.option_strings if o.startswith("--") and o != "--help"]
            missing += [f"{name} {o}" for o in longs if o not in text]
    assert missing == []


def test_the_api_reference_names_every_public_name(site):
    text = page_text(site, "reference/api.html")
    names = [*threadmill.__all__, *api.__all__, *testing.__all__]
    names += ["threadmill_server", "threadmill_alias", "threadmill_backend"]  # threadmill.testing.pytest's fixtures
    names += [
        name
        for name, value in vars(exceptions).items()
        if inspect.isclass(value) and value.__module__ == exceptions.__name__
    ]
    names += [
        name
        for name, value in vars(retry).items()
        if not name.startswith("_") and getattr(value, "__module__", None) == retry.__name__
    ]
    assert [name for name in names if name not in text] == []


def words(text: str) -> str:
    """Return the words of `text` in order, whatever Markdown or HTML put around them."""
    return " ".join(re.findall(r"\w+", text))


def between(text: str, name: str) -> str:
    start, end = f"<!-- docs:{name}-start -->", f"<!-- docs:{name}-end -->"
    assert text.count(start) == 1 and text.count(end) == 1, f"the README needs one pair of {name} markers"
    return text.split(start, 1)[1].split(end, 1)[0]


def markdown_targets(path: Path) -> list[tuple[bool, str]]:
    """Return each local link or picture target of a Markdown file: (is a picture, target without #anchor)."""
    found = [(bang == "!", target.split("#", 1)[0]) for bang, target in LINK.findall(path.read_text())]
    return [(image, target) for image, target in found if target and not re.match(r"[a-z]+:", target)]


def test_the_readme_is_a_landing_page_of_at_most_300_lines():
    assert len(README.read_text().splitlines()) <= README_MAX_LINES


@pytest.mark.parametrize(("name", "page"), [("intro", "index.html"), ("quickstart", "tutorial/quick-start.html")])
def test_the_site_shows_the_readme_text_it_includes(site, name, page):
    shared = words(re.sub(r"(?m)^```.*$", "", between(README.read_text(), name)))  # fences and their language
    assert len(shared) > 200
    assert shared in words(page_text(site, page))


def test_the_readme_keeps_the_test_command_ci_runs():
    command = (ROOT / ".ci" / "run").read_text().strip().splitlines()[-1]
    assert command == "bash .ci/bootstrap test && .venv/bin/python -m pytest"
    assert f"\n{command}\n" in between(README.read_text(), "quickstart")


def test_the_readme_links_only_to_files_that_exist():
    assert [t for _, t in markdown_targets(README) if not (ROOT / t).exists()] == []


def test_every_picture_in_docs_images_is_shown_by_the_readme_or_a_page():
    shown = {(ROOT / t).resolve() for image, t in markdown_targets(README) if image}
    for page in DOCS.rglob("*.md"):
        shown |= {(page.parent / t).resolve() for image, t in markdown_targets(page) if image}
    pictures = [p for p in (DOCS / "images").iterdir() if p.suffix != ".json"]  # the screenshots' fingerprints
    assert sorted(p.name for p in pictures if p.resolve() not in shown) == []
