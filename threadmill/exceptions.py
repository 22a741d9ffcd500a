"""Threadmill's exception hierarchy, rooted at `ThreadmillError`."""

from django.tasks.exceptions import TaskResultDoesNotExist


class ThreadmillError(Exception):
    """Raised as the base of every error Threadmill defines; never raised directly."""


class BackendConnectionError(ThreadmillError):
    """Raised when the Redis server cannot be reached or answers with an error."""


class ServerUnreachable(BackendConnectionError):
    """Raised when the Redis server cannot be reached, does not answer within `socket_timeout`, or is not the primary now.

    The last is a failover's or a restart's refusal: READONLY, LOADING, MASTERDOWN, NOREPLICAS.
    Unlike a refused command, this is transient: a worker keeps its tasks and tries again.
    """


class ServerOutOfMemory(BackendConnectionError):
    """Raised when the Redis server refuses a write because its used memory reached `maxmemory`.

    Under `maxmemory-policy noeviction` (or an evicting policy with nothing left to evict) the
    server refuses what would add data, such as an enqueue, until memory is freed: it is not
    retried. Workers keep draining a full server; the message names the limit, the policy and
    what to do (raise maxmemory, let the workers drain, or purge).
    """


class DurableEnqueueError(ThreadmillError):
    """Raised when `fsync_enqueue` is on and the server cannot confirm a task is in its append-only file.

    The server has no append-only file, lacks WAITAOF (Redis or Valkey before 7.2), or did
    not fsync within the wait; the message names which and the fix.
    """


class ReplicaWaitError(DurableEnqueueError):
    """Raised when `wait_replicas` is set and fewer replicas than that confirmed an enqueue within the wait.

    The tasks are stored on the primary; the message names their ids (three, then a count), how many replicas
    confirmed it and the fix.
    """


class LayoutVersionError(ThreadmillError):
    """Raised when an alias's stored data layout is one this code cannot read or migrate.

    The message names the stored version, this code's version and what to do.
    """


class UnsupportedServer(ThreadmillError):
    """Raised before any write when the server is older than the oldest Redis Threadmill runs on.

    The message names the server's version and the supported floor.
    """


class AcknowledgementTimeout(ThreadmillError):
    """Raised (and recorded as a task error) when a task's lease expired before it was acknowledged."""


class AttemptAbandoned(ThreadmillError):
    """Raised (and recorded as a task error) when a started attempt was given up before it finished.

    Its worker died or stopped, or the task was requeued while it ran; the task runs again.
    """


class WorkerLost(AttemptAbandoned):
    """Raised (and recorded as a task error) when a task's worker stopped sending heartbeats while it ran."""


class TaskTimeout(ThreadmillError):
    """Raised inside a running task (and recorded as its error) when it passed its time limit."""


class TaskCancelled(ThreadmillError):
    """Raised inside a running task after its abort's grace (and recorded as the error of a cancelled task).

    A task cancelled before it ran, or aborted once the request reached it, ends FAILED with
    this error, saying who cancelled it and when; it is never retried.
    """


class LeaseLost(ThreadmillError):
    """Raised when a fenced write is refused because the task was leased again since."""


class UnreadableTaskError(ThreadmillError):
    """Raised when a caller asks for a task result whose stored payload this code cannot read."""


class ResultTrimmed(ThreadmillError, TaskResultDoesNotExist):
    """Raised when a task finished SUCCESSFUL but its result was dropped to free a full server.

    While the server's used memory is over its `maxmemory`, the broker drops the oldest successful
    results (never a failed one) and keeps a tombstone for `result_ttl`; a `TaskResultDoesNotExist`,
    so code that handles an expired result handles this one too.
    """


class EmbeddedServerError(ThreadmillError):
    """Raised when the embedded Valkey server cannot start, or a copy already runs on its data directory."""


class DrainTimeout(ThreadmillError):
    """Raised by `threadmill.testing.drain` when tasks still ran, or waited for a limit, at its timeout."""


class UpstreamFailed(ThreadmillError):
    """Raised as the recorded error of a workflow task that never ran because a parent of it failed."""


class WorkflowError(ThreadmillError):
    """Raised when a workflow cannot be enqueued as given (a bad graph, too many tasks); nothing is stored."""
