"""The Tasks pages: every task path's counts, sorted and spanned, one path's page, and bad input as a 4xx."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.django_db


def _record(backend, path: str, **counts: int) -> None:
    backend.record_task_stats({"default": {path: counts}})


def test_the_list_shows_every_path_with_its_rates_and_sorts_by_a_column(operator_client, backend):
    _record(backend, "app.tasks.fast", runs=10, successful=10, run_us=10_000, run_b2=10)
    _record(backend, "app.tasks.flaky", runs=4, successful=1, retried=2, failed=1, run_us=4_000_000, run_b9=4)

    page = operator_client.get("/threadmill/tasks/?sort=failures").content.decode()
    assert page.index("app.tasks.flaky") < page.index("app.tasks.fast")  # 75% failures first
    assert "75.0%" in page and "0.0%" in page and "4.0 s" in page
    by_runs = operator_client.get("/threadmill/tasks/?sort=runs&span=24h").content.decode()
    assert by_runs.index("app.tasks.fast") < by_runs.index("app.tasks.flaky")


def test_a_path_page_shows_its_counts_errors_and_links_to_its_tasks(operator_client, backend):
    _record(backend, "app.tasks.flaky", **{"runs": 3, "failed": 1, "retried": 2, "error|builtins.ValueError": 3})

    response = operator_client.get("/threadmill/tasks/default/default/app.tasks.flaky/")
    page = response.content.decode()
    assert response.status_code == 200
    assert '<dd id="path-runs">3</dd>' in page and '<dd id="path-retried">2</dd>' in page
    assert "builtins.ValueError" in page
    assert "/threadmill/default/default/failed/?task=app.tasks.flaky" in page


@pytest.mark.parametrize(
    ("url", "status", "says"),
    [
        ("/threadmill/tasks/?sort=nope", 400, "sort must be one of"),
        ("/threadmill/tasks/?span=7d", 400, "span must be one of"),
        ("/threadmill/tasks/default/default/app.never.ran/", 404, "No runs of"),
        ("/threadmill/tasks/default/no-such-queue/app.tasks.x/", 404, "No queue named"),
        ("/threadmill/tasks/default/default/not%20a%20path/", 404, ""),
    ],
)
def test_bad_input_is_a_clear_4xx(operator_client, backend, url, status, says):
    _record(backend, "app.tasks.x", runs=1, successful=1)
    response = operator_client.get(url)
    assert response.status_code == status
    assert says in response.content.decode()


def test_a_stored_path_is_escaped_and_the_pages_are_staff_only(operator_client, client, backend):
    _record(backend, "app.<script>alert(1)</script>", runs=1, successful=1)
    page = operator_client.get("/threadmill/tasks/").content.decode()
    assert "<script>alert(1)</script>" not in page and "&lt;script&gt;" in page
    assert client.get("/threadmill/tasks/").status_code == 302  # to the login page


def test_a_path_with_a_per_task_limit_shows_it_and_its_runs_leased_now(operator_client, backend):
    from tests.tasks import three_a_minute, three_at_a_time

    for i in range(4):
        backend.enqueue(three_at_a_time, [i], {})
    backend.enqueue(three_a_minute, [0], {})
    leased = backend.acquire("default", count=10, worker="w:1")
    assert len(leased) == 4  # three of one path, one of the other
    _record(backend, "tests.tasks.three_at_a_time", runs=1, successful=1)
    _record(backend, "tests.tasks.echo", runs=1, successful=1)

    page = operator_client.get("/threadmill/tasks/").content.decode()
    assert "Limit: 3 at once (3 running)" in page
    assert page.count('class="task-limit"') == 1  # echo has none
    detail = operator_client.get("/threadmill/tasks/default/default/tests.tasks.three_at_a_time/").content.decode()
    assert "Per-task limit, across every queue and worker: 3 at once (3 running)." in detail
