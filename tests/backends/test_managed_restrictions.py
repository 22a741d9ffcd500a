"""What the "Managed services" section of docs/how-to/production-redis.md claims, checked where a machine can.

Two claims: (1) a drain, the producer and operator calls, the console and `threadmill status` send none
of the commands managed services block (CONFIG, KEYS, SCAN, CLIENT, DEBUG, FLUSHALL, ACL, MONITOR,
COMMAND), save redis-py's own CLIENT SETINFO at connect, which it lets the server refuse; counted on a
fresh Valkey by its `INFO commandstats` (refused calls included) while the only user Threadmill has is
denied all of them. (2) the page's list of scripts that build key names inside Lua is exactly the list a
scan of the Lua sources finds.
"""

from __future__ import annotations

import re
import subprocess
import sys
from importlib.resources import files

import pytest
import redis

from tests.backends.test_acl import OPERATIONS
from tests.servers import start_server
from tests.worker.conftest import ROOT, run_worker, worker_env
from threadmill.backends.keys import ACL_RULES
from threadmill.backends.script_source import script_source

PAGE = ROOT / "docs" / "how-to" / "production-redis.md"
#: Command families some managed service blocks (the page's table says which); Threadmill's user is denied each.
RESTRICTED = ("config", "keys", "scan", "client", "debug", "flushall", "acl", "monitor", "command")
#: What redis-py sends at every connect and lets the server refuse (NOPERM included): not Threadmill's own.
TOLERATED = {"client|setinfo"}
#: The admin connection's own command after the counters' baseline: reading the log (INFO is no family above).
ADMIN_COMMANDS = {"acl|log"}

#: A key name built inside Lua: a declared key (or a prefix passed as one) with something appended, or a
#: task hash's name cut back to its prefix (the uniqueness helpers) and appended to.
_BUILT_KEY = re.compile(r"(KEYS\[[^\]]+\]|\b\w*prefix\b|string\.sub\(\s*\w*key\w*\s*,[^)]*\))\s*\.\.")
_COMMENT = re.compile(r"--[^\n]*")
#: A row of the page's table of those scripts: "| `acquire.lua` | ..." under its heading.
_TABLE_ROW = re.compile(r"^\| `(\w+\.lua)` \|", re.MULTILINE)
_TABLE_HEADING = "### Scripts that build key names inside Lua"


def scripts_that_build_keys() -> set[str]:
    """Return the script files whose source (includes expanded, comments dropped) builds a key name."""
    found = set()
    for entry in files("threadmill.backends").joinpath("lua").iterdir():
        if entry.name.endswith(".lua"):
            source = _COMMENT.sub("", script_source(entry.name.removesuffix(".lua")))
            if _BUILT_KEY.search(source):
                found.add(entry.name)
    return found


def documented_scripts() -> set[str]:
    """Return the scripts named in the page's table of scripts that build key names."""
    section = PAGE.read_text().split(_TABLE_HEADING, 1)[1].split("\n#", 1)[0]
    return set(_TABLE_ROW.findall(section))


def test_the_page_lists_exactly_the_scripts_that_build_key_names_inside_lua():
    built, listed = scripts_that_build_keys(), documented_scripts()
    assert built == listed, (
        f"not on the page: {sorted(built - listed)}; on the page, building none: {sorted(listed - built)}"
    )


def test_the_key_pattern_finds_a_built_key_and_passes_a_declared_one():
    assert _BUILT_KEY.search("redis.call('HGET', KEYS[2] .. id, 'segment')")
    assert _BUILT_KEY.search("local key = task_prefix .. id")
    assert not _BUILT_KEY.search("redis.call('HGET', KEYS[2], schedule .. ':tick')")


def sent_commands(admin: redis.Redis, since: dict[str, int] | None = None) -> dict[str, int]:
    """Return each command the server was sent (calls, refused ones included), less the counts in `since`."""
    sent = {}
    for key, stats in admin.info("commandstats").items():
        name = key.removeprefix("cmdstat_")
        total = int(stats["calls"]) + int(stats.get("rejected_calls", 0)) + int(stats.get("failed_calls", 0))
        if total > (since or {}).get(name, 0):
            sent[name] = total - (since or {}).get(name, 0)
    return sent


@pytest.fixture
def denied_everything_restricted():
    """A fresh Valkey whose only enabled user has `ACL_RULES` minus every restricted command; (URL, admin, counts).

    The counts are the server's command counters once it is set up (the harness's own calls: a CONFIG GET).
    """
    server = start_server("valkey")
    # No CLIENT SETINFO from the admin connection: every one counted is the limited user's.
    admin = redis.Redis(port=server.port, driver_info=None)
    denials = " ".join(f"-{name}" for name in RESTRICTED)
    admin.execute_command("ACL", "SETUSER", "threadmill", "on", ">limited-pw", *f"{ACL_RULES} {denials}".split())
    admin.execute_command("ACL", "SETUSER", "default", "resetpass", ">admin-pw")
    admin = redis.Redis(port=server.port, password="admin-pw", driver_info=None)
    yield f"redis://threadmill:limited-pw@127.0.0.1:{server.port}/0", admin, sent_commands(admin)
    server.stop()


@pytest.mark.slow
def test_a_drain_the_console_and_status_send_no_restricted_command(denied_everything_restricted, tmp_path):
    url, admin, baseline = denied_everything_restricted
    env = worker_env(
        THREADMILL_TEST_REDIS_URL=url,
        THREADMILL_TEST_DB=str(tmp_path / "db.sqlite3"),
        THREADMILL_TEST_BROKER_INTERVAL="0.2",
    )
    done = subprocess.run([sys.executable, "-c", OPERATIONS], cwd=ROOT, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    drained = run_worker("-w", "1", "-t", "2", "--exit-empty", env=env)
    assert drained.returncode == 0, drained.stderr[-3000:]
    status = subprocess.run(
        [sys.executable, "manage.py", "threadmill", "status", "--json"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    assert status.returncode == 0, status.stderr[-2000:]
    # OPERATIONS' 12 echo tasks and the sleep_for task the ACL test kills a worker under.
    assert admin.zcard("threadmill:{default}:default:successful") == 13
    sent = sent_commands(admin, since=baseline)
    restricted = {name for name in sent if name.split("|")[0] in RESTRICTED} - ADMIN_COMMANDS
    assert restricted == TOLERATED, sorted(restricted)
    refused = {entry["object"] for entry in admin.acl_log()}
    assert refused == TOLERATED, refused
