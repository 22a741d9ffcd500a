"""The task page's attempt timeline: one row per attempt, the wait before the first start, escaped."""

from __future__ import annotations

import json
import re
import time
from datetime import UTC, datetime

from tests.inspector.conftest import TASK_KEY
from threadmill.base import Segment
from threadmill.outcome import error_of, mark_failed, mark_successful


def _rows(html: str) -> list[str]:
    table = re.search(r'<table class="timeline" id="task-timeline">(.*?)</table>', html, re.DOTALL)
    assert table, "the page has no timeline"
    rows = re.findall(r"<tr class=.*?</tr>", table[1], re.DOTALL)
    return [re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", row)).strip() for row in rows]


def test_the_task_page_shows_a_row_per_attempt_and_the_wait_before_the_first_start(operator_client, backend):
    from tests.tasks import echo

    task_id = echo.enqueue("x").id
    (first,) = backend.acquire("default", count=1, worker="w-1", token_base="a")
    started = first.lease_started_at.timestamp() + 0.25
    object.__setattr__(first, "ran", (started, started + 1.5))
    mark_failed(first, error_of(ValueError("first <b>try</b>")), datetime.now(UTC))
    assert backend.requeue(first)
    backend.acquire("default", count=1, worker="w-2", token_base="b")

    html = operator_client.get(f"/threadmill/default/task/{task_id}/").content.decode()
    rows = _rows(html)
    assert len(rows) == 2
    assert rows[0].startswith("1 w-1 ") and "1.500 s failed ValueError: first &lt;b&gt;try&lt;/b&gt;" in rows[0]
    assert rows[1].startswith("2 w-2 ") and rows[1].endswith("— — — running —")
    assert "<b>try</b>" not in html
    assert re.search(r"Waited \d+\.\d{3} s from enqueue to its first start\.", html)


def test_a_task_run_by_an_older_release_shows_its_workers_without_a_500(operator_client, backend, raw):
    from tests.tasks import echo
    from threadmill.backends import codec

    task_id = echo.enqueue("x").id
    (leased,) = backend.acquire("default", count=1, worker="old:1", token_base="a")
    # The previous release's acknowledge: the result stored, no attempt record.
    mark_successful(leased, datetime.now(UTC))
    entry = (task_id, "default", leased.lease_token, codec.encode_result(leased, 1), Segment.SUCCESSFUL)
    assert backend.scripts.acknowledge([entry], 60, int(time.time() // 60)) == [1]
    assert raw.hget(TASK_KEY + task_id, "attempts") is None

    response = operator_client.get(f"/threadmill/default/task/{task_id}/")
    assert response.status_code == 200
    html = response.content.decode()
    assert _rows(html) == ["1 old:1 — — — — not recorded —"]
    assert "from enqueue to its first lease (its start was not recorded)" in html


def test_hostile_attempt_records_are_escaped_or_left_out(operator_client, backend, raw):
    from tests.tasks import echo

    task_id = echo.enqueue("x").id
    hostile = json.dumps(["<img src=x onerror=alert(1)>", time.time(), None, None, "<script>", "<i>e</i>"])
    raw.hset(TASK_KEY + task_id, "attempts", "{broken\n" + hostile)

    html = operator_client.get(f"/threadmill/default/task/{task_id}/").content.decode()
    assert "<img src=x" not in html and "<script>" not in html and "<i>e</i>" not in html
    assert "&lt;img src=x onerror=alert(1)&gt;" in html
