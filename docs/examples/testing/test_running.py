"""(b) Run the tasks for real: Threadmill's backend on an embedded Valkey, and a worker in this process."""

from django.tasks import TaskResultStatus
from signup import charge_card, send_welcome, sign_up

from threadmill.testing import drain


def test_sign_up_sends_a_welcome(threadmill_backend):
    result = sign_up("ada@example.com")

    drained = drain()

    assert [r.id for r in drained.successful] == [result.id]
    assert threadmill_backend.get_result(result.id).return_value == "welcome sent to ada@example.com"


def test_drain_runs_every_queue_and_the_retries(threadmill_backend):
    send_welcome.enqueue("ada@example.com")
    charge_card.enqueue(0)  # fails three times: the first attempt and two retries

    drained = drain(timeout=10)

    assert drained.attempts == 4
    [failed] = drained.failed
    assert failed.status == TaskResultStatus.FAILED and len(failed.errors) == 3
