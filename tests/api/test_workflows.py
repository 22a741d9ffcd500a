"""The workflows tooling API on a real server: list pages, filters, one workflow's graph page, a task's relatives, and what each reads."""

from __future__ import annotations

import pytest
from django.tasks import task_backends

from tests.inspector.conftest import finish
from tests.tasks import echo
from tests.test_cost_budget import command_calls
from threadmill import api
from threadmill.api.workflows import GRAPH_PAGE, RELATIVES_SHOWN
from threadmill.workflows import Workflow


@pytest.fixture
def backend():
    return task_backends["default"]


def fan(width: int, name: str = "fan"):
    """Enqueue a root, `width` children of it and one join of them all (nothing run)."""
    wf = Workflow(name=name)
    root = wf.add(echo, ("root",), name="root")
    middle = [wf.add(echo, (i,), after=[root], name=f"step-{i}") for i in range(width)]
    wf.add(echo, ("join",), after=middle, name="join")
    return wf.enqueue()


def test_a_list_page_reads_its_records_counts_never_their_graphs(backend):
    runs = [fan(2, name=f"w{i}") for i in range(3)]
    api.get_backend("default")  # its layout checked, once a process
    backend.client.config_resetstat()
    found = api.workflows.workflows("default", first=0, count=2)
    calls = command_calls(backend.client)
    assert [row.id for row in found.rows] == [runs[2].id, runs[1].id]
    assert (found.total, found.complete) == (3, True)
    assert (found.rows[0].total, found.rows[0].waiting, found.rows[0].active) == (4, 3, 1)
    assert calls == {"zcard": 1, "zrevrange": 1, "hmget": 2}


def test_a_filtered_list_counts_every_match_and_pages_them(backend):
    runs = [fan(1, name=f"w{i}") for i in range(4)]
    lone = Workflow(name="lone")
    lone.add(echo, ("x",))
    done = lone.enqueue()
    [task] = backend.acquire("default", count=1, worker="ghost:1")
    while task.id != done.tasks["echo"].id:  # the roots of the fans were enqueued first
        [task] = backend.acquire("default", count=1, worker="ghost:1")
    finish(backend, task)
    running = api.workflows.workflows("default", state="running", first=1, count=2)
    assert running.total == 4 and [r.id for r in running.rows] == [runs[2].id, runs[1].id]
    assert [r.id for r in api.workflows.workflows("default", state="successful").rows] == [done.id]
    assert api.workflows.workflows("default", state="failed").rows == []
    with pytest.raises(ValueError, match="A workflow's state is one of running, finished, successful, failed"):
        api.workflows.workflows("default", state="paused")


def test_a_workflow_page_of_ten_thousand_tasks_reads_the_states_of_one_page_only(backend):
    run = fan(9_998)
    api.get_backend("default")  # its layout checked, once a process
    backend.client.config_resetstat()
    graph = api.workflows.workflow("default", run.id, page=2)
    calls = command_calls(backend.client)
    assert calls == {"hgetall": 1, "hget": GRAPH_PAGE}
    assert (graph.page, graph.pages, graph.shown_from, graph.shown_to) == (2, 50, 201, 400)
    assert graph.layer_sizes == [(0, 1), (1, 9_998), (2, 1)]
    assert [depth for depth, _ in graph.layers] == [1]
    assert graph.states == {"WAITING": GRAPH_PAGE}
    assert graph.summary.total == 10_000 and graph.summary.waiting == 9_999
    last = api.workflows.workflow("default", run.id, page=10**6)
    assert last.page == 50 and last.layers[-1][1][-1].name == "join"
    assert last.layers[-1][1][-1].parents[:2] == ("step-0", "step-1")


def test_a_task_lists_at_most_fifty_relatives_of_each_kind_and_counts_the_rest(backend):
    run = fan(120)
    relatives = api.workflows.task_workflow("default", run.tasks["join"].id)
    assert (relatives.workflow_id, relatives.workflow_name, relatives.node) == (run.id, "fan", "join")
    assert len(relatives.parents) == RELATIVES_SHOWN and relatives.more_parents == 120 - RELATIVES_SHOWN
    assert relatives.children == [] and relatives.more_children == 0
    root = api.workflows.task_workflow("default", run.tasks["root"].id)
    assert root.parents == [] and len(root.children) == RELATIVES_SHOWN and root.more_children == 70
    assert {child.state for child in root.children} == {"WAITING"}
    assert api.workflows.task_workflow("default", echo.enqueue(1).id) is None


def test_an_unknown_workflow_raises_task_result_does_not_exist(backend):
    with pytest.raises(api.TaskResultDoesNotExist, match="No workflow with id 'nope' is stored."):
        api.workflows.workflow("default", "nope")
    assert api.workflows.find_workflow(["default"], "nope") is None


def test_a_filtered_list_past_its_scan_limit_says_its_count_is_a_lower_bound(backend, monkeypatch):
    monkeypatch.setattr(api.workflows, "SCAN_BATCH", 2)
    monkeypatch.setattr(api.workflows, "WORKFLOW_SCAN_LIMIT", 4)
    runs = [fan(1, name=f"w{i}") for i in range(6)]
    found = api.workflows.workflows("default", state="running")
    assert (found.total, found.complete) == (4, False)
    assert [row.id for row in found.rows] == [run.id for run in reversed(runs[2:])]
    assert api.workflows.workflows("default", state="running", first=0, count=50).complete is False
    monkeypatch.setattr(api.workflows, "WORKFLOW_SCAN_LIMIT", 6)
    assert api.workflows.workflows("default", state="running").complete is True
