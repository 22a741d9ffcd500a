"""Writing the audit log: one entry per console action."""

from __future__ import annotations

from collections.abc import Sequence

from .models import AuditEntry


def record(
    request,
    action: str,
    alias: str,
    queue_name: str,
    segment: str,
    scope: str,
    count: int,
    task_ids: Sequence[str] = (),
    *,
    forced: bool = False,
) -> AuditEntry:
    """Store who did `action` to how many tasks (and which), now, and whether it was forced."""
    return AuditEntry.objects.create(
        user=request.user,
        username=request.user.get_username(),
        action=action,
        backend=alias,
        queue_name=queue_name,
        segment=segment,
        scope=scope[:200],
        count=count,
        task_ids=list(task_ids)[: AuditEntry.MAX_TASK_IDS],
        forced=forced,
    )
