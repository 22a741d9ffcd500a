"""Threadmill: a Redis or Valkey backend and worker pool for Django's tasks."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .aborts import aborting
from .progress import TaskProgress, set_metadata, set_progress

if TYPE_CHECKING:
    from .running_workflow import RunningWorkflow

__all__ = ["TaskProgress", "aborting", "acurrent_workflow", "current_workflow", "set_metadata", "set_progress"]


def current_workflow() -> RunningWorkflow | None:
    """Return the workflow of the running task (`threadmill.running_workflow`), None outside a workflow task."""
    # Imported here: the workflow modules pull in django.tasks, about 240 ms a bare `import threadmill` skips.
    from .running_workflow import current_workflow

    return current_workflow()


async def acurrent_workflow() -> RunningWorkflow | None:
    """`current_workflow` from an `async def` task, its first reads in a thread."""
    from .running_workflow import acurrent_workflow

    return await acurrent_workflow()
