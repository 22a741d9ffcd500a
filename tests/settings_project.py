"""Settings of a new user project: `startproject`'s apps and threadmill, no console.

The test settings are the demo site's, with the console's apps installed; a site without the
console loads none of them. The start benchmark and the worker's import tests run under these
too. The backend takes its defaults, as in `tests.benchmarks.settings`.
"""

import os

SECRET_KEY = "threadmill-start-benchmark-not-for-production"
INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "threadmill",
]
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}
USE_TZ = True
TASKS = {
    "default": {
        "BACKEND": "threadmill.backends.redis.RedisTaskBackend",
        "REDIS_URL": os.environ.get("THREADMILL_TEST_REDIS_URL", "redis://127.0.0.1:1/0"),
        "QUEUES": ["default"],
    }
}
