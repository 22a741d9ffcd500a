"""The Workflows pages through the Django test client: access, the list and its filter, a graph, a task's relatives, escaping."""

from __future__ import annotations

import re
from html import unescape

import pytest

from tests.inspector.conftest import finish

pytestmark = pytest.mark.django_db

HOSTILE_NAME = "<img src=x onerror=alert(1)>"
HOSTILE_ARG = "<script>alert(1)</script>"


def diamond(backend, name: str = "nightly <b>report</b>"):
    """Enqueue extract -> (hostile, transform) -> load; run extract, fail transform, and lease the hostile node.

    Leaves extract SUCCESSFUL, the hostile node RUNNING, transform FAILED and load FAILED (its parent failed).
    """
    from tests.tasks import echo
    from threadmill.workflows import Workflow

    wf = Workflow(name=name)
    top = wf.add(echo, ("top",), name="extract")
    left = wf.add(echo, (HOSTILE_ARG,), after=[top], name=HOSTILE_NAME)
    right = wf.add(echo, ("right",), after=[top], name="transform")
    wf.add(echo, ("join",), after=[left, right], name="load")
    run = wf.enqueue()
    [first] = backend.acquire("default", count=1, worker="ghost:1")
    finish(backend, first)
    leased = {r.id: r for r in backend.acquire("default", count=2, worker="ghost:1")}
    finish(backend, leased[right.id], fail=True)
    return run


def chain(length: int, name: str = "chain"):
    """Enqueue a chain of `length` echo tasks (nothing run)."""
    from tests.tasks import echo
    from threadmill.workflows import Workflow

    wf = Workflow(name=name)
    node = wf.add(echo, (0,))
    for i in range(1, length):
        node = wf.add(echo, (i,), after=[node])
    return wf.enqueue()


def test_the_workflow_pages_send_anonymous_users_to_log_in_and_refuse_other_users(client, client_as, backend):
    from django.contrib.auth.models import User

    run = chain(2)
    plain = client_as(User.objects.create_user("plain", password="pw"))
    for url in ("/threadmill/workflows/", f"/threadmill/workflows/{run.id}/"):
        response = client.get(url)
        assert response.status_code == 302 and "/admin/login/" in response["Location"], url
        assert plain.get(url).status_code == 403, url


def test_the_list_shows_each_workflow_newest_first_with_its_counts(operator_client, backend):
    older = diamond(backend, name="older")
    newer = chain(3, name="newer")
    response = operator_client.get("/threadmill/workflows/")
    assert response.status_code == 200
    html = response.content.decode()
    assert html.index(f'data-workflow="{newer.id}"') < html.index(f'data-workflow="{older.id}"')
    row = html[html.index(f'data-workflow="{older.id}"') :].split("</tr>")[0]
    assert 'data-state="running"' in row
    # total 4, waiting 0, ready or running 1, successful 1, failed 2
    assert re.findall(r'<td class="num">(\d+)</td>', row) == ["4", "0", "1", "1", "2"]
    assert 'class="active">Workflows</a>' in html


def test_the_state_filter_lists_only_workflows_in_that_state(operator_client, backend):
    running = diamond(backend, name="half-done")
    done = chain(1, name="done")
    [task] = backend.acquire("default", count=1, worker="ghost:1")
    finish(backend, task)
    successful = operator_client.get("/threadmill/workflows/?state=successful").content.decode()
    assert done.id in successful and running.id not in successful
    assert "1 workflow successful" in successful
    still = operator_client.get("/threadmill/workflows/?state=running").content.decode()
    assert running.id in still and done.id not in still
    finished = operator_client.get("/threadmill/workflows/?state=finished").content.decode()
    assert done.id in finished and running.id not in finished
    # A filtered list scans records, so it is not live; the unfiltered one opens the websocket.
    assert "ws-connect" not in finished
    assert (
        'ws/?view=workflows&amp;backend=default&amp;page=1"'
        in operator_client.get("/threadmill/workflows/").content.decode()
    )


def test_the_list_pages_fifty_workflows_at_a_time(operator_client, backend):
    ids = [chain(1, name=f"w{i}").id for i in range(55)]
    first = operator_client.get("/threadmill/workflows/").content.decode()
    second = operator_client.get("/threadmill/workflows/?page=2").content.decode()
    assert "55 workflows · page 1 of 2" in first
    assert all(i in first for i in ids[5:]) and not any(i in first for i in ids[:5])
    assert all(i in second for i in ids[:5])
    assert 'ws/?view=workflows&amp;backend=default&amp;page=2"' in second
    assert '<ul class="pagination" hx-boost="false">' in second  # a new page opens its own socket
    assert operator_client.get("/threadmill/workflows/?page=3").status_code == 404


def test_the_list_as_an_htmx_request_renders_only_its_table(operator_client, backend):
    chain(2)
    html = operator_client.get("/threadmill/workflows/", headers={"HX-Request": "true"}).content.decode()
    assert html.lstrip().startswith('<div id="workflows-table"')
    assert "<html" not in html


@pytest.mark.parametrize(
    ("query", "says"),
    [
        ("state=paused", "The state filter is one of running, finished, successful, failed, not 'paused'."),
        ("page=0", "The page number must be a whole number"),
        ("backend=nope", "No threadmill backend is configured as 'nope'."),
    ],
)
def test_a_bad_list_query_is_a_400_naming_the_problem(operator_client, query, says):
    response = operator_client.get(f"/threadmill/workflows/?{query}")
    assert response.status_code == 400
    assert says in unescape(response.content.decode())


def test_a_workflow_page_draws_each_task_by_depth_with_its_state(operator_client, backend):
    run = diamond(backend)
    response = operator_client.get(f"/threadmill/workflows/{run.id}/")
    assert response.status_code == 200
    html = response.content.decode()
    layers = re.findall(r'<section class="layer" data-depth="(\d)">(.*?)</section>', html, re.DOTALL)
    drawn = {depth: re.findall(r'data-node="([^"]*)" data-state="(\w+)"', body) for depth, body in layers}
    assert drawn == {
        "0": [("extract", "SUCCESSFUL")],
        "1": [("&lt;img src=x onerror=alert(1)&gt;", "RUNNING"), ("transform", "FAILED")],
        "2": [("load", "FAILED")],
    }
    for name, task in run.tasks.items():
        assert f'href="/threadmill/default/task/{task.id}/"' in html, name
    assert 'data-count="failed">2<' in html and 'data-count="successful">1<' in html
    # Unfinished: the page opens the console's websocket on its workflow, and polls only while it is closed.
    assert f'ws/?view=workflow&amp;backend=default&amp;workflow={run.id}&amp;page=1"' in html
    assert 'hx-trigger="every 2s" hx-swap="outerHTML" hx-disinherit="*" data-poll="fallback"' in html
    policy = response.headers["Content-Security-Policy"]
    assert "script-src 'self'" in policy and "unsafe-inline" not in policy


def test_a_deferred_root_is_drawn_deferred_and_its_child_waiting(operator_client, backend):
    from datetime import UTC, datetime, timedelta

    from tests.tasks import echo
    from threadmill.workflows import Workflow

    wf = Workflow(name="later")
    root = wf.add(echo.using(run_after=datetime.now(UTC) + timedelta(hours=1)), ("root",), name="root")
    wf.add(echo, after=[root], name="child")
    run = wf.enqueue()
    html = operator_client.get(f"/threadmill/workflows/{run.id}/").content.decode()
    assert re.findall(r'data-node="([^"]*)" data-state="(\w+)"', html) == [("root", "DEFERRED"), ("child", "WAITING")]


def test_a_workflow_page_escapes_hostile_names(operator_client, backend):
    run = diamond(backend, name="<script>alert('wf')</script>")
    html = operator_client.get(f"/threadmill/workflows/{run.id}/").content.decode()
    assert "<script>alert" not in html and "<img src=x" not in html
    assert "&lt;script&gt;alert(&#x27;wf&#x27;)&lt;/script&gt;" in html
    listed = operator_client.get("/threadmill/workflows/").content.decode()
    assert "<script>alert" not in listed


def test_a_finished_workflow_page_stops_refreshing(operator_client, backend):
    run = chain(1)
    [task] = backend.acquire("default", count=1, worker="ghost:1")
    finish(backend, task)
    html = operator_client.get(f"/threadmill/workflows/{run.id}/").content.decode()
    assert 'id="workflow-state">successful<' in html
    assert "hx-trigger" not in html.split('id="workflow-graph"')[1].split(">")[0]
    assert "ws-connect" not in html


def test_a_workflow_page_as_an_htmx_request_renders_only_its_graph(operator_client, backend):
    run = chain(3)
    html = operator_client.get(f"/threadmill/workflows/{run.id}/", headers={"HX-Request": "true"}).content.decode()
    assert html.lstrip().startswith('<div id="workflow-graph"')
    assert "<html" not in html and html.count('class="node ') == 3


def test_an_unknown_workflow_is_a_404_page(operator_client, backend):
    for url in ("/threadmill/workflows/no-such-id/", "/threadmill/workflows/no-such-id/?backend=default"):
        response = operator_client.get(url)
        assert response.status_code == 404, url
        assert "No workflow with id 'no-such-id' is stored." in unescape(response.content.decode())


def test_a_big_workflow_page_draws_one_page_of_its_tasks(operator_client, backend):
    from threadmill.api.workflows import GRAPH_PAGE

    run = chain(450)
    first = operator_client.get(f"/threadmill/workflows/{run.id}/").content.decode()
    assert first.count('class="node ') == GRAPH_PAGE
    assert f"Tasks 1–{GRAPH_PAGE} of 450, by depth · page 1 of 3" in first
    last = operator_client.get(f"/threadmill/workflows/{run.id}/?page=3").content.decode()
    assert last.count('class="node ') == 450 - 2 * GRAPH_PAGE
    assert 'data-depth="449"' in last and 'data-depth="0"' not in last


def test_a_workflow_task_page_shows_its_workflow_parents_and_children(operator_client, backend):
    run = diamond(backend, name="nightly")
    transform = run.tasks["transform"]
    html = operator_client.get(f"/threadmill/default/task/{transform.id}/").content.decode()
    assert f'href="/threadmill/workflows/{run.id}/?backend=default" id="task-workflow-link">nightly<' in html
    parents = html.split('id="task-parents"')[1].split("</ul>")[0]
    children = html.split('id="task-children"')[1].split("</ul>")[0]
    assert re.findall(r'data-node="([^"]*)" data-state="(\w+)"', parents) == [("extract", "SUCCESSFUL")]
    assert re.findall(r'data-node="([^"]*)" data-state="(\w+)"', children) == [("load", "FAILED")]
    root = operator_client.get(f"/threadmill/default/task/{run.tasks['extract'].id}/").content.decode()
    assert "None: it ran first." in root


def test_a_task_whose_workflow_record_expired_says_so(operator_client, backend):
    run = chain(2)
    backend.client.delete(f"threadmill:{{default}}:workflow:{run.id}")  # what its expiry does
    html = operator_client.get(f"/threadmill/default/task/{run.tasks['echo'].id}/").content.decode()
    assert 'id="task-workflow-expired"' in html and 'id="task-parents"' not in html
    assert f"/threadmill/workflows/{run.id}/" in html
    assert operator_client.get(f"/threadmill/workflows/{run.id}/").status_code == 404


def test_a_plain_task_page_shows_no_workflow(operator_client, backend):
    from tests.tasks import echo

    html = operator_client.get(f"/threadmill/default/task/{echo.enqueue(1).id}/").content.decode()
    assert 'id="task-workflow"' not in html


# -- actions ---------------------------------------------------------------------------


def test_cancel_and_retry_are_offered_only_to_who_may_act(operator_client, client_as, viewer, backend):
    run = diamond(backend)
    url = f"/threadmill/workflows/{run.id}/"
    page = operator_client.get(url).content.decode()
    assert f'action="/threadmill/workflows/{run.id}/cancel/?backend=default" id="cancel-workflow"' in page
    assert f'action="/threadmill/workflows/{run.id}/retry/?backend=default" id="retry-workflow"' in page
    assert page.count('name="csrfmiddlewaretoken"') >= 2
    read_only = client_as(viewer).get(url).content.decode()
    assert 'id="workflow-actions"' not in read_only


def test_a_workflow_action_needs_a_post_with_csrf_and_the_change_permission(client_as, viewer, operator, backend):
    from tests.inspector.conftest import csrf_post

    run = chain(3)
    for action in ("cancel", "retry"):
        url = f"/threadmill/workflows/{run.id}/{action}/"
        assert csrf_post(client_as(viewer), url, {}).status_code == 403
        assert client_as(operator).post(url, {}).status_code == 403  # no CSRF token
        assert client_as(operator).get(url).status_code == 405
    run.refresh()
    assert run.counts["WAITING"] == 2 and run.counts["FAILED"] == 0


def test_cancel_fails_every_task_not_run_and_is_audited(operator_client, backend):
    from inspector.models import AuditEntry
    from tests.inspector.conftest import csrf_post

    run = chain(3)
    response = csrf_post(operator_client, f"/threadmill/workflows/{run.id}/cancel/", {})
    assert response.status_code == 302
    assert response["Location"] == f"/threadmill/workflows/{run.id}/?backend=default"
    run.refresh()
    assert run.counts["FAILED"] == 3
    assert {t.errors[-1].exception_class_path for t in run.tasks.values()} == {"threadmill.exceptions.TaskCancelled"}
    entry = AuditEntry.objects.get()
    assert (entry.action, entry.backend, entry.scope, entry.count, entry.username) == (
        "cancel", "default", f"workflow {run.id}", 3, "operator",
    )  # fmt: skip
    page = operator_client.get(response["Location"]).content.decode()
    assert f"Workflow {run.id}: 3 tasks cancelled, or asked to abort if running." in page
    again = csrf_post(operator_client, f"/threadmill/workflows/{run.id}/cancel/", {})
    assert "every task of it had finished" in unescape(operator_client.get(again["Location"]).content.decode())


def test_retry_runs_the_failed_tasks_again_after_their_parents_and_is_audited(operator_client, backend):
    from inspector.models import AuditEntry
    from tests.inspector.conftest import csrf_post

    run = diamond(backend)
    response = csrf_post(operator_client, f"/threadmill/workflows/{run.id}/retry/", {})
    assert response.status_code == 302
    run.refresh()
    # transform is ready again; load waits for it (its other parent is still running).
    assert (run.tasks["transform"].status, run.tasks["load"].segment.value) == ("READY", "waiting")
    assert run.counts["FAILED"] == 0 and run.counts["SUCCESSFUL"] == 1
    entry = AuditEntry.objects.get()
    assert (entry.action, entry.scope, entry.count) == ("retry", f"workflow {run.id}", 2)
    page = operator_client.get(response["Location"]).content.decode()
    assert f"Workflow {run.id}: 2 tasks will run again." in page
    assert 'id="retry-workflow"' not in page  # nothing failed now


def test_an_action_on_an_unknown_workflow_is_a_404_and_audits_nothing(operator_client, backend):
    from inspector.models import AuditEntry
    from tests.inspector.conftest import csrf_post

    for action in ("cancel", "retry"):
        for query in ("", "?backend=default"):
            assert csrf_post(operator_client, f"/threadmill/workflows/nope/{action}/{query}", {}).status_code == 404
    assert not AuditEntry.objects.exists()


def test_cancel_on_a_waiting_task_s_page_cancels_it_and_fails_its_child_upstream(operator_client, backend):
    from inspector.models import AuditEntry
    from tests.inspector.conftest import csrf_post

    run = chain(3, name="cancel-waiting")
    _, middle, last = [r.id for r in run.tasks.values()]
    page = operator_client.get(f"/threadmill/default/task/{middle}/").content.decode()
    assert 'id="cancel-task"' in page and "Cancel this task" in page

    response = csrf_post(operator_client, f"/threadmill/default/task/{middle}/cancel/", {})

    assert response.status_code == 302
    assert f"Cancelled task {middle}: it will not run." in operator_client.get(response["Location"]).content.decode()
    assert backend.get_result(middle).errors[-1].exception_class_path == "threadmill.exceptions.TaskCancelled"
    assert backend.get_result(last).errors[-1].exception_class_path == "threadmill.exceptions.UpstreamFailed"
    entry = AuditEntry.objects.get()
    assert (entry.action, entry.segment, entry.count, entry.task_ids) == ("cancel", "waiting", 1, [middle])


def test_cancel_all_of_the_waiting_view_cancels_each_waiting_task(operator_client, backend):
    from inspector.models import AuditEntry
    from tests.inspector.conftest import csrf_post

    run = chain(3, name="cancel-view")
    first, middle, last = [r.id for r in run.tasks.values()]
    url = "/threadmill/default/default/waiting/cancel/"
    assert "Cancel selected…" in operator_client.get("/threadmill/default/default/waiting/").content.decode()
    confirm = csrf_post(operator_client, url, {"scope": "view"}).content.decode()
    assert 'id="cancel-count">2 tasks<' in confirm

    done = csrf_post(operator_client, url, {"scope": "view", "confirmed": "yes"})

    assert done.status_code == 302 and done["Location"] == "/threadmill/default/default/waiting/"
    assert [backend.get_result(i).status for i in (middle, last)] == ["FAILED", "FAILED"]
    assert backend.get_result(first).status == "READY"
    # The view lists the middle task first: its cancel fails its child upstream, which the cancel then finds finished.
    assert backend.get_result(last).errors[-1].exception_class_path == "threadmill.exceptions.UpstreamFailed"
    assert AuditEntry.objects.get().task_ids == [middle]
    page = operator_client.get(done["Location"]).content.decode()
    assert "Cancelled 1 task; abort requested for 0 running tasks; 1 already finished." in page


def test_deleting_or_purging_the_waiting_segment_is_a_400_naming_the_cancel_and_changes_nothing(
    operator_client, backend
):
    from inspector.models import AuditEntry
    from tests.inspector.conftest import csrf_post

    run = chain(2, name="no-purge")
    _, waiting = [r.id for r in run.tasks.values()]
    page = operator_client.get("/threadmill/default/default/waiting/").content.decode()
    assert "Cancel selected…" in page and "Delete selected…" not in page and "Purge waiting…" not in page
    base = "/threadmill/default/default/waiting"
    answers = [
        csrf_post(operator_client, f"{base}/delete/", {"scope": "selected", "ids": [waiting], "confirmed": "yes"}),
        operator_client.get(f"{base}/purge/"),
        csrf_post(operator_client, f"{base}/purge/", {"confirm": "default"}),
    ]
    for response in answers:
        assert response.status_code == 400
        assert "Waiting workflow tasks cannot be deleted or purged" in response.content.decode()
    assert backend.get_result(waiting).segment == "waiting"
    assert backend.get_workflow(run.id).counts["WAITING"] == 1
    assert AuditEntry.objects.count() == 0
    with pytest.raises(ValueError, match="Cancel them instead"):
        backend.purge("default", segment="waiting")


def test_on_three_partitions_the_list_merges_them_and_a_workflows_page_and_cancel_find_it(operator_client, settings):
    from tests.inspector.conftest import csrf_post
    from tests.servers import partition
    from threadmill.backends.partitions import partition_of

    backend = partition(settings)
    ids = [chain(2, name=f"w{i}").id for i in range(55)]
    assert {partition_of(workflow_id) for workflow_id in ids} == {0, 1, 2}
    first = operator_client.get("/threadmill/workflows/").content.decode()
    second = operator_client.get("/threadmill/workflows/?page=2").content.decode()
    assert "55 workflows · page 1 of 2" in first
    assert [first.index(f'data-workflow="{i}"') for i in reversed(ids[5:])] == sorted(
        first.index(f'data-workflow="{i}"') for i in ids[5:]
    )  # newest first across the partitions
    assert all(i in second for i in ids[:5]) and not any(i in first for i in ids[:5])
    target = next(i for i in ids if partition_of(i) == 2)
    page = operator_client.get(f"/threadmill/workflows/{target}/").content.decode()
    assert all(task.id in page for task in backend.get_workflow(target).tasks.values())
    assert csrf_post(operator_client, f"/threadmill/workflows/{target}/cancel/", {}).status_code == 302
    assert backend.get_workflow(target).counts["FAILED"] == 2
