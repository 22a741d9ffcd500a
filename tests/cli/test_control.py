"""`manage.py threadmill quiet|stop` carried through Redis to a real pool's supervisor."""

from __future__ import annotations

from django.tasks import task_backends

from tests import tasks
from tests.cli.test_status import threadmill
from tests.servers import wait_until_settled
from tests.worker.conftest import wait_until


def _states(backend) -> dict[str, str]:
    return {w["worker"]: w["state"] for w in backend.live_workers()}


def test_a_quiet_worker_takes_no_new_task_and_stays_alive(start_worker):
    backend = task_backends["default"]
    worker = start_worker("-w", "2", "-q", "default")
    names = wait_until(lambda: len(_states(backend)) == 2 and sorted(_states(backend)), "two workers beat")
    quiet, busy = names

    done = threadmill("quiet", quiet)

    assert done.returncode == 0 and f"to quiet: {quiet}" in done.stdout
    wait_until(lambda: _states(backend).get(quiet) == "quiet", "the worker reports quiet")
    results = [tasks.echo.enqueue(i) for i in range(20)]
    wait_until(lambda: all(backend.get_result(r.id).status == "SUCCESSFUL" for r in results), "every task ran")
    assert {backend.get_result(r.id).worker_ids[0] for r in results} == {busy}
    assert _states(backend)[quiet] == "quiet"
    assert worker.process.poll() is None


def test_stop_all_stops_every_process_and_the_pool_exits(start_worker):
    backend = task_backends["default"]
    worker = start_worker("-w", "2", "-q", "default")
    wait_until(lambda: len(_states(backend)) == 2, "two workers beat")

    assert threadmill("stop", "--all").returncode == 0

    assert worker.process.wait(30) == 0
    assert backend.live_workers() == []
    assert "is not replaced" in worker.output


def test_naming_a_worker_that_is_not_live_is_a_one_line_error():
    done = threadmill("stop", "nohost:1")
    assert done.returncode == 1
    assert "No live worker process nohost:1" in done.stderr
    assert "Traceback" not in done.stderr


def test_workers_are_named_by_full_id_or_by_host_and_pid_and_an_older_release_s_name_still_works():
    backend = task_backends["default"]
    for name in ("box:1:aaaaaaaa", "box:2:bbbbbbbb", "box:3:cccccccc", "box:3:dddddddd", "old:5"):
        backend.heartbeat(name, {"type": "worker", "worker": name})

    by_pid = threadmill("quiet", "box:1", "box:2:bbbbbbbb", "old:5")
    by_host = threadmill("stop", "--host", "box")
    ambiguous = threadmill("quiet", "box:3")

    assert by_pid.returncode == 0 and "to quiet: box:1:aaaaaaaa, box:2:bbbbbbbb, old:5." in by_pid.stdout
    assert by_host.returncode == 0 and "Asked 4 worker processes to stop" in by_host.stdout
    assert "old:5" not in by_host.stdout
    assert ambiguous.returncode == 1 and "Several live worker processes are box:3;" in ambiguous.stderr
    assert "Traceback" not in ambiguous.stderr
    assert backend.pending_control()["box:1:aaaaaaaa"]["command"] == "stop"


def test_requeue_orphaned_takes_back_a_dead_workers_task_and_leaves_a_live_one():
    backend = task_backends["default"]
    orphan, live = tasks.echo.enqueue(1), tasks.echo.enqueue(2)
    backend.acquire("default", worker="host:1")
    backend.acquire("default", worker="host:2")
    wait_until_settled(backend)
    seconds, micros = backend.client.time()
    backend.client.zadd(backend.keys.workers(), {"host:1": seconds - 3600, "host:2": seconds + micros / 1e6})

    done = threadmill("requeue-orphaned", "default")

    assert done.returncode == 0 and "default: requeued 1 orphaned tasks." in done.stdout
    assert backend.get_result(orphan.id).status == "READY"
    assert backend.get_result(live.id).status == "RUNNING"


def test_schedules_from_the_command_line_list_pause_resume_and_run_now():
    def run(*args):
        return threadmill("schedules", *args, THREADMILL_TEST_SCHEDULE="1")

    assert "yearly-echo  '0 3 1 1 *'  tests.tasks.echo  enabled" in run().stdout
    assert "Paused schedule 'yearly-echo'." in run("--pause", "yearly-echo").stdout
    assert "paused by" in run().stdout
    assert "Resumed schedule 'yearly-echo'." in run("--resume", "yearly-echo").stdout
    ran = run("--run", "yearly-echo").stdout
    assert "Enqueued a run of schedule 'yearly-echo': task " in ran
    task_id = ran.rstrip(".\n").rsplit(" ", 1)[1]
    assert task_backends["default"].get_result(task_id).args == ["yearly"]
    unknown = run("--run", "nosuch")
    assert unknown.returncode == 1 and "No schedule named 'nosuch'" in unknown.stderr
