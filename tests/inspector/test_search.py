"""The search box: a task id jumps to its page wherever it is; other text filters the current segment."""

from __future__ import annotations

import pytest

from inspector.models import AuditEntry
from tests.inspector.conftest import csrf_post

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("segment", ["ready", "deferred", "running", "successful", "failed", "unreadable"])
def test_a_task_id_jumps_to_its_page_whatever_its_segment(operator_client, seeded, segment):
    response = operator_client.get("/threadmill/search/", {"q": f"  {seeded[segment]} "})
    assert response.status_code == 302
    assert response.headers["Location"] == f"/threadmill/default/task/{seeded[segment]}/"


def test_a_task_id_jumps_to_its_page_from_another_queues_segment(operator_client, seeded):
    from tests.tasks import send_email

    task_id = send_email.enqueue("ada@example.com").id
    query = {"q": task_id, "backend": "default", "queue": "default", "segment": "failed"}
    assert (
        operator_client.get("/threadmill/search/", query).headers["Location"] == f"/threadmill/default/task/{task_id}/"
    )


def test_an_unknown_id_says_no_task_has_it(operator_client, seeded):
    response = operator_client.get("/threadmill/search/", {"q": "0000-no-such-task"})
    assert response.status_code == 404
    assert 'No task has the id <span class="mono">0000-no-such-task</span> on any backend' in response.content.decode()


def test_text_on_a_segment_page_filters_that_segment_by_its_arguments(operator_client, backend):
    from tests.tasks import echo

    ada, grace = echo.enqueue("ada@example.com").id, echo.enqueue("grace@example.com").id
    query = {"q": "ada@", "backend": "default", "queue": "default", "segment": "ready"}
    response = operator_client.get("/threadmill/search/", query)
    assert response.headers["Location"] == "/threadmill/default/default/ready/?q=ada%40"
    for headers in ({}, {"HX-Request": "true"}):
        html = operator_client.get(response.headers["Location"], headers=headers).content.decode()
        assert ada in html and grace not in html and "1 task matching" in html


def test_text_matches_non_ascii_and_quotes_as_stored(operator_client, backend):
    from tests.tasks import echo

    hit, miss = echo.enqueue('café "crème"').id, echo.enqueue("cafe creme").id
    html = operator_client.get("/threadmill/default/default/ready/", {"q": 'é "crè'}).content.decode()
    assert hit in html and miss not in html


def test_a_text_search_past_the_scan_bound_is_counted_as_a_lower_bound(operator_client, backend, monkeypatch):
    from tests.tasks import echo
    from threadmill.api import queues

    monkeypatch.setattr(queues, "FILTER_SCAN_LIMIT", 3)
    for i in range(5):
        echo.enqueue(f"needle {i}")
    html = operator_client.get("/threadmill/default/default/ready/", {"q": "needle"}).content.decode()
    assert "3+ tasks matching" in html


def test_requeue_all_in_a_text_filtered_view_moves_only_the_matching_tasks(operator_client, backend):
    from tests.tasks import echo

    # Needles with letters past f: a task's id (hex) never contains them, as it did "ada" one run in ~150.
    ids = [echo.enqueue(name).id for name in ("lovelace", "hopper")]
    leased = {r.id for r in backend.acquire("default", count=2, worker="ghost:1")}
    assert leased == set(ids)
    backend.client.zadd(backend.keys.segment("default", "running"), dict.fromkeys(ids, 1))  # both overdue
    data = {"scope": "view", "q": "lovelace", "confirmed": "yes"}
    response = csrf_post(operator_client, "/threadmill/default/default/running/requeue/", data)
    assert response.status_code == 302 and response.headers["Location"].endswith("?q=lovelace")
    assert backend.in_segment("default", "ready", ids) == [ids[0]]
    assert AuditEntry.objects.get().scope == "view * text 'lovelace'"


def test_text_without_a_segment_says_where_to_search_it(operator_client, seeded):
    response = operator_client.get("/threadmill/search/", {"q": "ada@example.com"})
    assert response.status_code == 404
    assert "open a segment and search there" in response.content.decode()


@pytest.mark.parametrize(
    "query",
    [{}, {"q": ""}, {"q": "   "}, {"q": "x" * 201}, {"q": "ada", "segment": "doing"}],
)
def test_a_bad_search_is_a_400(operator_client, seeded, query):
    assert operator_client.get("/threadmill/search/", query).status_code == 400


def test_every_page_has_the_search_box(operator_client, seeded):
    for url in ["/threadmill/", "/threadmill/workers/", "/threadmill/audit/", "/threadmill/schedules/",
                f"/threadmill/default/task/{seeded['ready']}/"]:  # fmt: skip
        assert 'action="/threadmill/search/" role="search"' in operator_client.get(url).content.decode(), url
    html = operator_client.get("/threadmill/default/default/failed/").content.decode()
    assert '<input type="hidden" name="segment" value="failed">' in html
