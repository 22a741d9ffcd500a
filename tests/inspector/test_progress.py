"""Progress and metadata in the console: the running rows, the task page and their escaping."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.django_db

HOSTILE = "<img src=x onerror=alert(1)>"


@pytest.fixture
def reporting(backend):
    """A running task that reported 3 of 4 with a hostile note, and hostile metadata."""
    from tests.tasks import echo

    echo.enqueue(1)
    [result] = backend.acquire("default", worker="w")
    progress = json.dumps({"done": 3, "total": 4, "note": HOSTILE})
    metadata = json.dumps({"source": HOSTILE, "rows": 3})
    assert backend.report([(result.id, result.lease_token, progress, metadata, False)]) == [1]
    return result


def test_a_running_row_shows_the_progress_bar_and_the_note_escaped(operator_client, reporting):
    html = operator_client.get("/threadmill/default/default/running/").content.decode()

    assert f'<span id="progress-{reporting.id}" class="progress"><progress max="4" value="3">75%</progress>' in html
    assert "&lt;img src=x onerror=alert(1)&gt;" in html and HOSTILE not in html
    assert 'id="running-progress"' in html and 'hx-trigger="every 2s"' in html


def test_the_running_page_poll_returns_only_the_progress_cells_for_an_out_of_band_swap(operator_client, reporting):
    headers = {"HX-Request": "true", "HX-Trigger": "running-progress"}
    html = operator_client.get("/threadmill/default/default/running/", headers=headers).content.decode()

    assert html.startswith(f'<span id="progress-{reporting.id}" class="progress" hx-swap-oob="true">')
    assert "<table" not in html and HOSTILE not in html


def test_the_task_page_shows_progress_and_metadata_escaped(operator_client, reporting):
    html = operator_client.get(f"/threadmill/default/task/{reporting.id}/").content.decode()

    assert '<progress max="4" value="3">75%</progress>' in html
    assert 'id="task-metadata"' in html and "&quot;rows&quot;: 3" in html
    assert HOSTILE not in html and "&lt;img src=x onerror=alert(1)&gt;" in html


def test_a_task_without_reports_says_so(operator_client, seeded):
    html = operator_client.get(f"/threadmill/default/task/{seeded['ready']}/").content.decode()

    assert '<p class="muted" id="task-metadata">None set.</p>' in html and "<progress" not in html
