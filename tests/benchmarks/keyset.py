"""Keyset benchmark: a 50-row page of a segment in three partitions, by cursor and by offset, at 1,000 and 100,000 tasks.

`python -m tests.benchmarks.keyset [--repeats N]` starts a throwaway Valkey, fills the
`default` queue of an alias with `partitions` = 3 through `enqueue_many`, and times, per
depth, the median of N runs of: the backend's `peek_page` (first page, and the last page
reached by a cursor), its offset `peek` at the same last page (what offset paging would
cost), and the whole GET of the console's segment page (first page, and by the last page's
cursor) through Django's test client in this process: middleware, view, Redis, template,
no HTTP hop. It also counts the script calls one deep GET sends. Results go to
tests/benchmarks/results/keyset.json and are printed.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable

from . import report
from .server import command_stats, server_version, valkey

#: Queue depths measured, in order (the queue is topped up from one to the next).
DEPTHS = (1_000, 100_000)
#: Tasks per `enqueue_many` call while filling.
FILL_BATCH = 1_000
#: Rows per page, as the console shows them.
PAGE = 50
READY = "/threadmill/default/default/ready/"


def timed_ms(call: Callable[[], object], repeats: int) -> list[float]:
    """Return the wall time of each of `repeats` calls, in milliseconds, after one untimed warm-up call."""
    call()
    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        call()
        samples.append((time.perf_counter() - started) * 1000)
    return samples


def setup(url: str):
    """Configure Django on the partitioned test settings against `url`; return a logged-in test client."""
    os.environ["THREADMILL_TEST_REDIS_URL"] = url
    os.environ["DJANGO_SETTINGS_MODULE"] = "tests.inspector.partitioned_settings"
    import django

    django.setup()
    from django.contrib.auth.models import User
    from django.core.management import call_command
    from django.test import Client

    call_command("migrate", interactive=False, verbosity=0)
    client = Client(SERVER_NAME="localhost")  # one of ALLOWED_HOSTS: no test environment adds "testserver"
    client.force_login(User.objects.create_superuser("bench", "", "bench-pw"))
    return client


def fill(count: int) -> None:
    """Enqueue `count` more echo tasks on the default queue, `FILL_BATCH` per `enqueue_many` call."""
    from tests.tasks import echo

    for start in range(0, count, FILL_BATCH):
        echo.enqueue_many([([i], {}) for i in range(start, min(count, start + FILL_BATCH))])


def measure(client, depth: int, repeats: int) -> dict[str, dict[str, float]]:
    """Time the pages of a `depth`-task ready segment; return {figure: {median_ms, range_ms}}."""
    from django.tasks import task_backends

    from threadmill import api

    backend = task_backends["default"]
    assert backend.queue_stats()["default"][api.Segment.READY] == depth
    # The cursor of the 51st task from the end: the page after it is the segment's last.
    tail = backend.peek_page("default", segment="ready", count=PAGE + 1, newest_first=True).next_cursor
    last = backend.peek_page("default", segment="ready", after=tail, count=PAGE)
    assert len(last.items) == PAGE and last.next_cursor is None
    deep_url = f"{READY}?after={api.encode_cursor(tail)}"

    def get(url: str) -> None:
        response = client.get(url)
        assert response.status_code == 200 and f"{depth} tasks" in response.content.decode()

    calls = {
        "peek_page, first page": lambda: backend.peek_page("default", segment="ready", count=PAGE),
        "peek_page, last page by cursor": lambda: backend.peek_page("default", segment="ready", after=tail, count=PAGE),
        "peek by offset, last page": lambda: backend.peek("default", segment="ready", offset=depth - PAGE, count=PAGE),
        "GET segment page, first page": lambda: get(READY),
        "GET segment page, last page by cursor": lambda: get(deep_url),
    }
    out = {}
    for name, call in calls.items():
        samples = timed_ms(call, repeats)
        out[name] = {"median_ms": round(report.median(samples), 2), "range_ms": report.spread(samples)}
    return out


def script_calls_of(client, url: str) -> int:
    """Return how many scripts one GET of `url` runs on the server."""
    from django.tasks import task_backends

    raw = task_backends["default"].client
    raw.config_resetstat()
    client.get(url)
    return sum(v["calls"] for k, v in command_stats(raw).items() if k.startswith(("evalsha", "eval", "fcall")))


def run(repeats: int) -> None:
    with valkey() as server:
        client = setup(server.url)
        from django.tasks import task_backends

        from threadmill import api

        figures, filled = {}, 0
        for depth in DEPTHS:
            fill(depth - filled)
            filled = depth
            figures[f"{depth:,} tasks"] = measure(client, depth, repeats)
        backend = task_backends["default"]
        tail = backend.peek_page("default", segment="ready", count=PAGE + 1, newest_first=True).next_cursor
        deep_script_calls = script_calls_of(client, f"{READY}?after={api.encode_cursor(tail)}")
        version = server_version(backend.client)
    results = {
        "partitions": 3,
        "repeats": repeats,
        "server": version,
        "script_calls_per_deep_get": deep_script_calls,
        "figures": figures,
    }
    path = report.write_results("keyset", results)
    rows = [[depth, name, f["median_ms"], f["range_ms"]] for depth, by in figures.items() for name, f in by.items()]
    report.print_table(
        f"Keyset paging, 3 partitions, median of {repeats} ({version})", ["depth", "figure", "ms", "range"], rows
    )
    print(f"\nScript calls in one deep GET: {deep_script_calls}\nWrote {path}")


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.benchmarks.keyset", description=__doc__)
    parser.add_argument("--repeats", type=int, default=20, help="timed runs per figure; the median is reported")
    run(parser.parse_args().repeats)


if __name__ == "__main__":
    main()
