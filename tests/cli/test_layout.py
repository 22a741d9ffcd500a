"""A worker or status command that finds a data layout it does not know exits with a one-line error."""

from __future__ import annotations

from tests.cli.test_status import threadmill
from tests.layouts import refusal, stamp_layout
from tests.worker.conftest import run_worker


def test_the_worker_command_refuses_an_unknown_layout_with_a_one_line_error(redis_url):
    stamp_layout(redis_url, "99")
    done = run_worker("--exit-empty")
    assert done.returncode == 1
    assert refusal("99") in done.stderr
    assert "Traceback" not in done.stderr


def test_the_status_command_refuses_an_unknown_layout(redis_url):
    stamp_layout(redis_url, "99")
    done = threadmill("status")
    assert done.returncode == 1
    assert refusal("99") in done.stderr
    assert "Traceback" not in done.stderr
