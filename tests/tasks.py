"""Task functions the tests enqueue; module-level as django.tasks requires."""

import threading
import time

from django.tasks import task

from threadmill.retry import ExponentialBackoff


@task
def echo(value=None):
    return value


@task
def add(a, b):
    return a + b


@task(queue_name="emails")
def send_email(address):
    return f"sent to {address}"


@task(priority=10)
def urgent(value=None):
    return value


@task
def explode(message="boom"):
    raise RuntimeError(message)


@task(retry=ExponentialBackoff(base_delay=0.05, max_delay=0.2, max_retries=2, jitter=0))
def flaky(message="boom"):
    raise ValueError(message)


def never_retry(context):
    return None


@task(retry=never_retry)
def with_callback_policy():
    return "ok"


@task(takes_context=True)
def attempt_number(context):
    return context.attempt


@task
async def async_echo(value=None):
    return value


@task(unique=True)
def unique_echo(value=None):
    return value


def _by_user(args, kwargs):
    return f"user:{kwargs['user']}"


@task(unique_key=_by_user)
def unique_by_user(user, note=""):
    return note


def _not_a_string(args, kwargs):
    return 42


@task(unique_key=_not_a_string)
def unique_bad_key():
    return None


@task(unique_for=0.3)
def unique_briefly(value=None):
    return value


# -- worker tests ---------------------------------------------------------------------

_runs_client = None


def _runs():
    global _runs_client
    if _runs_client is None:
        import os

        import redis

        _runs_client = redis.Redis.from_url(os.environ["THREADMILL_TEST_REDIS_URL"])
    return _runs_client


@task
def sleep_for(seconds=0.0):
    import time

    time.sleep(seconds)
    return seconds


@task(
    retry=ExponentialBackoff(
        base_delay=0.05, max_retries=3, expected_exceptions=("threadmill.exceptions.AcknowledgementTimeout",), jitter=0
    )
)
def counted(key, seconds=0.0):
    """Count each run of `key` in the test server's `test:runs` hash, then sleep."""
    import time

    _runs().hincrby("test:runs", key, 1)
    time.sleep(seconds)
    return key


@task
async def event_loop_id():
    import asyncio

    await asyncio.sleep(0)
    return id(asyncio.get_running_loop())


@task(takes_context=True)
async def async_attempt(context, value=None):
    return [context.attempt, value]


@task(takes_context=True)
def count_then_exit(context, how="sys.exit"):
    """Count the start on the counter server, then end the way `how` names: BaseExceptions task code raises."""
    import sys

    _counter().hincrby("faults:started", context.task_result.id, 1)
    if how == "sys.exit":
        sys.exit(3)
    if how == "exit":
        exit()  # noqa: PLR1722 - the builtin a script would call
    if how == "KeyboardInterrupt":
        raise KeyboardInterrupt
    raise ValueError(f"unknown way to end: {how!r}")


@task(takes_context=True)
async def async_count_then_exit(context):
    import sys

    _counter().hincrby("faults:started", context.task_result.id, 1)
    sys.exit(4)


@task(
    takes_context=True,
    retry=ExponentialBackoff(base_delay=0.05, max_retries=2, expected_exceptions=("builtins.SystemExit",), jitter=0),
)
def count_then_exit_once(context):
    """Exit on the first attempt, succeed on the next: the retry policy decides about a SystemExit too."""
    import sys

    counter = _counter()
    if counter.hincrby("faults:started", context.task_result.id, 1) == 1:
        sys.exit(5)
    counter.hincrby("faults:finished", context.task_result.id, 1)
    return context.attempt


@task
def imported(module_name):
    """Return whether `module_name` is imported in the worker process running this task."""
    import sys

    return module_name in sys.modules


@task
def stamp(key):
    """Record when the task started (epoch seconds) in the test server's `test:stamps` hash."""
    import time

    started = time.time()
    _runs().hset("test:stamps", key, repr(started))
    return key


@task
def spell(key, seconds=0.0):
    """Record when the task started and ended (epoch seconds) in the test server's `test:spells` hash."""
    import time

    started = time.time()
    time.sleep(seconds)
    _runs().hset("test:spells", key, f"{started!r} {time.time()!r}")
    return key


# -- fault tests ----------------------------------------------------------------------

_counter_clients: dict[int, object] = {}


def _counter():
    """The run counter server's client, one per process (a forked child must not share its socket)."""
    import os

    import redis

    pid = os.getpid()
    if pid not in _counter_clients:
        _counter_clients.clear()
        _counter_clients[pid] = redis.Redis.from_url(os.environ["THREADMILL_TEST_COUNTER_URL"])
    return _counter_clients[pid]


@task(
    takes_context=True,
    retry=ExponentialBackoff(
        base_delay=0.05,
        max_retries=5,
        expected_exceptions=("threadmill.exceptions.AcknowledgementTimeout", "threadmill.exceptions.AttemptAbandoned"),
        jitter=0,
    ),
)
def count_run(context, sleep_ms=0, first_attempt_sleep_ms=None, padding=""):
    """Count each start and each finish of this task on the counter server, sleeping between.

    The first start sleeps `first_attempt_sleep_ms` instead when given, so a test can make
    one run outlive its lease or its shutdown and the next run be quick. `padding` only makes
    the stored task (and its result) larger.
    """
    import threading

    task_id = context.task_result.id
    counter = _counter()
    first = counter.hincrby("faults:started", task_id, 1) == 1
    slow = first_attempt_sleep_ms is not None and first
    # Not time.sleep: under libfaketime (the skewed-clock test) Python 3.13's time.sleep fails
    # with EINVAL, while a timed wait on a lock works.
    threading.Event().wait((first_attempt_sleep_ms if slow else sleep_ms) / 1000)
    counter.hincrby("faults:finished", task_id, 1)
    return task_id


@task(takes_context=True)
def count_run_without_retry(context, sleep_ms=0, first_attempt_sleep_ms=None):
    """Like count_run, with no retry policy: a lost lease fails it."""
    return count_run.func(context, sleep_ms, first_attempt_sleep_ms)


@task(takes_context=True)
def kill_own_process(context):
    """Count this start on the counter server, then SIGKILL the worker process running it (an OOM kill, a segfault)."""
    import os
    import signal

    _counter().hincrby("faults:started", context.task_result.id, 1)
    os.kill(os.getpid(), signal.SIGKILL)


# -- time limits ------------------------------------------------------------------------

#: The time limit of the time-limit tests' tasks, seconds.
SHORT_LIMIT_S = 0.3


def _count(name: str, context) -> int:
    return _counter().hincrby(f"faults:{name}", context.task_result.id, 1)


@task(takes_context=True, timeout=SHORT_LIMIT_S)
def sleep_past_limit(context):
    """Sleep in short steps far past the limit; count the start and the `finally`."""
    _count("started", context)
    try:
        for _ in range(1000):
            time.sleep(0.01)
        _count("finished", context)
    finally:
        _count("finally", context)


@task(takes_context=True, timeout=SHORT_LIMIT_S)
def stuck_in_c(context):
    """Block in one C call (select on nothing) that no asynchronous exception interrupts."""
    import select

    _count("started", context)
    select.select([], [], [], 30)
    _count("finished", context)


@task(takes_context=True, timeout=SHORT_LIMIT_S)
async def async_sleep_past_limit(context):
    """Await far past the limit; count the start, the cancellation and the `finally`."""
    import asyncio

    _count("started", context)
    try:
        await asyncio.sleep(30)
        _count("finished", context)
    except asyncio.CancelledError:
        _count("cancelled", context)
        raise
    finally:
        _count("finally", context)


@task(
    takes_context=True,
    timeout=SHORT_LIMIT_S,
    retry=ExponentialBackoff(
        base_delay=0.05, max_retries=2, expected_exceptions=("threadmill.exceptions.TaskTimeout",), jitter=0
    ),
)
def past_limit_once(context):
    """Sleep past the limit on the first attempt, return the attempt number on the next."""
    if _count("started", context) == 1:
        for _ in range(1000):
            time.sleep(0.01)
    _count("finished", context)
    return context.attempt


#: Long enough for three heartbeats at the fault tests' 0.5 s interval: the GIL is taken after one.
GIL_HOLDER_LIMIT_S = 1.5


@task(takes_context=True, timeout=GIL_HOLDER_LIMIT_S)
def hold_the_gil_once(context):
    """On the first attempt block in a C call that keeps the GIL (libc sleep through PyDLL): every thread stops."""
    import ctypes

    if _count("started", context) == 1:
        _wait_until_a_heartbeat_says_running(context, GIL_HOLDER_LIMIT_S - 0.2)
        ctypes.PyDLL(None).sleep(30)
    _count("finished", context)
    return context.attempt


def _wait_until_a_heartbeat_says_running(context, timeout_s: float) -> None:
    """Poll until the worker's stored heartbeat lists this task as running, not buffered.

    A lease whose last heartbeat still listed it as buffered goes back unblamed when its worker
    is lost; a test of the blamed path waits for the beat that says it started.
    """
    from django.tasks import task_backends

    result = context.task_result
    backend = task_backends[result.backend]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        document = backend.worker_document(result.lease_worker) or {}
        if result.id in document.get("running", ()):
            return
        time.sleep(0.01)
    raise TimeoutError(f"no heartbeat of {result.lease_worker!r} listed {result.id} as running")


# -- progress and metadata ------------------------------------------------------------


def _wait_for_key(key: str, timeout_s: float = 30.0) -> bool:
    """Wait until the test server holds `key` (the test's "go on"), polling with a deadline."""
    import time

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if _runs().exists(key):
            return True
        time.sleep(0.01)
    return False


@task
def report_then_wait(key, metadata=None):
    """Report progress 3 of 10 and `metadata`, wait for `key` on the test server, then report 10 of 10."""
    import threadmill

    threadmill.set_progress(3, 10, note="three down")
    threadmill.set_metadata(**(metadata or {}))
    _wait_for_key(key)
    threadmill.set_progress(10, 10, note="all done")
    threadmill.set_metadata(finished=True)
    return key


@task
def report_often(times):
    """Report progress `times` times in a row, and metadata as often."""
    import threadmill

    for i in range(times):
        threadmill.set_progress(i + 1, times, note=f"step {i + 1}")
        threadmill.set_metadata(step=i + 1)
    return times


@task
def report_badly():
    """Try each bad call; return the error each raised, then report one good value."""
    import threadmill

    calls = {
        "done": lambda: threadmill.set_progress("3"),
        "negative": lambda: threadmill.set_progress(-1),
        "over": lambda: threadmill.set_progress(11, 10),
        "nan": lambda: threadmill.set_progress(float("nan")),
        "note": lambda: threadmill.set_progress(1, note=5),
        "json": lambda: threadmill.set_metadata(when=object()),
        "large": lambda: threadmill.set_metadata(blob="x" * 70_000),
    }
    raised = {}
    for name, call in calls.items():
        try:
            call()
        except (TypeError, ValueError) as e:
            raised[name] = f"{type(e).__name__}: {e}"
    threadmill.set_progress(1, 2, note="good")
    threadmill.set_metadata(kept="yes")
    return raised


@task(retry=ExponentialBackoff(base_delay=0.01, max_retries=1, jitter=0))
def report_then_fail_once(key):
    """Store metadata and progress, fail on the first attempt, and on the second add to the metadata."""
    import threadmill

    if _runs().incr(key) == 1:
        threadmill.set_metadata(first="attempt", shared=1)
        threadmill.set_progress(5, 10, note="first attempt")
        raise RuntimeError("first attempt fails")
    threadmill.set_metadata(second="attempt", shared=2)
    return "second"


@task
def report_in_steps(keys):
    """Report step i of len(keys) and wait for keys[i] on the test server, for each key; then report all done."""
    import threadmill

    for i, key in enumerate(keys):
        threadmill.set_progress(i, len(keys), note=f"step {i} <b>of</b> {len(keys)}")
        threadmill.set_metadata(step=i, html="<script>alert(1)</script>")
        _wait_for_key(key)
    threadmill.set_progress(len(keys), len(keys), note="all done")
    return len(keys)


@task
def echo_reporting(value=None):
    """The echo task, reporting its progress once: what a task calling set_progress costs."""
    import threadmill

    threadmill.set_progress(1, 1, note="echoed")
    return value


# -- cancel and abort -------------------------------------------------------------------


@task(takes_context=True)
def wait_for_abort(context, timeout_s=30.0):
    """Count the start, poll `threadmill.aborting()` and record when it turned True (epoch seconds), then return."""
    import threadmill

    _count("started", context)
    deadline = time.monotonic() + timeout_s
    while not threadmill.aborting():
        if time.monotonic() > deadline:
            return "never aborted"
        time.sleep(0.005)
    _counter().hset("faults:aborting_at", context.task_result.id, repr(time.time()))
    _count("finished", context)
    return "returned"


@task(takes_context=True)
def ignore_abort(context):
    """Count the start, then sleep in short steps for 30 s whatever `aborting()` says; count the `finally`."""
    _count("started", context)
    try:
        for _ in range(3000):
            time.sleep(0.01)
        _count("finished", context)
    finally:
        _count("finally", context)


@task(takes_context=True)
async def async_ignore_abort(context):
    """Count the start, then await a 30 s sleep whatever `aborting()` says; count the `finally`."""
    import asyncio

    _count("started", context)
    try:
        await asyncio.sleep(30)
        _count("finished", context)
    finally:
        _count("finally", context)


@task(takes_context=True)
def abort_stuck_in_c(context):
    """Block in one C call that no asynchronous exception interrupts, past any abort grace."""
    import select

    _count("started", context)
    select.select([], [], [], 30)
    _count("finished", context)


# -- time limits and aborts, counted (no counter server needed) ---------------------------


def _sleep_in_steps(seconds: float) -> None:
    """Sleep in 10 ms steps, so an asynchronous exception (TaskTimeout, TaskCancelled) lands between two."""
    for _ in range(int(seconds * 100)):
        time.sleep(0.01)


@task(timeout=SHORT_LIMIT_S)
def past_its_limit():
    """Sleep 30 s in steps, far past its limit."""
    _sleep_in_steps(30)


@task(
    takes_context=True,
    timeout=SHORT_LIMIT_S,
    retry=ExponentialBackoff(
        base_delay=0.05, max_retries=1, expected_exceptions=("threadmill.exceptions.TaskTimeout",), jitter=0
    ),
)
def past_its_limit_first(context):
    """Sleep past the limit on the first attempt, return the attempt number on the next."""
    if context.attempt == 1:
        _sleep_in_steps(30)
    return context.attempt


@task
def until_aborted():
    """Sleep 30 s in steps, whatever `aborting()` says: the abort's grace ends it."""
    _sleep_in_steps(30)


# -- limits -------------------------------------------------------------------------------

#: Counts the running-at-once of count_concurrent runs and keeps their peak, atomically.
_ENTER = """
local now = redis.call('INCR', KEYS[1])
if now > tonumber(redis.call('GET', KEYS[2]) or '0') then
  redis.call('SET', KEYS[2], now)
end
return now
"""


@task(
    takes_context=True,
    retry=ExponentialBackoff(
        base_delay=0.05, max_retries=5, expected_exceptions=("threadmill.exceptions.AttemptAbandoned",), jitter=0
    ),
)
def count_concurrent(context, sleep_ms=0, first_attempt_sleep_ms=None):
    """Like count_run, also counting the runs at once (`limits:peak` their most) and each lease's start time.

    `limits:leases` gets the lease's start on the server's clock (what a rate limit spends a token on).
    """
    import threading

    task_id = context.task_result.id
    counter = _counter()
    first = counter.hincrby("faults:started", task_id, 1) == 1
    counter.eval(_ENTER, 2, "limits:running", "limits:peak")
    counter.rpush("limits:leases", repr(context.task_result.lease_started_at.timestamp()))
    try:
        slow = first_attempt_sleep_ms is not None and first
        threading.Event().wait((first_attempt_sleep_ms if slow else sleep_ms) / 1000)
    finally:
        counter.decr("limits:running")
    counter.hincrby("faults:finished", task_id, 1)
    return task_id


@task(concurrency=3)
def three_at_a_time(n):
    """A task with a per-task concurrency limit of 3 (its path's, across every queue and worker)."""
    return n


@task(rate="3/m")
def three_a_minute(n):
    """A task with a per-task rate of 3 a minute."""
    return n


@task(takes_context=True, concurrency=3)
def count_concurrent_three_at_a_time(context, sleep_ms=0, first_attempt_sleep_ms=None):
    """count_concurrent with a per-task concurrency limit of 3."""
    return count_concurrent.func(context, sleep_ms, first_attempt_sleep_ms)


@task(takes_context=True, rate="20/s")
def count_concurrent_twenty_a_second(context, sleep_ms=0):
    """count_concurrent with a per-task rate of 20 a second."""
    return count_concurrent.func(context, sleep_ms)


# -- threadmill.testing.drain ----------------------------------------------------

#: Set by a test to let `wait_for_release` return: drain() runs tasks in the test's own process.
RELEASE = threading.Event()


@task
def wait_for_release(timeout_s=30.0):
    """Hang until the test sets RELEASE (at most `timeout_s`): a task that drain() must give up on."""
    return RELEASE.wait(timeout_s)


@task(retry=ExponentialBackoff(base_delay=0.05, max_retries=3, jitter=0))
def spell_after_failures(key, failures=1):
    """Fail the first `failures` runs of `key` (counted in `test:runs`), then record its spell as `spell` does."""
    if _runs().hincrby("test:runs", key, 1) <= failures:
        raise RuntimeError(f"run {key} fails")
    return spell.func(key)


# -- threadmill.current_workflow -------------------------------------------------


@task
def workflow_seen():
    """Return what `current_workflow()` gives this run: None, or its id, name, node and whether a second call is it."""
    from threadmill import current_workflow

    workflow = current_workflow()
    return None if workflow is None else [workflow.id, workflow.name, workflow.node, current_workflow() is workflow]


def _outcomes(parents) -> dict:
    """Each parent's return value, or the class path of its last error when it failed."""
    return {
        node: result.return_value if result.status == "SUCCESSFUL" else result.errors[-1].exception_class_path
        for node, result in parents.items()
    }


@task
def read_parents(key):
    """Record a spell as `spell` does and return each parent's outcome (`_outcomes`) by node name."""
    from threadmill import current_workflow

    outcomes = _outcomes(current_workflow().parents)
    spell.func(key)
    return outcomes


@task
async def async_read_parents():
    """`read_parents` from an `async def` task, through `acurrent_workflow` and `aparents`."""
    from threadmill import acurrent_workflow

    workflow = await acurrent_workflow()
    return _outcomes(await workflow.aparents())


@task
def fan_out(count, join):
    """Add `count` spells that node `join` waits for; return the added nodes' names."""
    from threadmill import current_workflow

    workflow = current_workflow()
    added = [workflow.add(spell, (f"added-{i}", 0.05), before=[join]) for i in range(count)]
    spell.func("fan-out")
    return [node.name for node in added]


@task
async def async_fan_out(count, join):
    """`fan_out` from an `async def` task, through `aadd`."""
    from threadmill import acurrent_workflow

    workflow = await acurrent_workflow()
    return [(await workflow.aadd(spell, (f"added-{i}",), before=[join])).name for i in range(count)]


@task
def add_badly(befores):
    """Try `add` with each of `befores` (a list of before= lists); return each WorkflowError's message."""
    from threadmill import current_workflow
    from threadmill.exceptions import WorkflowError

    messages = []
    for before in befores:
        try:
            current_workflow().add(spell, ("never",), before=before)
        except WorkflowError as e:
            messages.append(str(e))
    return messages


@task(retry=ExponentialBackoff(base_delay=0.05, max_retries=2, jitter=0))
def add_named_then_fail_once(count, join):
    """Add `count` named spells that `join` waits for, then fail the first run (counted in `test:runs`)."""
    from threadmill import current_workflow

    workflow = current_workflow()
    added = [workflow.add(spell, (f"chunk-{i}",), before=[join], name=f"chunk-{i}").id for i in range(count)]
    if _runs().hincrby("test:runs", "add_named_then_fail_once", 1) == 1:
        raise RuntimeError("the first run fails after adding")
    return added


@task(retry=ExponentialBackoff(base_delay=0.05, max_retries=2, jitter=0))
def add_unnamed_then_fail_once(count, join):
    """Add `count` spells without names that `join` waits for, then fail the first run (counted in `test:runs`)."""
    from threadmill import current_workflow

    workflow = current_workflow()
    added = [workflow.add(spell, (f"unnamed-{i}",), before=[join]).name for i in range(count)]
    if _runs().hincrby("test:runs", "add_unnamed_then_fail_once", 1) == 1:
        raise RuntimeError("the first run fails after adding")
    return added


# -- workflows ---------------------------------------------------------------------------


@task(retry=never_retry)
def fail_while_flagged(key):
    """Raise while `key` is in the test server's `test:failing` set, else return it."""
    if _runs().sismember("test:failing", key):
        raise RuntimeError(f"{key} is flagged to fail.")
    return key


@task
def run_until_aborted(key, timeout_s=30.0):
    """Add `key` to the test server's `test:started` set, then poll `threadmill.aborting()` until it is True."""
    import threadmill

    _runs().sadd("test:started", key)
    deadline = time.monotonic() + timeout_s
    while not threadmill.aborting():
        if time.monotonic() > deadline:
            return "never aborted"
        time.sleep(0.01)
    return "aborted"


@task(timeout=SHORT_LIMIT_S, retry=never_retry)
def sleep_past_its_limit(seconds=30.0):
    """Sleep in short steps far past its time limit (no counter server needed)."""
    for _ in range(int(seconds * 100)):
        time.sleep(0.01)


# -- workflows under faults -------------------------------------------------------------


class PlannedFailure(Exception):
    """Raised by `count_step` where its test asked for a failure."""


@task(
    takes_context=True,
    retry=ExponentialBackoff(
        base_delay=0.05,
        max_retries=5,
        expected_exceptions=(
            "threadmill.exceptions.AcknowledgementTimeout",
            "threadmill.exceptions.AttemptAbandoned",
            "tests.tasks.PlannedFailure",
        ),
        jitter=0,
    ),
)
def count_step(context, sleep_ms=0, fail="never"):
    """Count each start and finish on the counter server as count_run does, and log them in order.

    Each start and finish is also appended to the counter server's `faults:steps` list as
    "start|finish <task id> <attempt> <lease time> <worker>": the list's order is the one clock
    every process shares, and the lease time (the server's) names the run in its attempt record.
    `fail` is "never", "first" (the first start raises PlannedFailure, which is retried) or
    "always" (a RuntimeError, never retried); a failing run logs its finish before it raises.
    """
    import threading

    task_id, attempt = context.task_result.id, context.attempt
    result = context.task_result
    run = f"{task_id} {attempt} {result.lease_started_at.timestamp()!r} {result.lease_worker}"
    counter = _counter()
    first = counter.hincrby("faults:started", task_id, 1) == 1
    counter.rpush("faults:steps", f"start {run}")
    threading.Event().wait(sleep_ms / 1000)  # not time.sleep: see count_run
    counter.hincrby("faults:finished", task_id, 1)
    counter.rpush("faults:steps", f"finish {run}")
    if fail == "always" or (fail == "first" and first):
        raise (RuntimeError if fail == "always" else PlannedFailure)(f"run {attempt} of {task_id} fails as planned")
    return task_id
