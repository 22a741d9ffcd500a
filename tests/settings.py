"""Settings for the test suite: the site's settings, pointed at the test server."""

import json
import os

from inspector.site.settings import *

REDIS_URL = os.environ.get("THREADMILL_TEST_REDIS_URL", "redis://127.0.0.1:1/0")
DATABASES = {
    "default": {"ENGINE": "django.db.backends.sqlite3", "NAME": os.environ.get("THREADMILL_TEST_DB", ":memory:")}
}
TASKS = {
    "default": {
        "BACKEND": "threadmill.backends.redis.RedisTaskBackend",
        "REDIS_URL": REDIS_URL,
        # THREADMILL_TEST_CLUSTER=1: REDIS_URL names a node of the session's Valkey Cluster.
        "CLUSTER": os.environ.get("THREADMILL_TEST_CLUSTER") == "1",
        "QUEUES": ["default", "emails", "reports"],
        # THREADMILL_TEST_LEASE_TTL: a short lease for the worker tests that kill a process; the
        # fault suite shortens the liveness and connection timeouts the same way.
        "OPTIONS": {
            "lease_ttl": float(os.environ.get("THREADMILL_TEST_LEASE_TTL", "300")),
            "poll_max_interval": 0.05,
            "worker_timeout": float(os.environ.get("THREADMILL_TEST_WORKER_TIMEOUT", "15")),
            "socket_timeout": float(os.environ.get("THREADMILL_TEST_SOCKET_TIMEOUT", "5")),
            "broker_interval": float(os.environ.get("THREADMILL_TEST_BROKER_INTERVAL", "1")),
            # THREADMILL_TEST_SWEEP_INTERVAL: the rolling-deploy test's sweeper, which alone releases an old worker's children.
            "sweep_interval": float(os.environ.get("THREADMILL_TEST_SWEEP_INTERVAL", "5")),
            # THREADMILL_TEST_PARTITIONS: the worker tests of a partitioned alias.
            "partitions": int(os.environ.get("THREADMILL_TEST_PARTITIONS", "1")),
            # THREADMILL_TEST_TIMEOUT_GRACE: the time-limit tests' short grace.
            "timeout_grace": float(os.environ.get("THREADMILL_TEST_TIMEOUT_GRACE", "10")),
            # THREADMILL_TEST_ABORT_GRACE: the abort tests' short grace.
            "abort_grace": float(os.environ.get("THREADMILL_TEST_ABORT_GRACE", "10")),
            # THREADMILL_TEST_TASK_TIMEOUT: the alias-wide time limit (the drain benchmark's limited row).
            "task_timeout": float(os.environ.get("THREADMILL_TEST_TASK_TIMEOUT") or 0) or None,
        },
    }
}
if os.environ.get("THREADMILL_TEST_CONNECTION"):
    # THREADMILL_TEST_CONNECTION: OPTIONS["connection"] as JSON (credentials for a URL without them).
    TASKS["default"]["OPTIONS"]["connection"] = json.loads(os.environ["THREADMILL_TEST_CONNECTION"])
if os.environ.get("THREADMILL_TEST_SENTINEL"):
    # THREADMILL_TEST_SENTINEL: OPTIONS["sentinel"] as JSON (the sentinels' own password, user and TLS).
    TASKS["default"]["OPTIONS"]["sentinel"] = json.loads(os.environ["THREADMILL_TEST_SENTINEL"])
if os.environ.get("THREADMILL_TEST_LIMITS"):
    # THREADMILL_TEST_LIMITS: OPTIONS["limits"] as JSON (the drain benchmark's non-binding limit rows).
    TASKS["default"]["OPTIONS"]["limits"] = json.loads(os.environ["THREADMILL_TEST_LIMITS"])
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

if os.environ.get("THREADMILL_TEST_SCHEDULE"):
    # The live console of the browser tests: one schedule to show, pause and run now (its tick is rare).
    TASKS["default"]["SCHEDULE"] = {
        "yearly-echo": {"task": "tests.tasks.echo", "cron": "0 3 1 1 *", "args": ["yearly"]}
    }
