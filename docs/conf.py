"""Sphinx configuration of Threadmill's documentation site (MyST Markdown, the furo theme, offline).

Build it with `python -m sphinx -W --keep-going -b html docs OUT` after the README's test set-up;
`tests/test_docs.py` builds it the same way into a temporary folder. Nothing is fetched: no
intersphinx, so the build runs where only package registries are reachable.
"""

import os
import sys
from pathlib import Path

HERE = Path(__file__).parent
sys.path[:0] = [str(HERE.parent), str(HERE / "_ext")]
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "inspector.site.settings")

import django

django.setup()

project = "Threadmill"
author = "The Threadmill developers"
extensions = ["myst_parser", "sphinx.ext.autodoc", "sphinxarg.ext", "threadmill_docs"]
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build"]
myst_heading_anchors = 3
html_theme = "furo"
html_title = "Threadmill"
autodoc_member_order = "bysource"
autodoc_typehints = "description"
# The code's docstrings use `name` for code, as Markdown does; reST would read it as a reference.
default_role = "code"
suppress_warnings = ["myst.header"]
