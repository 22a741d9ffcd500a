"""A worker pool started before its server can be reached waits for it, for a bounded time."""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

from django.tasks import TaskResultStatus

from tests import tasks
from tests.worker.conftest import Worker, run_worker, wait_until, worker_env
from threadmill.backends.redis import RedisTaskBackend
from threadmill.embedded import EmbeddedValkey, free_port


def test_a_worker_started_before_its_server_waits_for_it_and_then_runs_tasks():
    port = free_port()
    url = f"redis://127.0.0.1:{port}/0"
    worker = Worker("-w", "1", "-t", "1", "--wait-for-server", "30", env=worker_env(THREADMILL_TEST_REDIS_URL=url))
    data_dir = Path(tempfile.mkdtemp(prefix="threadmill-late-server-"))
    server = None
    try:
        wait_until(lambda: "Trying again for up to 30 s." in worker.output, "the worker says it waits for the server")
        assert worker.process.poll() is None, worker.output
        server = EmbeddedValkey(data_dir, port, persist=False).start()
        result = RedisTaskBackend("default", {"REDIS_URL": url}).enqueue(tasks.echo, ["late"], {})

        backend = RedisTaskBackend("default", {"REDIS_URL": url})
        wait_until(lambda: backend.get_result(result.id).status == TaskResultStatus.SUCCESSFUL, "the task runs")
        assert worker.stop() == 0, worker.output
    finally:
        worker.close()
        if server is not None:
            server.stop()
        shutil.rmtree(data_dir, ignore_errors=True)


def test_a_worker_whose_server_stays_unreachable_exits_1_with_a_one_line_error_naming_how_long_it_tried():
    url = f"redis://127.0.0.1:{free_port()}/0"
    started = time.monotonic()
    done = run_worker("--wait-for-server", "1", env=worker_env(THREADMILL_TEST_REDIS_URL=url))
    assert done.returncode == 1
    assert "Cannot reach the Redis server" in done.stderr and "(tried for 1 s)." in done.stderr
    assert "Traceback" not in done.stderr
    assert time.monotonic() - started < 30
    with_no_wait = run_worker("--wait-for-server", "0", env=worker_env(THREADMILL_TEST_REDIS_URL=url))
    assert with_no_wait.returncode == 1 and "tried for" not in with_no_wait.stderr
