"""`manage.py threadmill workflow show|cancel|retry ID`: one workflow's state, or cancel or retry the whole of it.

`show` prints the counts per state, the status and a table of the nodes (`--json`: one stable
document, `threadmill.api.workflows.WorkflowDetail.as_json`). `cancel` cancels every task that
has not run and asks each running one to abort; `retry` runs the failed tasks again, and those
failed because of them. An unknown id is a one-line error naming it (exit 1).
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.tasks.exceptions import TaskResultDoesNotExist

from ..api import default_canceller
from ..api import workflows as api
from ..exit_codes import EXIT_OK
from .common import add_backend_argument, text_table, threadmill_backend

HELP = "Show a workflow's tasks and counts, or cancel or retry a whole workflow, by its id."

#: The states `show` counts, in the order it prints them.
COUNTED = ("WAITING", "READY", "RUNNING", "SUCCESSFUL", "FAILED")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "action",
        choices=("show", "cancel", "retry"),
        help="show: counts, status and each task; cancel: every task not final; retry: the failed tasks.",
    )
    parser.add_argument("workflow_id", metavar="ID", help="The workflow's id (WorkflowResult.id).")
    add_backend_argument(parser)
    parser.add_argument("--json", action="store_true", help="show: print one JSON document instead of a table.")


def handle(command: BaseCommand, options: dict[str, Any]) -> int:
    alias, workflow_id = threadmill_backend(options["backend"]).alias, options["workflow_id"]
    try:
        if options["action"] == "cancel":
            count = api.cancel_workflow(alias, workflow_id, by=f"{default_canceller()} (command line)")
            command.stdout.write(f"Workflow {workflow_id}: {count} tasks cancelled or asked to abort.")
        elif options["action"] == "retry":
            count = api.retry_workflow(alias, workflow_id)
            command.stdout.write(f"Workflow {workflow_id}: {count} tasks made ready or waiting again.")
        elif options["json"]:
            command.stdout.write(json.dumps(api.workflow_detail(alias, workflow_id).as_json(), indent=2))
        else:
            command.stdout.write(render(api.workflow_detail(alias, workflow_id)))
    except TaskResultDoesNotExist:
        raise CommandError(f"No workflow with id {workflow_id!r} is stored on backend {alias!r}.") from None
    return EXIT_OK


def render(detail: api.WorkflowDetail) -> str:
    """Return a workflow as a head line, its counts per state and a table of its nodes."""
    name = f" {detail.name!r}" if detail.name else ""
    counts = "  ".join(f"{state.lower()} {detail.counts.get(state, 0)}" for state in COUNTED)
    rows: list[list[Any]] = [["node", "state", "queue", "task id", "after", "error"]]
    for node in detail.nodes:
        error = node.error.rpartition(".")[2]
        rows.append([node.name, node.state, node.queue_name, node.task_id, ",".join(node.parents) or "-", error or "-"])
    return f"Workflow {detail.id}{name}: {detail.status}\n{counts}\n\n{text_table(rows)}"
