"""Settings for django-tasks-db's db_worker on a SQLite file."""

import os

from tests.settings import *

INSTALLED_APPS = [*INSTALLED_APPS, "django_tasks_db"]
# WAL with synchronous=NORMAL, as a SQLite deployment of a queue would run, so the
# figure is the worker's and not one fsync per transaction on the benchmark's disk.
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ["BENCH_SQLITE_PATH"],
        "OPTIONS": {
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
            "transaction_mode": "IMMEDIATE",
        },
    }
}
TASKS = {"default": {"BACKEND": "django_tasks_db.DatabaseBackend", "QUEUES": ["default"]}}
