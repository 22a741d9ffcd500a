"""Worker names: a process incarnation, never only a host and a pid, and both forms read back."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from tests.worker.conftest import ROOT, worker_env
from threadmill.identity import WorkerName

#: Prints the name the backend leases under, and the pid, of a process that is pid 1 of its namespace.
NAME_AND_PID = "import os; from threadmill.backends.redis import default_worker_name as n; print(n(), os.getpid())"


def _in_a_fresh_pid_namespace() -> tuple[str, str]:
    command = ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", NAME_AND_PID]
    done = subprocess.run(command, cwd=ROOT, env=worker_env(), capture_output=True, text=True, timeout=60, check=True)
    name, pid = done.stdout.split()
    return name, pid


def test_two_processes_with_the_same_pid_get_different_names():
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.fail("This test starts processes in PID namespaces of their own: run it as root, with unshare.")
    (first, first_pid), (second, second_pid) = _in_a_fresh_pid_namespace(), _in_a_fresh_pid_namespace()
    assert first_pid == second_pid == "1"
    assert first != second
    assert WorkerName.parse(first).process == WorkerName.parse(second).process == f"{os.uname().nodename}:1"


#: Prints this process's name twice, its pid, then a forked child's name and pid.
FORK = """
import os
from threadmill.identity import this_process_name as n
print(n(), n(), os.getpid(), flush=True)
child = os.fork()
if child == 0:
    print(n(), os.getpid(), flush=True)
    os._exit(0)
os.waitpid(child, 0)
"""


def test_a_process_keeps_its_name_and_a_forked_child_chooses_its_own():
    done = subprocess.run(
        [sys.executable, "-c", FORK], cwd=ROOT, capture_output=True, text=True, timeout=60, check=True
    )
    (name, again, pid), (childs, child_pid) = (line.split() for line in done.stdout.splitlines())
    assert name == again and WorkerName.parse(name).pid == int(pid)
    assert WorkerName.parse(childs).pid == int(child_pid) and childs != name
    assert WorkerName.parse(childs).host == WorkerName.parse(name).host == os.uname().nodename


@pytest.mark.parametrize(
    ("name", "parsed"),
    [
        ("web-1:42:qmzkfhre", WorkerName("web-1", 42, "qmzkfhre")),
        ("web-1:42", WorkerName("web-1", 42)),  # an older release's name
        ("a:b:7:xyz", WorkerName("a:b", 7, "xyz")),
        ("box:1:2", WorkerName("box:1", 2)),  # digits are a pid, never an incarnation
    ],
)
def test_a_name_of_either_form_reads_back_as_host_pid_and_incarnation(name, parsed):
    assert WorkerName.parse(name) == parsed
    assert str(parsed) == name
    assert parsed.process == name.rsplit(":", 1)[0] if parsed.incarnation else name


@pytest.mark.parametrize("name", ["", "script", "host:", ":12", "host:12:", "host:pid", "host:12:UPPER"])
def test_text_that_is_no_worker_name_reads_as_none(name):
    assert WorkerName.parse(name) is None
