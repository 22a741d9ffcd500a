"""The console's audit log: who did what to which tasks, stored in the site's database."""

from django.conf import settings
from django.db import models


class AuditEntry(models.Model):
    """One console action: requeue, delete, purge or cancel with the tasks it touched, or an operator control.

    Controls touch no task: pausing or resuming a queue (or a schedule: `scope` names it), setting or
    clearing a queue's limits (`scope` says what was set and the limits in force after),
    quieting or stopping a worker process (`scope` names it) and running a schedule now
    (`task_ids` holds the task it enqueued). A workflow's cancel or retry names it in `scope`
    ("workflow <id>"), with no queue, and counts the tasks it cancelled or made run again.
    """

    class Action(models.TextChoices):
        REQUEUE = "requeue", "Requeue"
        DELETE = "delete", "Delete"
        PURGE = "purge", "Purge"
        PAUSE = "pause", "Pause"
        RESUME = "resume", "Resume"
        QUIET = "quiet", "Quiet"
        STOP = "stop", "Stop"
        RUN_NOW = "run_now", "Run now"
        CANCEL = "cancel", "Cancel"
        LIMIT = "limit", "Limit"
        RETRY = "retry", "Retry"

    #: Most task ids an entry keeps; a purge of a million tasks records the count only.
    MAX_TASK_IDS = 1000

    at = models.DateTimeField(auto_now_add=True, db_index=True)
    user = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    username = models.CharField(max_length=150)
    action = models.CharField(max_length=16, choices=Action.choices)
    backend = models.CharField(max_length=100)
    queue_name = models.CharField(max_length=200)
    segment = models.CharField(max_length=16, blank=True)
    scope = models.CharField(
        max_length=200, blank=True, help_text="What was selected: ids, a filtered view, a segment."
    )
    count = models.PositiveIntegerField()
    task_ids = models.JSONField(default=list, blank=True)
    forced = models.BooleanField(
        default=False, help_text="A requeue forced over running tasks whose workers were alive: they may run twice."
    )

    class Meta:
        ordering = ("-at", "-id")
        verbose_name_plural = "audit entries"
        permissions = (
            (
                "change_queue",
                "Can act in the Threadmill console: requeue, delete, purge, pause, set limits, quiet, stop, run schedules",
            ),
        )

    def __str__(self) -> str:
        return f"{self.username} {self.action} {self.count} on {self.backend}/{self.queue_name}/{self.segment}"
