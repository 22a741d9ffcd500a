"""What each console screenshot in docs/images is drawn from, and the fingerprint saved beside it.

The screenshot command (`COMMAND`, the one docs/how-to/development.md gives) runs the browser
tests with THREADMILL_SCREENSHOTS set; each picture they save records, in `FINGERPRINTS` in the
same folder, the sha256 of the templates and stylesheets its page is drawn from.
tests/test_docs_drift.py compares the recorded fingerprints with the files as they are, so a page
whose template or CSS changed fails until its picture is remade. Python that changes a page
(a view, a table, a template tag) is not covered: remake the pictures for that by hand.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TEMPLATES = ROOT / "templates"
#: The console's stylesheets: every page loads them.
STYLES = ROOT / "static" / "inspector"
#: The file, beside the pictures, that holds each one's fingerprint.
FINGERPRINTS = "screenshots.json"
#: The command that remakes every screenshot (and its fingerprint) under docs/images.
COMMAND = (
    "THREADMILL_SCREENSHOTS=docs/images .venv/bin/python -m pytest tests/inspector/test_browser.py"
    " tests/inspector/test_browser_task_paths.py tests/inspector/test_browser_phone.py"
    " tests/inspector/test_browser_workflows.py"
)
_QUEUES = ("inspector/queue_list.html",)
_SEGMENT = ("inspector/task_list.html", "inspector/tasks_table.html")
_TASK = ("inspector/task_detail.html",)
_WORKERS = ("inspector/worker_list.html",)
#: Each screenshot's page templates, by picture name (what they extend or include is added).
PAGES: dict[str, tuple[str, ...]] = {
    "action_confirm": ("inspector/action_confirm.html",),
    "audit_list": ("inspector/audit_list.html",),
    "error": ("inspector/error.html",),
    "purge_confirm": ("inspector/purge_confirm.html",),
    "queue_list": _QUEUES,
    "queue_list_dark": _QUEUES,
    "queue_list_paused": _QUEUES,
    "schedule_list": ("inspector/schedule_list.html",),
    "task_detail": _TASK,
    "task_detail_unreadable": _TASK,
    "task_list": _SEGMENT,
    "task_list_orphaned": _SEGMENT,
    "task_list_search": _SEGMENT,
    "task_paths": ("inspector/task_paths.html",),
    "worker_list": _WORKERS,
    "workflow_detail": ("inspector/workflow_detail.html",),
    "workflow_list": ("inspector/workflow_list.html",),
    "worker_list_quiet": _WORKERS,
    "phone_overview": _QUEUES,
    "phone_overview_dark": _QUEUES,
    "phone_segment-failed": _SEGMENT,
    "phone_task-failed": _TASK,
    "phone_workers": _WORKERS,
}
#: `{% extends "x" %}` or `{% include "x" ... %}`: a template a template draws on.
_USES = re.compile(r"""{%\s*(?:extends|include)\s+["']([^"']+)["']""")


def made_from(name: str) -> list[Path]:
    """Return the files screenshot `name` is drawn from: its templates, those they use, and the stylesheets."""
    if name not in PAGES:
        raise KeyError(f"The screenshot {name!r} has no entry in PAGES of {__name__}: name its page templates there.")
    seen: set[str] = set()
    todo = list(PAGES[name])
    while todo:
        template = todo.pop()
        if template not in seen:
            seen.add(template)
            todo += _USES.findall((TEMPLATES / template).read_text())
    return sorted(TEMPLATES / t for t in seen) + sorted(STYLES.rglob("*.css"))


def fingerprint(name: str) -> str:
    """Return the sha256 of the files screenshot `name` is drawn from, their paths and contents."""
    digest = hashlib.sha256()
    for path in made_from(name):
        digest.update(path.relative_to(ROOT).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def recorded(images: Path) -> dict[str, str]:
    """Return the fingerprints saved in `images`, by picture file name."""
    path = images / FINGERPRINTS
    return json.loads(path.read_text()) if path.exists() else {}


def record(images: Path, name: str) -> None:
    """Save the fingerprint of screenshot `name`, just taken into `images`, beside it."""
    fingerprints = recorded(images) | {f"{name}.png": fingerprint(name)}
    (images / FINGERPRINTS).write_text(json.dumps(dict(sorted(fingerprints.items())), indent=2) + "\n")
