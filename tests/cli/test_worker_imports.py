"""The worker command imports what a worker uses: not the console's server, metrics, psutil, an unused tracing API,
the other subcommands, or the schedules and workflows it is not given.

Read from `python -X importtime` over a whole `--exit-empty` run, its forked worker process
included; nothing is timed here (`python -m tests.benchmarks start` times the start).
"""

from __future__ import annotations

import subprocess
import sys

from tests.worker.conftest import ROOT, worker_env
from threadmill.cli import SUBCOMMANDS
from threadmill.worker.usage import STATM

#: Runs manage.py as an install without the OpenTelemetry SDK: redis-py imports the SDK and the
#: metrics API itself whenever they are installed (`redis.observability`), which is not ours to avoid.
WITHOUT_OTEL_SDK = """
import runpy, sys

class NoSdk:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] == "opentelemetry" and name.startswith("opentelemetry.sdk"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)

sys.meta_path.insert(0, NoSdk())
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""
#: What only the console serves with (daphne installs the Twisted reactor when its app loads).
CONSOLE_SERVER = {"daphne", "twisted", "autobahn"}
#: What only the console, its apps and the metrics view load.
CONSOLE = {*CONSOLE_SERVER, "channels", "inspector", "django_htmx", "django_tables2", "prometheus_client"}
#: What threadmill's spans carry their W3C context with, loaded only once a tracer provider is set up.
PROPAGATION = ("opentelemetry.propagators", "opentelemetry.propagate", "opentelemetry.trace.propagation.tracecontext")
#: The modules of the subcommands a worker's command line does not name (`run` starts an embedded Valkey).
OTHER_SUBCOMMANDS = {path for name, path in SUBCOMMANDS.items() if name != "worker"} | {"threadmill.embedded"}
#: The tooling API's concerns a worker does not use: it finds and checks its backend through `queues` alone.
OTHER_API_CONCERNS = {
    f"threadmill.api.{name}"
    for name in ("actions", "controls", "history", "metrics", "schedules", "workflows", "workers")
}
#: What only a backend with a SCHEDULE, or a task that is a workflow's, loads (a worker's start pays for neither).
UNUSED_FEATURES = {"threadmill.schedules", "cronsim", "threadmill.workflows", "threadmill.running_workflow"}
#: The OpenTelemetry modules only tracing uses (threadmill's spans and their W3C context).
TRACING = ("opentelemetry.trace", "opentelemetry.propagators", "opentelemetry.propagate")


def worker_imports(settings: str, *, sdk: bool = False) -> set[str]:
    """Run an `--exit-empty` worker on empty queues under `settings`; return every module it imported.

    Without `sdk` it runs as an install without the OpenTelemetry SDK would.
    """
    manage = ["manage.py"] if sdk else ["-c", WITHOUT_OTEL_SDK, "manage.py"]
    command = [
        sys.executable,
        "-X",
        "importtime",
        *manage,
        "threadmill",
        "worker",
        "--exit-empty",
        "-w",
        "1",
        "-t",
        "1",
    ]
    env = worker_env(DJANGO_SETTINGS_MODULE=settings)
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    imported = {line.rsplit("|", 1)[1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}
    assert {"threadmill.worker.supervisor", "threadmill.worker.process", "redis"} <= imported
    return imported


def test_a_project_without_the_console_imports_neither_its_stack_nor_prometheus_nor_tracing_nor_other_subcommands(
    redis_url,
):
    imported = worker_imports("tests.settings_project")
    assert not {name for name in imported if name.partition(".")[0] in CONSOLE}
    assert "threadmill.integrations.otel" in imported
    assert not imported & OTHER_SUBCOMMANDS
    assert "threadmill.api.queues" in imported
    assert not imported & OTHER_API_CONCERNS
    assert not imported & UNUSED_FEATURES
    assert not {name for name in imported if name.startswith(TRACING)}
    # Linux tells a snapshot's CPU and memory without psutil (threadmill/worker/usage.py).
    assert "psutil" not in imported or not STATM.exists()


def test_where_redis_py_imports_the_tracing_api_and_no_provider_is_set_up_the_propagators_stay_unimported(redis_url):
    imported = worker_imports("tests.settings_project", sdk=True)
    assert "opentelemetry.trace" in imported  # redis-py's, through the SDK's metrics
    assert not {name for name in imported if name.startswith(PROPAGATION)}


def test_the_demo_site_worker_loads_the_console_apps_but_not_the_server_that_serves_them(redis_url):
    imported = worker_imports("tests.settings")
    assert "inspector" in imported
    assert not {name for name in imported if name.partition(".")[0] in CONSOLE_SERVER}
