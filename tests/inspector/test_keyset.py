"""Segment pages of a partitioned alias (`OPTIONS["partitions"]` = 3) page by cursor; filtered views and P = 1 by number."""

from __future__ import annotations

import html
import re

import pytest

from inspector.tables import PER_PAGE
from tests.servers import partition

pytestmark = pytest.mark.django_db

READY = "/threadmill/default/default/ready/"
_ROW_ID = re.compile(r'<a href="/threadmill/default/task/([^/"]+)/" class="mono">')


def _link(page: str, rel: str) -> str | None:
    """Return the query string of the table's `rel` link (first, previous, next), or None when there is none."""
    found = re.search(rf'<li class="{rel}"><a href="([^"]+)">', page)
    return html.unescape(found[1]) if found else None


def _ids(page: str) -> list[str]:
    return _ROW_ID.findall(page)


@pytest.fixture(params=["valkey", "cluster"])
def where(request):
    """A single Valkey server, then the session's three-primary Valkey Cluster."""
    from tests.conftest import _server

    return _server(request.param)


@pytest.fixture
def partitioned(settings):
    """The `default` alias on the session's Valkey, in three partitions."""
    return partition(settings)


def walk(client, url: str, rel: str) -> list[list[str]]:
    """Follow the table's `rel` links from `url` to the end; return each page's task ids in order."""
    pages = []
    while url:
        assert len(pages) < 10, f"the {rel} links go round: {url}"
        response = client.get(url)
        assert response.status_code == 200
        page = response.content.decode()
        pages.append(_ids(page))
        query = _link(page, rel)
        url = READY + query if query else None
    return pages


def test_a_partitioned_segment_pages_by_cursor_forward_and_back_in_queue_order(operator_client, settings, where):
    backend = partition(settings, where)
    from tests.tasks import echo

    ids = [echo.enqueue(i).id for i in range(120)]  # one partition after another, in turn
    assert len({id[-2:] for id in ids}) == 3 and len(backend.covered_partitions()) == 3
    first = operator_client.get(READY).content.decode()
    assert "120 tasks" in first and " of 3" not in first and _link(first, "previous") is None
    forward = walk(operator_client, READY, "next")
    assert [len(p) for p in forward] == [PER_PAGE, PER_PAGE, 20]
    assert [task_id for p in forward for task_id in p] == ids

    second = operator_client.get(READY + _link(first, "next")).content.decode()
    last = operator_client.get(READY + _link(second, "next")).content.decode()
    assert "120 tasks" in last and _link(last, "next") is None and _link(last, "first") == "?"
    backward = walk(operator_client, READY + _link(last, "previous"), "previous")
    assert backward == [forward[1], forward[0]]


def test_reversing_the_sort_pages_newest_first_by_cursor(operator_client, partitioned):
    from tests.tasks import echo

    ids = [echo.enqueue(i).id for i in range(60)]
    pages = walk(operator_client, READY + "?sort=-enqueued_at", "next")
    assert pages == [ids[::-1][:PER_PAGE], ids[::-1][PER_PAGE:]]
    second = operator_client.get(READY + "?sort=-enqueued_at").content.decode()
    query = _link(second, "next")
    assert "sort=-enqueued_at" in query and "after=" in query
    deep = operator_client.get(READY + query).content.decode()
    # The header's sort link starts the other order from its head: a cursor of this order means nothing there.
    sort_link = html.unescape(re.search(r'<th scope="col"><a href="([^"]+)">Enqueued</a>', deep)[1])
    assert "after=" not in sort_link and "sort=enqueued_at" in sort_link


def test_an_htmx_page_link_swaps_the_table_and_keeps_the_cursor_and_the_sort(operator_client, partitioned):
    from tests.tasks import echo

    ids = [echo.enqueue(i).id for i in range(120)]
    query = _link(operator_client.get(READY + "?sort=enqueued_at").content.decode(), "next")
    headers = {"HX-Request": "true", "HX-Boosted": "true", "HX-Target": "tasks-table"}
    partial = operator_client.get(READY + query, headers=headers).content.decode()
    assert partial.lstrip().startswith('<div id="tasks-table"') and "<html" not in partial
    assert _ids(partial) == ids[PER_PAGE : 2 * PER_PAGE] and "120 tasks" in partial
    after = _link(partial, "next")
    assert "sort=enqueued_at" in after and "after=" in after and "before=" not in after


def test_a_running_segment_pages_by_cursor_with_its_lease_columns(operator_client, partitioned):
    from tests.tasks import echo

    ids = {echo.enqueue(i).id for i in range(6)}
    leased = set()
    while batch := partitioned.acquire("default", count=6, worker="w:1"):  # one partition an acquire
        leased |= {r.id for r in batch}
    assert leased == ids
    page = operator_client.get("/threadmill/default/default/running/").content.decode()
    assert set(_ids(page)) == ids and "6 tasks" in page and "w:1" in page
    assert 'data-paging="cursor"' not in page  # one page: no links


def test_a_filtered_view_of_a_partitioned_alias_keeps_paging_by_number(operator_client, partitioned):
    from tests.tasks import add, echo

    ids = [echo.enqueue(i).id for i in range(60)]
    add.enqueue(1, 2)
    page = operator_client.get(READY + "?task=tests.tasks.echo&page=2").content.decode()
    assert "60 tasks matching · page 2 of 2" in page and 'data-paging="cursor"' not in page
    assert _ids(page) == ids[PER_PAGE:]
    # A cursor is not what a filtered view pages by: a well-formed one is ignored there.
    assert _ids(operator_client.get(READY + "?task=tests.tasks.echo&after=1~x").content.decode()) == ids[:PER_PAGE]


def test_one_partition_keeps_paging_by_number(operator_client, backend):
    from tests.tasks import echo

    ids = [echo.enqueue(i).id for i in range(60)]
    page = operator_client.get(READY + "?page=2&after=1~x").content.decode()
    assert "60 tasks · page 2 of 2" in page and _ids(page) == ids[PER_PAGE:]


@pytest.mark.parametrize(
    ("query", "reason"),
    [
        ("after=nope", "The &#x27;after&#x27; parameter is not a page cursor. A page cursor is a score and a task id"),
        ("before=12~bad%20id", "The &#x27;before&#x27; parameter is not a page cursor."),
        ("after=1e999~abc", "not &#x27;1e999~abc&#x27;."),
        ("after=12~" + "a" * 101, "The &#x27;after&#x27; parameter is not a page cursor."),
        ("after=12~a&before=12~b", "A page follows one cursor: give after or before, not both."),
    ],
)
def test_a_malformed_cursor_is_a_400_naming_the_problem(operator_client, partitioned, query, reason):
    response = operator_client.get(f"{READY}?{query}")
    assert response.status_code == 400
    assert reason in response.content.decode()


def test_a_cursor_past_the_end_shows_an_empty_page_with_a_way_back(operator_client, partitioned):
    from tests.tasks import echo

    echo.enqueue(1)
    page = operator_client.get(READY + "?after=inf~zzz").content.decode()
    assert _ids(page) == [] and "1 task" in page and _link(page, "first") == "?"
