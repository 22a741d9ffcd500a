"""add_to_workflow.lua through its wrapper and the running workflow's reads, key by key, with a leased caller."""

from __future__ import annotations

import dataclasses

import pytest
from django.tasks import TaskResultStatus, task_backends

from tests import tasks
from threadmill.api import workflows as api_workflows
from threadmill.base import Segment
from threadmill.exceptions import WorkflowError
from threadmill.running_workflow import RunningWorkflow
from threadmill.workflows import MAX_EDGES, MAX_TASKS, Workflow

PREFIX = "threadmill:{default}"


@pytest.fixture
def backend():
    return task_backends["default"]


@pytest.fixture
def graph(backend):
    """A workflow root -> (caller, bystander) -> join, bystander -> elsewhere, root final; its run, nodes, leases."""
    wf = Workflow(name="graph")
    nodes = {"root": wf.add(tasks.echo, name="root")}
    nodes["caller"] = wf.add(tasks.echo, after=[nodes["root"]], name="caller")
    nodes["bystander"] = wf.add(tasks.echo, after=[nodes["root"]], name="bystander")
    nodes["join"] = wf.add(tasks.echo, after=[nodes["caller"], nodes["bystander"]], name="join")
    nodes["elsewhere"] = wf.add(tasks.echo, after=[nodes["bystander"]], name="elsewhere")
    run = wf.enqueue()
    _acknowledge(backend, backend.acquire("default", worker="w")[0])
    leased = {r.id: r for r in backend.acquire("default", worker="w", count=2)}
    return run, nodes, leased[nodes["caller"].id], leased[nodes["bystander"].id]


def _acknowledge(backend, leased) -> None:
    assert backend.acknowledge(dataclasses.replace(leased, status=TaskResultStatus.SUCCESSFUL)) is True


def _workflow(backend, leased) -> RunningWorkflow:
    return RunningWorkflow(backend, leased, backend.running_workflow(leased.id))


def _stored(backend) -> dict[bytes, object]:
    # A hash as a dict: a DUMP of one being rehashed lists its fields in another order.
    client = backend.client
    return {k: client.hgetall(k) if client.type(k) == b"hash" else client.dump(k) for k in client.keys(f"{PREFIX}*")}


def test_a_plain_task_has_no_running_workflow(backend):
    result = tasks.echo.enqueue()
    assert backend.running_workflow(result.id) is None


def test_the_running_workflow_names_its_node_and_its_parents(backend, graph):
    run, nodes, caller, _bystander = graph
    workflow = _workflow(backend, caller)
    assert (workflow.id, workflow.name, workflow.node) == (run.id, "graph", "caller")
    assert repr(workflow) == f"<RunningWorkflow {run.id} 'graph', node 'caller'>"
    assert list(workflow.parents) == ["root"]
    assert workflow.parents["root"].id == nodes["root"].id
    assert workflow.parents["root"].status == TaskResultStatus.SUCCESSFUL


def test_add_stores_a_waiting_child_of_the_caller_that_the_before_node_waits_for(backend, graph):
    run, nodes, caller, _bystander = graph
    added = _workflow(backend, caller).add(tasks.spell, ("x",), before=["join"])
    client, join = backend.client, nodes["join"].id
    assert added.name == "spell"
    assert backend.get_result(added.id).segment is Segment.WAITING
    assert client.smembers(f"{PREFIX}:pending:{added.id}") == {caller.id.encode()}
    assert added.id.encode() in client.smembers(f"{PREFIX}:children:{caller.id}")
    assert client.smembers(f"{PREFIX}:pending:{join}") == {
        n.encode() for n in (caller.id, nodes["bystander"].id, added.id)
    }
    assert client.smembers(f"{PREFIX}:children:{added.id}") == {join.encode()}
    record = client.hgetall(f"{PREFIX}:workflow:{run.id}")
    assert (record[b"total"], record[b"waiting"], record[f"added_parents:{join}".encode()]) == (
        b"6",
        b"3",
        added.id.encode(),
    )
    read = backend.get_workflow(run.id)
    assert list(read.tasks) == ["root", "caller", "bystander", "join", "elsewhere", "spell"]
    assert read.counts["WAITING"] == 3


def test_the_callers_outcome_releases_the_added_task_and_the_join_waits_for_it(backend, graph):
    _run, nodes, caller, bystander = graph
    added = _workflow(backend, caller).add(tasks.echo, before=["join"], name="extra")
    _acknowledge(backend, bystander)
    _acknowledge(backend, caller)
    assert backend.get_result(added.id).segment is Segment.READY
    assert backend.get_result(nodes["join"].id).segment is Segment.WAITING
    leased = {r.id: r for r in backend.acquire("default", worker="w", count=2)}  # extra and elsewhere
    _acknowledge(backend, leased[added.id])
    assert backend.get_result(nodes["join"].id).segment is Segment.READY
    [join] = backend.acquire("default", worker="w")
    assert join.id == nodes["join"].id
    parents = _workflow(backend, join).parents
    assert sorted(parents) == ["bystander", "caller", "extra"]
    assert all(result.status == TaskResultStatus.SUCCESSFUL for result in parents.values())


def test_a_failed_caller_fails_the_added_task_and_the_join_with_it(backend, graph):
    _run, nodes, caller, _bystander = graph
    added = _workflow(backend, caller).add(tasks.echo, before=["join"], on_parent_failure="run", name="clean")
    assert backend.acknowledge(dataclasses.replace(caller, status=TaskResultStatus.FAILED)) is True
    assert backend.get_result(added.id).segment is Segment.READY  # its policy is "run"
    assert backend.get_result(nodes["join"].id).segment is Segment.FAILED  # the caller was its parent too


@pytest.mark.parametrize(
    ("before", "message"),
    [
        (["root"], "before= names 'root', which has started or is final"),
        (["bystander"], "before= names 'bystander', which has started or is final"),
        (["elsewhere"], "before= names 'elsewhere', which is not a child of this task"),
        (["join", "nowhere"], "before= names 'nowhere', which is not a node of workflow"),
    ],
)
def test_a_bad_before_raises_and_stores_nothing(backend, graph, before, message):
    _run, _nodes, caller, _bystander = graph
    stored = _stored(backend)
    with pytest.raises(WorkflowError, match=message):
        _workflow(backend, caller).add(tasks.echo, before=before)
    assert _stored(backend) == stored


def test_a_before_task_of_another_workflow_raises_and_stores_nothing(backend, graph):
    _run, _nodes, caller, _bystander = graph
    other = Workflow()
    stranger = other.add(tasks.echo, after=[other.add(tasks.echo)], name="stranger")
    other.enqueue()
    workflow = _workflow(backend, caller)
    workflow._stored.ids["stranger"] = stranger.id  # as a stale or forged name would resolve
    stored = _stored(backend)
    with pytest.raises(WorkflowError, match="before= names 'stranger', which is not a task of this workflow"):
        workflow.add(tasks.echo, before=["stranger"])
    assert _stored(backend) == stored


def test_a_full_workflow_a_taken_name_a_stale_lease_and_a_finished_caller_raise_and_store_nothing(backend, graph):
    run, _nodes, caller, _bystander = graph
    workflow = _workflow(backend, caller)
    stored = _stored(backend)
    with pytest.raises(WorkflowError, match="The node name 'root' is taken"):
        workflow.add(tasks.echo, name="root")
    assert _stored(backend) == stored
    backend.client.hset(f"{PREFIX}:workflow:{run.id}", "total", MAX_TASKS)
    stored = _stored(backend)
    with pytest.raises(WorkflowError, match=f"at most {MAX_TASKS} tasks"):
        workflow.add(tasks.echo)
    assert _stored(backend) == stored
    backend.client.hset(f"{PREFIX}:workflow:{run.id}", "total", 5)
    stored = _stored(backend)
    stale = dataclasses.replace(caller, lease_token="a-lease-taken-back")
    with pytest.raises(WorkflowError, match="this task is no longer running"):
        _workflow(backend, stale).add(tasks.echo)
    assert _stored(backend) == stored
    _acknowledge(backend, caller)
    stored = _stored(backend)
    with pytest.raises(WorkflowError, match="this task is no longer running"):
        workflow.add(tasks.echo)
    assert _stored(backend) == stored


def test_a_default_name_another_task_took_meanwhile_moves_to_the_next_number(backend, graph):
    _run, _nodes, caller, _bystander = graph
    first, second = _workflow(backend, caller), _workflow(backend, caller)
    assert first.add(tasks.echo).name == "echo"
    assert second.add(tasks.echo).name == "echo_2"
    assert first.add(tasks.echo).name == "echo_3"


def test_a_task_this_workflow_cannot_hold_raises_before_anything_is_sent(backend, graph):
    _run, _nodes, caller, _bystander = graph
    stored = _stored(backend)
    with pytest.raises(WorkflowError, match="cannot have unique="):
        _workflow(backend, caller).add(tasks.unique_echo)
    with pytest.raises(WorkflowError, match="on_parent_failure must be one of"):
        _workflow(backend, caller).add(tasks.echo, on_parent_failure="ignore")
    assert _stored(backend) == stored


def test_a_task_added_with_a_per_task_limit_is_stored_as_a_limited_enqueue_stores_one(backend, graph):
    _run, _nodes, caller, _bystander = graph
    added = _workflow(backend, caller).add(tasks.three_at_a_time, (1,), before=["join"])
    client = backend.client
    assert client.hget(f"{PREFIX}:task:{added.id}", "limit_path") == b"tests.tasks.three_at_a_time"
    assert client.hget(f"{PREFIX}:task-limits", "tests.tasks.three_at_a_time") == b"3||"
    assert client.hget(f"{PREFIX}:limited-queues", "default") == b"1"
    assert backend.get_result(added.id).segment is Segment.WAITING


def test_a_parent_whose_result_expired_is_left_out_of_the_parents(backend, graph):
    _run, nodes, caller, _bystander = graph
    backend.client.delete(f"{PREFIX}:task:{nodes['root'].id}")
    parents = _workflow(backend, caller).parents
    assert (len(parents), list(parents), parents.get("root")) == (0, [], None)


def test_before_takes_names_nodes_and_one_name_alone_and_counts_each_once(backend, graph):
    run, nodes, caller, _bystander = graph
    workflow = _workflow(backend, caller)
    first = workflow.add(tasks.echo, before="join")
    second = workflow.add(tasks.echo, before=[first, nodes["join"], "join"])
    join = nodes["join"].id
    assert backend.client.smembers(f"{PREFIX}:pending:{first.id}") == {caller.id.encode(), second.id.encode()}
    added = backend.client.hget(f"{PREFIX}:workflow:{run.id}", f"added_parents:{join}")
    assert added == f"{first.id},{second.id}".encode()
    with pytest.raises(WorkflowError, match="which is not a node of workflow"):
        workflow.add(tasks.echo, before=[dataclasses.replace(first, id="another-id")])


def test_a_retried_caller_that_names_its_addition_gets_the_earlier_node_and_stores_nothing(backend, graph):
    _run, _nodes, caller, _bystander = graph
    workflow = _workflow(backend, caller)
    first = workflow.add(tasks.echo, before=["join"], name="chunk")
    with pytest.raises(WorkflowError, match="The node name 'chunk' is taken"):
        workflow.add(tasks.echo, name="chunk")  # the same run: a second node of that name
    assert backend.requeue(caller) is True
    [retried] = [r for r in backend.acquire("default", worker="w", count=2) if r.id == caller.id]
    again = _workflow(backend, retried)
    stored = _stored(backend)
    assert again.add(tasks.echo, before=["join"], name="chunk") == first
    assert _stored(backend) == stored
    with pytest.raises(WorkflowError, match="The node name 'chunk' is taken"):
        again.add(tasks.echo, name="chunk")
    with pytest.raises(WorkflowError, match="The node name 'join' is taken"):
        again.add(tasks.echo, name="join")  # a node the caller did not add is never returned


def test_a_bad_name_raises_and_stores_nothing(backend, graph):
    _run, _nodes, caller, _bystander = graph
    stored = _stored(backend)
    for bad in ("", ["a list"]):
        with pytest.raises(WorkflowError, match="A node name must be a non-empty text"):
            _workflow(backend, caller).add(tasks.echo, name=bad)
    assert _stored(backend) == stored


def test_the_record_counts_the_dependencies_and_an_add_grows_the_count(backend, graph):
    run, _nodes, caller, _bystander = graph
    record = f"{PREFIX}:workflow:{run.id}"
    assert backend.client.hget(record, "edges") == b"5"
    _workflow(backend, caller).add(tasks.echo, before=["join"])  # its caller's edge and one before= edge
    assert backend.client.hget(record, "edges") == b"7"


def test_an_add_past_max_edges_raises_and_stores_nothing(backend, graph):
    run, _nodes, caller, _bystander = graph
    workflow = _workflow(backend, caller)
    backend.client.hset(f"{PREFIX}:workflow:{run.id}", "edges", MAX_EDGES - 1)
    stored = _stored(backend)
    with pytest.raises(WorkflowError, match=f"at most {MAX_EDGES} dependencies; node 'echo' and its before= edges"):
        workflow.add(tasks.echo, before=["join"])  # two edges: one too many
    assert _stored(backend) == stored
    workflow.add(tasks.echo)  # one edge: the last one it holds
    assert backend.client.hget(f"{PREFIX}:workflow:{run.id}", "edges") == str(MAX_EDGES).encode()


def test_an_add_to_a_record_stored_without_its_edge_count_counts_the_graph_it_read(backend, graph):
    run, _nodes, caller, _bystander = graph
    backend.client.hdel(f"{PREFIX}:workflow:{run.id}", "edges")  # as an older release's enqueue stored it
    _workflow(backend, caller).add(tasks.echo, before=["join"])
    assert backend.client.hget(f"{PREFIX}:workflow:{run.id}", "edges") == b"7"


def test_get_workflow_and_the_console_show_the_edges_an_add_gave_a_before_node(backend, graph):
    run, _nodes, caller, _bystander = graph
    added = _workflow(backend, caller).add(tasks.spell, ("x",), before=["join"])
    result = backend.get_workflow(run.id)
    assert result.parents["join"] == ("caller", "bystander", "spell")
    assert result.parents["spell"] == ("caller",)
    assert backend.workflow_with_parents(run.id)[1]["join"] == ["caller", "bystander", "spell"]
    # The console draws the join a layer below the task it now waits for (caller 1, spell 2, join 3).
    page = api_workflows.workflow("default", run.id)
    depth = {task.name: depth for depth, layer in page.layers for task in layer}
    assert (depth["caller"], depth["spell"], depth["join"]) == (1, 2, 3)
    join = next(task for _, layer in page.layers for task in layer if task.name == "join")
    assert join.parents == ("caller", "bystander", "spell")
    relatives = api_workflows.task_workflow("default", added.id)
    assert [child.name for child in relatives.children] == ["join"]
    assert "spell" in [parent.name for parent in api_workflows.task_workflow("default", join.id).parents]


def test_a_retried_caller_gets_the_earlier_attempts_unnamed_additions_in_order_and_stores_nothing(backend, graph):
    run, _nodes, caller, _bystander = graph
    workflow = _workflow(backend, caller)
    first = [workflow.add(tasks.echo, before=["join"]), workflow.add(tasks.spell, ("x",))]
    assert [node.name for node in first] == ["echo", "spell"]
    record = f"{PREFIX}:workflow:{run.id}"
    assert backend.client.hget(record, f"unnamed_added:{caller.id}") == f"{first[0].id},{first[1].id}".encode()
    assert backend.requeue(caller) is True
    [retried] = [r for r in backend.acquire("default", worker="w", count=2) if r.id == caller.id]
    again = _workflow(backend, retried)
    stored = _stored(backend)
    assert [again.add(tasks.echo, before=["join"]), again.add(tasks.spell, ("x",))] == first
    assert _stored(backend) == stored
    third = again.add(tasks.echo)  # past the earlier attempt's: a new task
    assert third.name == "echo_2"
    assert backend.client.hget(record, f"unnamed_added:{caller.id}").decode().split(",")[-1] == third.id


def test_cancel_workflow_cancels_a_before_node_ahead_of_the_task_added_for_it(backend, graph):
    run, nodes, caller, _bystander = graph
    added = _workflow(backend, caller).add(tasks.spell, ("x",), before=["join"])
    assert backend.cancel_workflow(run.id) >= 2
    for task_id in (nodes["join"].id, added.id):  # children first: neither fails because of the other
        assert backend.get_result(task_id).errors[-1].exception_class_path == "threadmill.exceptions.TaskCancelled"
