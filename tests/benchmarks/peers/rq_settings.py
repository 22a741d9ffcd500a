"""Settings for django-tasks-rq: rq's worker (django-rq's rqworker) on the benchmark's Valkey."""

import os

from tests.settings import *

from . import RQ_DB

INSTALLED_APPS = [*INSTALLED_APPS, "django_rq"]
RQ_QUEUES = {"default": {"URL": f"{os.environ['BENCH_REDIS_URL'].rsplit('/', 1)[0]}/{RQ_DB}"}}
TASKS = {"default": {"BACKEND": "django_tasks_rq.RQBackend", "QUEUES": ["default"]}}
