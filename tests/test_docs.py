"""The documentation site builds without a warning and names what the code has, so it cannot drift.

The build is the README's: `python -m sphinx -W --keep-going -b html docs OUT`, into a
temporary folder (a test run writes nothing into the tree), offline. Warnings fail it, which
covers a page left out of every toctree, a broken internal link or anchor, and a missing image.
"""

from __future__ import annotations

import dataclasses
import html
import inspect
import re
import subprocess
import sys
from pathlib import Path

import pytest

import threadmill
from threadmill import api, exceptions, retry
from threadmill.backends.options import BackendOptions
from threadmill.cli import SUBCOMMANDS

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "docs" / "_ext"))

from threadmill_docs import command_parser, option_docs


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html", "docs", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return out


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
    names = [*threadmill.__all__, *api.__all__]
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
