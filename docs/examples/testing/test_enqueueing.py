"""(a) Test the code that enqueues, with Django's own test backends: nothing runs a server."""

from django.tasks import TaskResultStatus, task_backends
from django.test import override_settings
from signup import charge_card, send_welcome, sign_up

QUEUES = ["default", "emails"]
DUMMY = {"default": {"BACKEND": "django.tasks.backends.dummy.DummyBackend", "QUEUES": QUEUES}}
IMMEDIATE = {"default": {"BACKEND": "django.tasks.backends.immediate.ImmediateBackend", "QUEUES": QUEUES}}


@override_settings(TASKS=DUMMY)
def test_sign_up_enqueues_a_welcome():
    result = sign_up("ada@example.com")

    stored = task_backends["default"].results  # DummyBackend keeps what was enqueued, and runs nothing
    assert [(r.task.name, r.args) for r in stored] == [("send_welcome", ["ada@example.com"])]
    assert result.status == TaskResultStatus.READY


@override_settings(TASKS=IMMEDIATE)
def test_the_welcome_runs_at_enqueue():
    result = send_welcome.enqueue("ada@example.com")  # ImmediateBackend runs it here, on this thread

    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == "welcome sent to ada@example.com"


@override_settings(TASKS=IMMEDIATE)
def test_a_failure_is_recorded_not_raised_and_not_retried():
    result = charge_card.enqueue(0)

    assert result.status == TaskResultStatus.FAILED
    assert len(result.errors) == 1  # Threadmill's retry policy is not ImmediateBackend's
