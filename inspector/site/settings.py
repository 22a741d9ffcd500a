"""Settings of the small runnable Threadmill site: the console, the demo tasks, the worker.

`REDIS_URL` comes from the environment; unset, it points at the embedded Valkey that
`manage.py threadmill run` starts on port 6389.
"""

import os
from pathlib import Path
from typing import Any

from inspector.apps import STATIC_DIR, TEMPLATES_DIR
from threadmill.embedded import DEFAULT_EMBEDDED_PORT

BASE_DIR = Path(os.environ.get("THREADMILL_HOME", Path.cwd()))
SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "threadmill-demo-site-not-for-production")
DEBUG = os.environ.get("DJANGO_DEBUG", "") == "1"
# The DEBUG page and the error e-mails show REDIS_URL redacted (docs/how-to/production-redis.md).
DEFAULT_EXCEPTION_REPORTER_FILTER = "threadmill.error_reports.RedactingReporterFilter"
ALLOWED_HOSTS = ["127.0.0.1", "localhost", "[::1]"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "channels",
    "django_htmx",
    "django_tables2",
    "threadmill",
    "inspector",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django.middleware.csp.ContentSecurityPolicyMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
]

ROOT_URLCONF = "inspector.site.urls"
ASGI_APPLICATION = "inspector.site.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [TEMPLATES_DIR],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ.get("THREADMILL_DB", str(BASE_DIR / "var" / "db.sqlite3")),
    }
}

REDIS_URL = os.environ.get("REDIS_URL") or f"redis://127.0.0.1:{DEFAULT_EMBEDDED_PORT}/0"

# Django's own type for it: inferred from this one entry, other backends' keys would not fit.
TASKS: dict[str, dict[str, Any]] = {
    "default": {
        "BACKEND": "threadmill.backends.redis.RedisTaskBackend",
        "REDIS_URL": REDIS_URL,
        "QUEUES": ["default", "emails", "reports"],
        "OPTIONS": {"lease_ttl": 300},
    }
}

LOGIN_URL = "admin:login"
LOGIN_REDIRECT_URL = "inspector:queue_list"
# The console sends its own, stricter policy; this covers the rest of the site (the admin).
SECURE_CSP = {"default-src": ["'self'"], "object-src": ["'none'"], "frame-ancestors": ["'none'"]}
STATIC_URL = "static/"
STATICFILES_DIRS = [STATIC_DIR]
STATIC_ROOT = BASE_DIR / "var" / "static"
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

#: What `manage.py threadmill run` enqueues for a first look (skip it with --no-demo).
THREADMILL_DEMO_WORKLOAD = "inspector.demo.enqueue_demo_workload"

# The demo's tasks that fail on purpose log one line each (inspector/site/demo_logs.py).
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {"demo_failures": {"()": "inspector.site.demo_logs.DemoFailuresOnOneLine"}},
    "loggers": {"django.tasks": {"filters": ["demo_failures"]}},
}
