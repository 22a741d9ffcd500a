"""Console benchmark: server time of a 50-row page at 1,000 vs 1,000,000 tasks, and the websocket's delay.

Run it on its own: `pytest tests/benchmarks/test_console.py -s` (the default test run skips
tests/benchmarks). It seeds a million real tasks through the enqueue script (pipelined),
times the segment view over HTTP against daphne on this machine (so the whole server side:
view, Redis round trip, table and template, plus a local HTTP hop and none of the test
client's template instrumentation), counts the Redis calls per page from `INFO
commandstats`, then measures in real Chromium how long an enqueue takes to show on the
overview. Results go to tests/benchmarks/results/console.json and are printed.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path

import pytest
import redis

from tests.inspector.live import start_live_console

RESULTS = Path(__file__).parent / "results" / "console.json"
#: Requests timed per figure; the median is reported.
REQUESTS = 30
#: Enqueues whose event-to-screen delay is measured.
LIVE_SAMPLES = 20
SEED_BATCH = 10_000
SIZES = {"emails": 1_000, "default": 1_000_000}


def _seed(backend, queue_name: str, count: int) -> None:
    """Enqueue `count` echo tasks through the real enqueue script and its wrapper, pipelined in batches."""
    from tests.tasks import echo
    from threadmill.backends import codec
    from threadmill.backends.keys import PRIORITY_BAND
    from threadmill.backends.scripts import RedisScripts
    from threadmill.base import Segment

    class PipelinedScripts(RedisScripts):
        # The wrapper builds the keys and arguments; the call is queued on a pipeline instead of sent.
        def _run(self, script, keys, args):
            self.pipe.evalsha(script.sha, len(keys), *keys, *args)

    scripts = PipelinedScripts(backend.client, backend.keys)
    backend.client.script_load(scripts._enqueue.source)
    task = echo.using(queue_name=queue_name)
    for start in range(0, count, SEED_BATCH):
        scripts.pipe = backend.client.pipeline(transaction=False)
        for i in range(start, min(count, start + SEED_BATCH)):
            now = time.time()
            task_id = codec.new_task_id()
            payload = codec.encode_new(task, task_id, [i], {"note": f"task {i}"}, now)
            score = f"{100 * PRIORITY_BAND + int(now * 1000)}"
            scripts.enqueue(task_id, payload, queue_name, Segment.READY, score, score, int(now // 60))
        scripts.pipe.execute()


def _time_page(page, url: str) -> dict:
    samples = []
    for _ in range(REQUESTS):
        started = time.perf_counter()
        response = page.request.get(url)
        samples.append((time.perf_counter() - started) * 1000)
        assert response.status == 200
    samples.sort()
    return {"median_ms": round(statistics.median(samples), 1), "p90_ms": round(samples[int(0.9 * len(samples))], 1)}


def _time_api_pages() -> dict:
    """Time `threadmill.api.page` alone: the one round trip that reads a page's rows and total, decoded."""
    from threadmill import api

    out = {}
    for name, url in PAGES.items():
        queue_name, number = url.split("/")[3], int(url.rsplit("=", 1)[1])
        samples = []
        for _ in range(REQUESTS):
            started = time.perf_counter()
            found = api.page("default", queue_name, api.Segment.READY, (number - 1) * 50, 50)
            samples.append((time.perf_counter() - started) * 1000)
            assert len(found.items) == 50
        samples.sort()
        out[name] = {
            "median_ms": round(statistics.median(samples), 2),
            "p90_ms": round(samples[int(0.9 * len(samples))], 2),
        }
    return out


def _redis_calls(raw: redis.Redis, page, url: str) -> dict:
    raw.config_resetstat()
    page.request.get(url)
    stats = raw.info("commandstats")
    return {name.removeprefix("cmdstat_"): value["calls"] for name, value in stats.items() if value["calls"]}


PAGES = {
    "1,000 tasks, page 1": "/threadmill/default/emails/ready/?page=1",
    "1,000 tasks, last page (20)": "/threadmill/default/emails/ready/?page=20",
    "1,000,000 tasks, page 1": "/threadmill/default/default/ready/?page=1",
    "1,000,000 tasks, middle page (10,000)": "/threadmill/default/default/ready/?page=10000",
    "1,000,000 tasks, last page (20,000)": "/threadmill/default/default/ready/?page=20000",
}


@pytest.fixture
def backend():
    from django.tasks import task_backends

    return task_backends["default"]


@pytest.fixture
def raw(redis_url) -> redis.Redis:
    return redis.Redis.from_url(redis_url)


def test_console_benchmark(redis_url, backend, raw, capsys):
    from playwright.sync_api import sync_playwright

    from tests.inspector.test_browser import CHROMIUM, CHROMIUM_ARGS, log_in

    for queue_name, count in SIZES.items():
        _seed(backend, queue_name, count)
    assert backend.queue_stats()["default"]["ready"] == 1_000_000
    results = {"api_page_time": _time_api_pages()}
    live = start_live_console(redis_url)
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            page = browser.new_page(base_url=live.url)
            log_in(page)
            page.request.get(PAGES["1,000 tasks, page 1"])  # warm the templates and the script cache
            results["page_request_time"] = {name: _time_page(page, url) for name, url in PAGES.items()}
            results["redis_calls_per_page"] = _redis_calls(raw, page, PAGES["1,000,000 tasks, last page (20,000)"])
            results["overview_request_time"] = _time_page(page, "/threadmill/")
            raw.delete(*[backend.keys.segment("default", "ready"), backend.keys.segment("emails", "ready")])
            page.goto("/threadmill/")
            results["event_to_screen"] = _event_to_screen(page)
            browser.close()
    finally:
        live.stop()
    server = raw.info("server")
    results["machine"] = {"cores": os.cpu_count(), "server": server.get("valkey_version") or server["redis_version"]}
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    with capsys.disabled():
        print("\nConsole benchmark:\n" + json.dumps(results, indent=2))
    times = results["page_request_time"]
    deep, small = times["1,000,000 tasks, last page (20,000)"], times["1,000 tasks, page 1"]
    assert deep["median_ms"] < 3 * small["median_ms"] + 10, (
        "a deep page of a huge segment should cost about what a small one does"
    )


def _event_to_screen(page) -> dict:
    """Milliseconds from an enqueue (its ingress event) to the overview's count changing in Chromium."""
    from tests.tasks import echo

    cell = 'tr[data-queue="reports"] a[data-segment="ready"]'
    page.locator(cell).wait_for()
    delays = []
    for n in range(1, LIVE_SAMPLES + 1):
        page.wait_for_timeout(300)  # pacing outside the 4-per-second coalescing window, not synchronisation
        sent_ms = time.time() * 1000
        echo.using(queue_name="reports").enqueue(n)
        shown_ms = page.wait_for_function(
            "([selector, n]) => { const a = document.querySelector(selector);"
            " return a && a.textContent.trim() === String(n) ? Date.now() : false; }",
            arg=[cell, n],
            polling="raf",
            timeout=10_000,
        ).json_value()
        delays.append(shown_ms - sent_ms)
    delays.sort()
    return {
        "samples": len(delays),
        "median_ms": round(statistics.median(delays), 1),
        "p90_ms": round(delays[int(0.9 * len(delays))], 1),
        "max_ms": round(delays[-1], 1),
    }
