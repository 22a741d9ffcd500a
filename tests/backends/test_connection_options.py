"""OPTIONS["connection"]: redis-py keyword arguments that reach every client and connection the backend makes."""

from __future__ import annotations

import json
import logging
import subprocess
import sys

import pytest
import redis
from redis.driver_info import DriverInfo

from tests import tasks
from tests.backends.conftest import same_server
from tests.worker.conftest import ROOT, run_worker, worker_env
from threadmill.backends.redis import RedisTaskBackend
from threadmill.embedded import free_port
from threadmill.exceptions import ServerUnreachable

#: The CLIENT SETNAME every connection of the backends under test announces.
NAME = "threadmill-connection-options"


def named_connections(server) -> list[dict]:
    """The connections to the node holding the alias's keys that announced `NAME`."""
    return [c for c in server.client_for("threadmill:{default}").client_list() if c.get("name") == NAME]


async def test_client_name_reaches_the_scripts_the_commands_the_asyncio_path_and_pub_sub(backend, server):
    named = RedisTaskBackend(
        "default", same_server(backend, QUEUES=["default"], OPTIONS={"connection": {"client_name": NAME}})
    )
    stored = named.enqueue(tasks.echo, ["thread path"], {})  # a script on the thread's raw connection
    assert named.get_result(stored.id).args == ["thread path"]  # the command layer's pool
    await named.aenqueue(tasks.echo, ["event loop"], {})  # the loop's script connections
    subscription = named.subscribe_telemetry([named.keys.telemetry()])
    try:
        connections = named_connections(server)
    finally:
        subscription.close()
    commands = sorted(c["cmd"] for c in connections)
    assert "evalsha" in commands
    assert {"subscribe", "ssubscribe"} & set(commands), commands
    # The thread's script connection, a loop's, and the pool's (get_result's, then the subscription's).
    assert len(connections) >= 3, commands


def test_connections_name_redis_py_at_its_version_unless_connection_names_the_client_itself(redis_url):
    # On the session's Valkey: an older Redis (Debian's) keeps no CLIENT SETINFO fields.
    def reported(connection: dict) -> set[tuple[str, str]]:
        backend = RedisTaskBackend("default", {"REDIS_URL": redis_url, "OPTIONS": {"connection": connection}})
        backend.enqueue(tasks.echo, [1], {})
        clients = redis.Redis.from_url(redis_url).client_list()
        return {(c["lib-name"], c["lib-ver"]) for c in clients if c.get("name") == connection["client_name"]}

    assert reported({"client_name": NAME}) == {("redis-py", redis.__version__)}
    own = {"client_name": f"{NAME}-own", "driver_info": DriverInfo(name="mysite", lib_version="1.2")}
    assert reported(own) == {("mysite", "1.2")}


def test_a_new_connection_asks_for_no_maintenance_notifications(redis_url):
    # redis-py 8.1 asks for them on every connection under RESP3 unless told not to; Valkey refuses the
    # command, so each connection of a worker's start paid a round trip for an error.
    backend = RedisTaskBackend("default", {"REDIS_URL": redis_url, "QUEUES": ["default"]})
    admin = redis.Redis.from_url(redis_url)
    admin.config_resetstat()
    backend.enqueue(tasks.echo, [1], {})  # the thread's raw script connection
    backend.get_result(backend.enqueue(tasks.echo, [2], {}).id)  # the client's pool
    assert admin.info("commandstats")["cmdstat_hello"]["calls"] >= 2
    assert admin.info("errorstats") == {}


def test_a_user_and_password_in_connection_log_in_where_the_url_names_none(password_server):
    url = f"redis://127.0.0.1:{password_server.port}/0"
    credentials = {"username": password_server.user, "password": password_server.password}
    backend = RedisTaskBackend("default", {"REDIS_URL": url, "OPTIONS": {"connection": credentials}})
    stored = backend.enqueue(tasks.echo, ["logged in"], {})
    assert backend.get_result(stored.id).args == ["logged in"]
    assert backend.check() == []


async def test_a_user_and_password_in_connection_log_the_asyncio_path_in(password_server):
    url = f"redis://127.0.0.1:{password_server.port}/0"
    credentials = {"username": password_server.user, "password": password_server.password}
    backend = RedisTaskBackend("default", {"REDIS_URL": url, "OPTIONS": {"connection": credentials}})
    stored = await backend.aenqueue(tasks.echo, ["logged in"], {})
    assert (await backend.aget_result(stored.id)).args == ["logged in"]


def test_without_the_connection_options_the_same_url_is_refused(password_server):
    url = f"redis://127.0.0.1:{password_server.port}/0"
    backend = RedisTaskBackend("default", {"REDIS_URL": url, "OPTIONS": {"enqueue_retry": 0}})
    with pytest.raises(Exception, match="(?i)auth"):
        backend.enqueue(tasks.echo, ["refused"], {})


async def test_health_check_interval_reaches_the_raw_connections_of_both_paths(redis_url):
    backend = RedisTaskBackend(
        "default", {"REDIS_URL": redis_url, "OPTIONS": {"connection": {"health_check_interval": 7}}}
    )
    backend.enqueue(tasks.echo, ["x"], {})
    assert backend.scripts.transport.connection().health_check_interval == 7
    await backend.aenqueue(tasks.echo, ["y"], {})
    on_loop = await backend.aio.on_loop()
    assert {connection.health_check_interval for connection in on_loop.connections} == {7}


def test_socket_connect_timeout_may_be_set_and_socket_timeout_stays_threadmill_s(redis_url):
    options = {"socket_timeout": 2, "connection": {"socket_connect_timeout": 0.5}}
    backend = RedisTaskBackend("default", {"REDIS_URL": redis_url, "OPTIONS": options})
    backend.enqueue(tasks.echo, ["x"], {})
    connection = backend.scripts.transport.connection()
    assert (connection.socket_timeout, connection.socket_connect_timeout) == (2, 0.5)


def errors_of(redis_url: str, connection: dict, **params) -> list:
    backend = RedisTaskBackend("default", {"REDIS_URL": redis_url, **params, "OPTIONS": {"connection": connection}})
    return [e for e in backend.check() if e.id == "threadmill.E004"]


def test_an_unknown_keyword_is_a_system_check_error_naming_it(redis_url):
    [error] = errors_of(redis_url, {"health_check_intervall": 5})
    assert error.msg == (
        "TASKS['default']['OPTIONS']['connection']: 'health_check_intervall' is not a keyword argument "
        "of redis-py's Connection, the connection REDIS_URL's scheme makes."
    )
    assert error.hint


def test_a_value_of_the_wrong_type_is_a_system_check_error_naming_its_keyword(redis_url):
    [error] = errors_of(redis_url, {"socket_keepalive": "yes"})
    assert error.msg == "TASKS['default']['OPTIONS']['connection']: 'socket_keepalive' must be True or False, not str."


def test_socket_timeout_in_connection_is_refused_pointing_at_threadmill_s_own_option(redis_url):
    [error] = errors_of(redis_url, {"socket_timeout": 3})
    assert error.msg == "TASKS['default']['OPTIONS']['connection'] sets 'socket_timeout', which Threadmill sets itself."
    assert error.hint == "Set it in OPTIONS['socket_timeout']."


def test_a_keyword_the_cluster_client_would_drop_is_a_system_check_error_on_a_cluster(cluster):
    [error] = errors_of(cluster.url, {"health_check_interval": 5}, CLUSTER=True)
    assert "'health_check_interval' is not passed on to a node's connections" in error.msg


def test_good_keywords_are_no_error(redis_url):
    good = {"health_check_interval": 5, "socket_keepalive": True, "client_name": NAME, "credential_provider": None}
    assert errors_of(redis_url, good) == []


def test_a_tls_keyword_is_an_error_on_a_plain_url_and_none_on_a_tls_one(redis_url):
    [error] = errors_of(redis_url, {"ssl_ca_data": "-----BEGIN CERTIFICATE-----"})
    assert "'ssl_ca_data' is not a keyword argument of redis-py's Connection" in error.msg
    tls_url = redis_url.replace("redis://", "rediss://")
    backend = RedisTaskBackend("default", {"REDIS_URL": tls_url, "OPTIONS": {"connection": {"ssl_ca_data": "x"}}})
    assert [e for e in backend.check() if e.id == "threadmill.E004"] == []


def test_the_check_never_prints_a_keyword_s_value(redis_url):
    secret = "s3cret-never-printed"
    errors = errors_of(redis_url, {"passwd": secret, "socket_keepalive": secret})
    assert len(errors) == 2
    assert all(secret not in f"{e.msg} {e.hint}" for e in errors)


def test_a_failed_enqueue_with_a_password_in_connection_never_shows_it(password_server, caplog):
    url = f"redis://127.0.0.1:{free_port()}/0"
    credentials = {"username": password_server.user, "password": password_server.password}
    backend = RedisTaskBackend(
        "default", {"REDIS_URL": url, "OPTIONS": {"connection": credentials, "enqueue_retry": 0.3}}
    )
    with caplog.at_level(logging.DEBUG), pytest.raises(ServerUnreachable) as failed:
        backend.enqueue(tasks.echo, ["never"], {})
    assert password_server.password not in str(failed.value)
    assert all(password_server.password not in record.getMessage() for record in caplog.records)


def test_a_worker_pool_logs_in_with_connection_options_and_its_output_never_shows_the_password(password_server):
    url = f"redis://127.0.0.1:{password_server.port}/0"
    credentials = {"username": password_server.user, "password": password_server.password}
    backend = RedisTaskBackend("default", {"REDIS_URL": url, "OPTIONS": {"connection": credentials}})
    ids = [backend.enqueue(tasks.echo, [i], {}).id for i in range(10)]
    env = worker_env(THREADMILL_TEST_REDIS_URL=url, THREADMILL_TEST_CONNECTION=json.dumps(credentials))
    done = run_worker("-w", "1", "-t", "2", "--exit-empty", env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert {backend.get_result(task_id).status.name for task_id in ids} == {"SUCCESSFUL"}
    assert password_server.password not in done.stdout + done.stderr


def test_manage_py_check_names_a_refused_keyword_and_never_the_password(password_server):
    connection = {"username": password_server.user, "password": password_server.password, "socket_timout": 1}
    env = worker_env(
        THREADMILL_TEST_REDIS_URL=f"redis://127.0.0.1:{password_server.port}/0",
        THREADMILL_TEST_CONNECTION=json.dumps(connection),
    )
    checked = subprocess.run(
        [sys.executable, "manage.py", "check"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    output = checked.stdout + checked.stderr
    assert checked.returncode == 1, output
    assert "threadmill.E004" in output and "'socket_timout' is not a keyword argument" in output
    assert password_server.password not in output
