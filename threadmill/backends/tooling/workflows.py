"""The backend's half of `threadmill.api.workflows`: one workflow read with its graph's edges.

The workflow itself (its record, its tasks, the cancel and the retry) is the backend's
(`backends/workflows.py`); this half adds what a page or a command line shows beside it, each
node's parents, from the graph the record stores.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .host import ToolingHost

if TYPE_CHECKING:
    from ...workflows import WorkflowResult


class WorkflowTooling(ToolingHost):
    """Reading a workflow with its graph, for the tooling API."""

    if TYPE_CHECKING:

        def _graph(self, workflow_id: str) -> list[Any]: ...

        def get_workflow(self, workflow_id: str) -> WorkflowResult: ...

    def workflow_with_parents(self, workflow_id: str) -> tuple[WorkflowResult, dict[str, list[str]]]:
        """Return a workflow's state and each node's parent nodes; raise TaskResultDoesNotExist for an unknown id."""
        parents = {name: list(of) for name, _, of in self._graph(workflow_id)}
        return self.get_workflow(workflow_id), parents
