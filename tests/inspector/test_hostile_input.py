"""Every URL parameter and POST field of the console, drawn by hypothesis: no response is a 500, and an
action given bad input loses no task and requeues no task whose worker is alive unless forced.

Each example starts from the same world on the session's server: one task in every segment of the
default queue (its running task held by a worker that never sent a heartbeat) and one running task
on `emails` held by a worker whose heartbeat is fresh. Requests come from a staff user with the
change permission, with the CSRF token, with and without htmx's headers. The runs are derandomized,
so the same examples run every time.
"""

from __future__ import annotations

from urllib.parse import quote, urlencode

import pytest
from django.test import Client
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from tests.inspector.conftest import TASK_KEY, heartbeat, seed

pytestmark = pytest.mark.django_db

#: The examples each view gets; derandomized, so every run draws the same ones.
EXAMPLES = 75
HYPOTHESIS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    database=None,  # nothing written under the working tree
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

SEGMENTS = ["ready", "deferred", "running", "successful", "failed", "unreadable"]
#: Values that broke, or nearly broke, a parser once: digits int() refuses, int()'s digit limit,
#: anchors, NUL, markup, paths that climb, and words forms treat as true.
NASTY = ["", " ", "0", "-1", "1", "2", "²", "③", "①", "1\n", "1 ", "٣", "9" * 11, "9" * 4301, "\x00", "\n", "a\nb",
         "<script>alert(1)</script>", "../..", "%2e%2e", "..", ".", "a" * 201, "true", "false", "on", "yes", "YES",
         "tests.tasks.add", "tests.tasks.add\n", "builtins.RuntimeError", "-enqueued_at", "enqueued_at", "{}", "[]",
         "default", "emails", "selected", "view"]  # fmt: skip

text = st.text(max_size=40)  # any Unicode but lone surrogates: NUL, newlines, other scripts' digits
header_text = st.text(st.characters(min_codepoint=0x20, max_codepoint=0xFF, exclude_characters="\x7f"), max_size=40)


def value(*valid: str) -> st.SearchStrategy[str]:
    """A field's value: a valid one, a nasty one, or anything."""
    return st.one_of(st.sampled_from([*valid, *NASTY]), text)


def numeric(*valid: str) -> st.SearchStrategy[str]:
    """A number field's hostile value: nasty, digits of any script (some pass isdigit() but not int()), or too long."""
    return st.one_of(
        value(*valid),
        st.text(st.characters(categories=["Nd", "No"]), min_size=1, max_size=4),
        st.integers(4290, 4400).map(lambda digits: "1" * digits),  # int() reads at most 4,300 digits
    )


def mostly(*valid: str) -> st.SearchStrategy[str]:
    """Mostly a valid value, else a nasty one or anything: hostile, yet often deep enough to reach an action."""
    good = st.sampled_from(valid)
    return st.one_of(good, good, good, good, st.sampled_from(NASTY), text)


@st.composite
def route(draw, *choices: tuple[str, ...]) -> str:
    """A URL path of one segment per tuple of valid values: all valid, or one of them hostile."""
    hostile = draw(st.sampled_from([None] * 6 + list(range(len(choices)))))
    parts = [draw(value(*valid) if i == hostile else st.sampled_from(valid)) for i, valid in enumerate(choices)]
    return "/".join(quote(part, safe="") for part in parts)  # a '/' drawn becomes %2F, which the server decodes


@st.composite
def form(draw, **fields: tuple[st.SearchStrategy, st.SearchStrategy]) -> dict:
    """POST data of (valid, hostile) strategies per field: all valid, or one field hostile. None leaves a field out."""
    hostile = draw(st.sampled_from([None] * 4 + list(fields)))
    drawn = {name: draw(bad if name == hostile else good) for name, (good, bad) in fields.items()}
    return {name: v for name, v in drawn.items() if v is not None}


def optional(*valid: str) -> tuple[st.SearchStrategy, st.SearchStrategy]:
    """An optional field: absent or valid, or (hostile) a nasty value or anything."""
    return st.sampled_from([None, *valid]), value(*valid)


BACKENDS, QUEUES = ("default",), ("default", "emails")
#: Which seeded task an id field names; the world gives the ids.
TASKS = (*SEGMENTS, "live")


#: htmx's request headers, from none to every one of them with junk in it.
htmx_headers = st.one_of(
    st.just({}),
    st.just({"HX-Request": "true"}),
    st.fixed_dictionaries({"HX-Request": st.just("true"), "HX-Boosted": st.just("true")}),
    st.fixed_dictionaries({"HX-Request": header_text}),
    st.fixed_dictionaries(
        {"HX-Request": st.just("true")},
        optional={
            "HX-Boosted": st.one_of(st.just("true"), header_text),
            "HX-Target": st.one_of(st.sampled_from(["tasks-table", "task-status", "queues-table"]), header_text),
            "HX-Target-URI-AutoEncoded": st.just("true"),
            "HX-Trigger": header_text,
            "HX-Trigger-Name": header_text,
            "HX-Current-URL": header_text,
            "HX-History-Restore-Request": st.just("true"),
            "HX-Prompt": header_text,
        },
    ),
)


# -- the world each example starts from ---------------------------------------------------


@pytest.fixture
def world(backend, raw):
    """Rebuild the same tasks before each example; return a function doing it and giving the ids."""
    from tests.tasks import echo

    def rebuild() -> dict[str, str]:
        raw.flushdb()
        ids = seed(backend, raw)
        ids["live"] = echo.using(queue_name="emails").enqueue("live").id
        (leased,) = backend.acquire("emails", count=1, worker="live:1")
        assert leased.id == ids["live"]
        heartbeat(backend, "live:1")
        return ids

    return rebuild


def inventory(raw) -> dict[str, tuple[str, str]]:
    """Return every task the server holds: id -> (its hash's queue and segment), and every segment entry."""
    out = {}
    for key in raw.scan_iter(match=TASK_KEY + "*", count=1000):
        queue_name, segment = raw.hmget(key, "queue", "segment")
        out[key.decode().removeprefix(TASK_KEY)] = ((queue_name or b"").decode(), (segment or b"").decode())
    for queue_name in ("default", "emails", "reports"):
        for segment in SEGMENTS:
            for task_id in raw.zrange(f"threadmill:{{default}}:{queue_name}:{segment}", 0, -1):
                assert out.get(task_id.decode()) == (queue_name, segment), "a segment entry without its task hash"
    return out


@pytest.fixture
def operator_csrf(operator_client) -> tuple[Client, str]:
    operator_client.get("/threadmill/audit/")
    return operator_client, operator_client.cookies["csrftoken"].value


def request(client: Client, method: str, url: str, headers: dict, data=None, token: str = ""):
    if method == "GET":
        response = client.get(url, headers=headers)
    else:
        response = client.post(url, data or {}, headers={**headers, "X-CSRFToken": token})
    assert response.status_code < 500, f"{method} {url!r} {data!r} {headers!r} -> {response.status_code}"
    event(f"{method} {response.status_code}")
    return response


# -- pages ----------------------------------------------------------------------------------


#: A page's query: its page number, and other keys a page ignores.
query = form(
    page=(st.sampled_from([None, "1", "2"]), numeric("1", "2")),
    extra=(st.none(), st.dictionaries(st.sampled_from(["sort", "task", "error", "view", "ids", "x"]) | text, text)),
)


def flat(params: dict) -> dict:
    return {**params.get("extra", {}), **{k: v for k, v in params.items() if k != "extra"}}


@HYPOTHESIS
@given(path=st.sampled_from(["", "workers/", "audit/", "schedules/", "metrics"]), params=query, headers=htmx_headers)
def test_the_overview_workers_and_audit_pages_answer_any_query_without_a_500(
    operator_csrf, seeded, path, params, headers
):
    client, _ = operator_csrf
    request(client, "GET", f"/threadmill/{path}?{urlencode(flat(params))}", headers)


@HYPOTHESIS
@given(
    path=route(BACKENDS, ("default", "emails", "reports"), tuple(SEGMENTS)),
    params=form(
        page=(st.sampled_from([None, "1", "2", "40"]), numeric("1", "2", "40")),
        sort=optional("enqueued_at", "-enqueued_at"),
        task=optional("tests.tasks.add", "tests.tasks.echo"),
        error=optional("builtins.RuntimeError"),
        lease=optional("gone", "overdue"),
        q=optional("1", "ada", "tests"),
    ),
    headers=htmx_headers,
)
def test_a_segment_page_answers_any_path_and_query_without_a_500(operator_csrf, seeded, path, params, headers):
    client, _ = operator_csrf
    request(client, "GET", f"/threadmill/{path}/?{urlencode(params)}", headers)


@HYPOTHESIS
@given(path=route(BACKENDS, ("task",), TASKS), query=query, headers=htmx_headers)
def test_a_task_page_answers_any_id_without_a_500(operator_csrf, world, path, query, headers):
    client, _ = operator_csrf
    request(client, "GET", f"/threadmill/{with_ids(path, world())}/?{urlencode(flat(query))}", headers)


def with_ids(path: str, ids: dict[str, str]) -> str:
    """Put the world's task ids where a path names a seeded task by its segment."""
    backend, kind, name = path.split("/")
    return f"{backend}/{kind}/{quote(ids.get(name, name), safe='')}" if kind == "task" else path


# -- actions ---------------------------------------------------------------------------------


def unchanged_unless_done(before: dict, after: dict, response, *, may_remove: bool) -> None:
    """A refused action (anything but a redirect) changes nothing; a done one loses a task only if it removes."""
    if response.status_code != 302:
        assert after == before, "a refused action changed tasks"
    elif may_remove:
        assert set(after) <= set(before)
    else:
        assert set(after) == set(before), "a requeue lost or made a task"


def live_task_stays_unless_forced(ids: dict, after: dict, force) -> None:
    if force != "yes":
        assert after[ids["live"]] == ("emails", "running"), "a task on a live worker was requeued without force"


@HYPOTHESIS
@given(
    path=route(BACKENDS, ("task",), TASKS),
    data=form(force=optional("yes"), junk=(st.none(), text)),
    headers=htmx_headers,
)
def test_requeue_one_task_answers_any_input_without_a_500_and_loses_nothing(
    operator_csrf, world, raw, path, data, headers
):
    client, token = operator_csrf
    ids = world()
    before = inventory(raw)
    response = request(client, "POST", f"/threadmill/{with_ids(path, ids)}/requeue/", headers, data, token)
    after = inventory(raw)
    unchanged_unless_done(before, after, response, may_remove=False)
    live_task_stays_unless_forced(ids, after, data.get("force"))


#: A selection: names of seeded tasks (the world gives their ids), or (hostile) anything.
selection = (
    st.lists(st.sampled_from(TASKS), min_size=1, max_size=4),
    st.one_of(
        st.lists(st.one_of(st.sampled_from(TASKS), st.sampled_from(NASTY), text), max_size=6),
        st.integers(501, 520).map(lambda count: [f"id-{i}" for i in range(count)]),  # past the most allowed
    ),
)


@HYPOTHESIS
@given(
    action=st.sampled_from(["requeue", "delete"]),
    path=route(BACKENDS, QUEUES, tuple(SEGMENTS)),
    data=form(
        scope=(st.sampled_from(["selected", "view"]), value("selected", "view")),
        ids=selection,
        task=optional("tests.tasks.add", "tests.tasks.echo"),
        error=optional("builtins.RuntimeError"),
        confirmed=optional("yes"),
        force=optional("yes"),
    ),
    headers=htmx_headers,
)
def test_requeue_and_delete_answer_any_form_without_a_500_and_lose_nothing_they_refuse(
    operator_csrf, world, raw, action, path, data, headers
):
    client, token = operator_csrf
    ids = world()
    data["ids"] = [ids.get(pick, pick) for pick in data.get("ids", [])]
    before = inventory(raw)
    response = request(client, "POST", f"/threadmill/{path}/{action}/", headers, data, token)
    after = inventory(raw)
    unchanged_unless_done(before, after, response, may_remove=action == "delete")
    if action == "requeue":
        live_task_stays_unless_forced(ids, after, data.get("force"))


@HYPOTHESIS
@given(
    method=st.sampled_from(["GET", "POST"]),
    path=route(BACKENDS, QUEUES, tuple(SEGMENTS)),
    data=form(confirm=(st.sampled_from(["default", "emails", "default "]), value("default", "emails", "Default"))),
    headers=htmx_headers,
)
def test_purge_answers_any_input_without_a_500_and_removes_only_when_confirmed(
    operator_csrf, world, raw, method, path, data, headers
):
    client, token = operator_csrf
    world()
    before = inventory(raw)
    response = request(client, method, f"/threadmill/{path}/purge/", headers, data, token)
    after = inventory(raw)
    unchanged_unless_done(before, after, response, may_remove=True)
    if response.status_code == 302:
        backend, queue, _ = path.split("/")
        assert (backend, data["confirm"].strip()) == ("default", queue)  # the form strips what is typed


@HYPOTHESIS
@given(
    params=form(
        q=(st.sampled_from(["ready", "failed", "live", "ada", "tests.tasks"]), value("ready", "live", "x" * 200)),
        backend=optional("default"),
        queue=optional("default", "emails"),
        segment=optional(*SEGMENTS),
    ),
    headers=htmx_headers,
)
def test_the_search_answers_any_query_without_a_500(operator_csrf, world, params, headers):
    client, _ = operator_csrf
    ids = world()
    params["q"] = ids.get(params["q"], params["q"]) if "q" in params else ""
    response = request(client, "GET", f"/threadmill/search/?{urlencode(params)}", headers)
    if response.status_code == 302:
        location = response.headers["Location"]
        assert location.startswith("/threadmill/")
        request(client, "GET", location, headers)  # where it sends the user answers too


@pytest.fixture
def workflow_ids(backend) -> dict[str, str]:
    """A three-task workflow, its root run: its id and its tasks' ids by name (the pages read, never write)."""
    from tests.inspector.conftest import finish
    from tests.tasks import echo
    from threadmill.workflows import Workflow

    wf = Workflow(name="<b>w</b>")
    root = wf.add(echo, ("<i>x</i>",), name="root")
    wf.add(echo, after=[root], name="<script>x</script>")
    wf.add(echo, after=[root], name="leaf")
    run = wf.enqueue()
    finish(backend, backend.acquire("default", count=1, worker="ghost:1")[0])
    return {"workflow": run.id, **{name: task.id for name, task in run.tasks.items()}}


@HYPOTHESIS
@given(
    target=value("", "workflow", "root", "leaf"),
    params=form(
        page=(st.sampled_from([None, "1", "2"]), numeric("1", "2")),
        state=optional("running", "finished", "successful", "failed"),
        backend=optional("default"),
    ),
    headers=htmx_headers,
)
def test_the_workflow_pages_answer_any_id_and_query_without_a_500(operator_csrf, workflow_ids, target, params, headers):
    client, _ = operator_csrf
    path = quote(workflow_ids.get(target, target), safe="")
    response = request(
        client, "GET", f"/threadmill/workflows/{path + '/' if path else ''}?{urlencode(params)}", headers
    )
    valid = params.get("page") in (None, "1") and params.get("backend") in (None, "default")
    valid = valid and params.get("state") in (None, "running", "finished", "successful", "failed")
    if target in ("", "workflow") and valid:
        assert response.status_code == 200, (path, params)
    if target == "workflow" and response.status_code == 200:
        assert "<script>x" not in response.content.decode()


@HYPOTHESIS
@given(
    target=value("workflow", "root"),
    action=value("cancel", "retry"),
    backend=st.one_of(st.sampled_from([None, "default"]), value("default")),
    data=form(junk=(st.none(), text)),
    headers=htmx_headers,
)
def test_the_workflow_actions_answer_any_id_and_input_without_a_500(
    operator_csrf, workflow_ids, target, action, backend, data, headers
):
    client, token = operator_csrf
    path = quote(workflow_ids.get(target, target), safe="")
    query = urlencode({"backend": backend} if backend is not None else {})
    url = f"/threadmill/workflows/{path}/{quote(action, safe='')}/?{query}"
    response = request(client, "POST", url, headers, data, token)
    if target == "workflow" and action in ("cancel", "retry") and backend in (None, "default"):
        assert response.status_code == 302, url


# -- operator controls ---------------------------------------------------------------------------


@HYPOTHESIS
@given(
    method=st.sampled_from(["GET", "POST", "POST", "POST"]),
    path=route(BACKENDS, ("default", "emails", "reports"), ("pause", "resume")),
    data=form(junk=(st.none(), text)),
    headers=htmx_headers,
)
def test_pause_and_resume_answer_any_input_without_a_500_and_touch_no_task(
    operator_csrf, world, raw, backend, method, path, data, headers
):
    client, token = operator_csrf
    world()
    before = inventory(raw)
    response = request(client, method, f"/threadmill/{path}/", headers, data, token)
    assert inventory(raw) == before
    if response.status_code != 302:
        assert backend.paused_queues() == {}, "a refused pause paused a queue"


@HYPOTHESIS
@given(
    path=route(BACKENDS, ("live:1", "ghost:1", "box:1"), ("quiet", "stop")),
    data=form(junk=(st.none(), text)),
    headers=htmx_headers,
)
def test_a_worker_command_answers_any_input_without_a_500_and_stores_only_for_a_live_worker(
    operator_csrf, world, raw, backend, path, data, headers
):
    client, token = operator_csrf
    world()
    backend.heartbeat("box:1", {"worker": "box:1", "host": "box", "pid": 1, "state": "running"}, publish=False)
    response = request(client, "POST", f"/threadmill/workers/{path}/", headers, data, token)
    assert set(backend.pending_control()) == ({"box:1"} if response.status_code == 302 else set())


@HYPOTHESIS
@given(
    path=route(BACKENDS, ("default", "emails", "reports")),
    data=form(force=optional("yes"), ids=selection, junk=(st.none(), text)),
    headers=htmx_headers,
)
def test_requeue_orphaned_answers_any_input_without_a_500_and_never_moves_a_live_lease(
    operator_csrf, world, raw, path, data, headers
):
    client, token = operator_csrf
    ids = world()
    before = inventory(raw)
    response = request(client, "POST", f"/threadmill/{path}/running/requeue-orphaned/", headers, data, token)
    after = inventory(raw)
    unchanged_unless_done(before, after, response, may_remove=False)
    assert after[ids["live"]] == ("emails", "running"), "requeue all orphaned moved a task on a live worker"


@HYPOTHESIS
@given(
    method=st.sampled_from(["GET", "POST", "POST", "POST"]),
    path=route(BACKENDS, ("nightly-echo", "other"), ("pause", "resume", "run")),
    data=form(junk=(st.none(), text)),
    headers=htmx_headers,
)
def test_a_schedule_control_answers_any_input_without_a_500(
    operator_csrf, world, raw, backend, monkeypatch, method, path, data, headers
):
    import zoneinfo

    from threadmill.schedules import parse_schedules

    entries = {"nightly-echo": {"task": "tests.tasks.echo", "cron": "0 3 * * *"}}
    monkeypatch.setattr(backend, "schedules", parse_schedules("default", entries, zoneinfo.ZoneInfo("UTC")))
    client, token = operator_csrf
    world()
    before = inventory(raw)
    response = request(client, method, f"/threadmill/schedules/{path}/", headers, data, token)
    if response.status_code != 302 or not path.endswith("/run"):
        assert inventory(raw) == before, "a schedule control other than a run changed tasks"


# -- the site's static files ---------------------------------------------------------------


@HYPOTHESIS
@given(path=st.lists(st.sampled_from(["..", ".", "", "inspector", "console.js", "%2e%2e", "\x00"]) | text, max_size=5))
def test_a_static_path_is_served_or_a_404_never_a_500(path):
    from django.test import RequestFactory

    from inspector.site.asgi import django_asgi_app
    from inspector.site.static import StaticFilesHandler

    handler = StaticFilesHandler(django_asgi_app)
    response = handler.get_response(RequestFactory().get("/static/" + "/".join(quote(p, safe="") for p in path)))
    assert response.status_code in (200, 304, 404)
